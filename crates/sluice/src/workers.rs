//! The thread layout. `per_core` (default): one single-threaded event loop
//! per CPU, each with its own SO_REUSEPORT listening socket, so a client's
//! task never migrates between cores. All workers are started, but a
//! worker's socket joins the accept group only when the workers already
//! accepting are busy (`worker_busy_percent`): on a machine shared with
//! PostgreSQL, one thread that batches many events per wakeup spends less
//! CPU per transaction than two that each wake for half as many.
//! `shared`: one work-stealing runtime with one set of listeners. Both share
//! the same `App`; `make bench` compares them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use sluice_config::RuntimeKind;
use socket2::Socket;

use crate::app::App;
use crate::frontend::listener::{self, Listener, ListenerGuard};

/// Sockets bound before workers start, so that errors stop startup.
pub struct BoundSockets {
    /// One set per worker (per_core) or a single set (shared); bound, not
    /// yet listening.
    pub tcp: Vec<Vec<Socket>>,
    pub unix: Option<std::os::unix::net::UnixListener>,
}

/// Binds the listening sockets: one set per worker in per-core mode.
pub fn bind(app: &App, workers: usize, kind: RuntimeKind) -> std::io::Result<BoundSockets> {
    let s = &app.config().settings;
    let addrs = listener::tcp_addresses(s)?;
    let sets = if kind == RuntimeKind::PerCore {
        workers
    } else {
        1
    };
    let reuse_port = s.so_reuseport || sets > 1;
    let mut tcp = Vec::new();
    for _ in 0..sets {
        let mut set = Vec::new();
        for a in &addrs {
            set.push(
                listener::bind_tcp(*a, reuse_port, s.tcp_defer_accept).map_err(|e| {
                    std::io::Error::new(e.kind(), format!("could not listen on {a}: {e}"))
                })?,
            );
        }
        tcp.push(set);
    }
    let unix = if s.unix_socket_dir.is_empty() {
        None
    } else {
        let path = listener::unix_socket_path(&s.unix_socket_dir, s.listen_port);
        Some(
            listener::bind_unix(&path, s.unix_socket_mode, &s.unix_socket_group).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("could not listen on {}: {e}", path.display()),
                )
            })?,
        )
    };
    Ok(BoundSockets { tcp, unix })
}

/// The running workers and those not yet accepting.
pub struct Workers {
    app: Arc<App>,
    handles: Vec<tokio::runtime::Handle>,
    /// Linux thread ids of per-core workers, for their CPU time.
    tids: Vec<Arc<AtomicI32>>,
    dormant: Mutex<VecDeque<(usize, Vec<Socket>)>>,
    backlog: u32,
}

impl Workers {
    /// Makes worker `index` accept on `sockets`.
    fn activate(
        &self,
        index: usize,
        sockets: Vec<Socket>,
        unix: Option<std::os::unix::net::UnixListener>,
    ) {
        for socket in sockets {
            if let Err(e) = socket.listen(self.backlog.clamp(1, i32::MAX as u32) as i32) {
                tracing::error!("listen failed on worker {index}: {e}");
                continue;
            }
            let std_listener: std::net::TcpListener = socket.into();
            let app = self.app.clone();
            let open = ListenerGuard::new(&app);
            self.handles[index].spawn(async move {
                match tokio::net::TcpListener::from_std(std_listener) {
                    Ok(l) => listener::accept_loop(app, Listener::Tcp(l), open).await,
                    Err(e) => tracing::error!("listener: {e}"),
                }
            });
        }
        if let Some(u) = unix {
            let app = self.app.clone();
            let open = ListenerGuard::new(&app);
            self.handles[index].spawn(async move {
                match tokio::net::UnixListener::from_std(u) {
                    Ok(l) => listener::accept_loop(app, Listener::Unix(l), open).await,
                    Err(e) => tracing::error!("unix listener: {e}"),
                }
            });
        }
    }

    /// Starts accepting on the next dormant worker; false if none is left.
    pub fn activate_next(&self) -> bool {
        let next = self
            .dormant
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front();
        match next {
            Some((index, sockets)) => {
                tracing::info!("worker {index} starts accepting clients");
                self.activate(index, sockets, None);
                true
            }
            None => false,
        }
    }

    pub fn has_dormant(&self) -> bool {
        !self
            .dormant
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// CPU clock ticks (utime + stime) of the accepting per-core workers.
    pub fn accepting_cpu_ticks(&self) -> Vec<u64> {
        let dormant: Vec<usize> = self
            .dormant
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(i, _)| *i)
            .collect();
        self.tids
            .iter()
            .enumerate()
            .filter(|(i, _)| !dormant.contains(i))
            .filter_map(|(_, tid)| thread_cpu_ticks(tid.load(Ordering::Relaxed)))
            .collect()
    }
}

/// utime + stime of a thread of this process, from /proc.
fn thread_cpu_ticks(tid: i32) -> Option<u64> {
    if tid <= 0 {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the line.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split(' ');
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Starts the workers; returns a runtime for control tasks and the workers.
pub fn start(
    app: Arc<App>,
    workers: usize,
    kind: RuntimeKind,
    sockets: BoundSockets,
) -> std::io::Result<(tokio::runtime::Runtime, Arc<Workers>)> {
    let BoundSockets { tcp, mut unix } = sockets;
    let backlog = app.config().settings.listen_backlog;
    match kind {
        RuntimeKind::Shared => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(workers)
                .thread_name("sluice-worker")
                .enable_all()
                .build()?;
            let set = Arc::new(Workers {
                app: app.clone(),
                handles: vec![rt.handle().clone()],
                tids: Vec::new(),
                dormant: Mutex::default(),
                backlog,
            });
            for sockets in tcp {
                set.activate(0, sockets, unix.take());
            }
            app.set_workers(set.handles.clone());
            // The runtime lives as long as the process: held by a thread of
            // its own (dropped here, it would shut down with every task).
            std::thread::Builder::new()
                .name("sluice-shared".into())
                .spawn(move || rt.block_on(std::future::pending::<()>()))?;
            let control = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            Ok((control, set))
        }
        RuntimeKind::PerCore => {
            let mut handles = Vec::new();
            let mut tids = Vec::new();
            for i in 0..tcp.len() {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                handles.push(rt.handle().clone());
                let tid = Arc::new(AtomicI32::new(0));
                tids.push(tid.clone());
                std::thread::Builder::new()
                    .name(format!("sluice-worker-{i}"))
                    .spawn(move || {
                        crate::backend::worker_id::set_current_worker(i);
                        crate::uring::worker_thread();
                        // SAFETY: gettid has no preconditions.
                        tid.store(unsafe { libc::gettid() }, Ordering::Relaxed);
                        rt.block_on(std::future::pending::<()>());
                    })?;
            }
            let all_at_once = app.config().settings.worker_busy_percent == 0;
            let set = Arc::new(Workers {
                app: app.clone(),
                handles,
                tids,
                dormant: Mutex::default(),
                backlog,
            });
            for (i, sockets) in tcp.into_iter().enumerate() {
                if i == 0 || all_at_once {
                    set.activate(i, sockets, if i == 0 { unix.take() } else { None });
                } else {
                    set.dormant
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push_back((i, sockets));
                }
            }
            app.set_workers(set.handles.clone());
            let control = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            Ok((control, set))
        }
    }
}
