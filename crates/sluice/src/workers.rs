//! The thread layout. `per_core` (default): one single-threaded event loop
//! per worker, each with its own SO_REUSEPORT listening sockets, so a
//! client's task never migrates between cores. `shared`: one work-stealing
//! runtime with one set of listeners. Both share the same `App`; `make bench`
//! compares them.

use std::sync::Arc;

use sluice_config::RuntimeKind;

use crate::app::App;
use crate::frontend::listener::{self, Listener};

/// Sockets bound before workers start, so that errors stop startup.
pub struct BoundSockets {
    pub tcp: Vec<Vec<std::net::TcpListener>>,
    pub unix: Option<std::os::unix::net::UnixListener>,
}

/// Binds listening sockets: one set per worker in per-core mode.
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
                listener::bind_tcp(*a, s.listen_backlog, reuse_port).map_err(|e| {
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
        Some(listener::bind_unix(&path, s.unix_socket_mode).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("could not listen on {}: {e}", path.display()),
            )
        })?)
    };
    Ok(BoundSockets { tcp, unix })
}

fn spawn_listeners(
    app: &Arc<App>,
    tcp: Vec<std::net::TcpListener>,
    unix: Option<std::os::unix::net::UnixListener>,
) {
    for l in tcp {
        match tokio::net::TcpListener::from_std(l) {
            Ok(l) => {
                tokio::spawn(listener::accept_loop(app.clone(), Listener::Tcp(l)));
            }
            Err(e) => tracing::error!("listener: {e}"),
        }
    }
    if let Some(u) = unix {
        match tokio::net::UnixListener::from_std(u) {
            Ok(l) => {
                tokio::spawn(listener::accept_loop(app.clone(), Listener::Unix(l)));
            }
            Err(e) => tracing::error!("unix listener: {e}"),
        }
    }
}

/// Starts the workers and returns a handle to run control tasks on.
pub fn start(
    app: Arc<App>,
    workers: usize,
    kind: RuntimeKind,
    sockets: BoundSockets,
) -> std::io::Result<tokio::runtime::Runtime> {
    let BoundSockets { tcp, mut unix } = sockets;
    match kind {
        RuntimeKind::Shared => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(workers)
                .thread_name("sluice-worker")
                .enable_all()
                .build()?;
            let _guard = rt.enter();
            for set in tcp {
                spawn_listeners(&app, set, unix.take());
            }
            drop(_guard);
            app.set_workers(vec![rt.handle().clone()]);
            Ok(rt)
        }
        RuntimeKind::PerCore => {
            for (i, set) in tcp.into_iter().enumerate() {
                let app = app.clone();
                let unix = if i == 0 { unix.take() } else { None };
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                std::thread::Builder::new()
                    .name(format!("sluice-worker-{i}"))
                    .spawn(move || {
                        crate::backend::idle::set_current_worker(i);
                        rt.block_on(async move {
                            spawn_listeners(&app, set, unix);
                            std::future::pending::<()>().await;
                        });
                    })?;
            }
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        }
    }
}
