//! sluice: a PostgreSQL connection pooler that reads PgBouncer's
//! configuration, answers to its flags and signals, and uses every core.
//! This file wires the pieces: command line, configuration, logging,
//! daemonizing, listeners, workers and the control loop.

mod admin;
mod app;
mod auth;
mod backend;
mod cli;
mod clock;
mod codec;
mod control;
mod daemon;
mod frontend;
mod held_memory;
mod logging;
mod net;
mod operator;
mod params;
mod prepared;
mod reload;
mod scan;
mod sd_notify;
mod session_vars;
mod stats;
#[cfg(test)]
mod test_support;
mod tls;
mod uring;
mod workers;

use std::process::ExitCode;

use clap::Parser;

use crate::app::App;
use crate::auth::Userlist;

/// jemalloc: tokio aligns every task and socket registration to 128 bytes;
/// glibc's memalign wastes much of each such block, jemalloc's size classes
/// (256, 384) fit them exactly. This is most of what an idle client costs.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings. Its decay of freed pages advances only when the
/// process allocates, so memory freed by clients that went idle (a parked
/// client's task, `frontend/parking.rs`) stayed in RSS while nothing else
/// happened: a background thread of jemalloc's own gives it back, after
/// 5 s unused, with MADV_DONTNEED (the lazy MADV_FREE step, which leaves
/// pages counted in RSS, is skipped). 19,000 idle clients, measured: about
/// 1,190 bytes each without, 950 with.
#[unsafe(export_name = "_rjem_malloc_conf")]
#[allow(non_upper_case_globals)]
pub static malloc_conf: &[u8] = b"background_thread:true,dirty_decay_ms:5000,muzzy_decay_ms:0\0";

/// jemalloc's background thread does not survive the fork of `-d`: the
/// child turns it on again (without it, freed pages come back only as the
/// process allocates).
fn restart_allocator_thread() {
    unsafe extern "C" {
        #[link_name = "_rjem_mallctl"]
        fn mallctl(
            name: *const std::ffi::c_char,
            oldp: *mut std::ffi::c_void,
            oldlenp: *mut usize,
            newp: *mut std::ffi::c_void,
            newlen: usize,
        ) -> std::ffi::c_int;
    }
    let mut on = true;
    // SAFETY: "background_thread" takes a bool; no old value is asked for.
    let rc = unsafe {
        mallctl(
            c"background_thread".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            (&raw mut on).cast(),
            std::mem::size_of::<bool>(),
        )
    };
    if rc != 0 {
        eprintln!("sluice: jemalloc's background thread could not start again ({rc})");
    }
}

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let config = match sluice_config::load(&cli.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sluice: {e}");
            return ExitCode::FAILURE;
        }
    };
    for w in &config.warnings {
        eprintln!("sluice: warning: {w}");
    }
    let userlist = match &config.settings.auth_file {
        Some(path) => match Userlist::load(path) {
            Ok(u) => u,
            Err(e) => {
                eprintln!("sluice: {e}");
                return ExitCode::FAILURE;
            }
        },
        None => Userlist::default(),
    };
    if let Err(e) = daemon::check_supported(&config.settings) {
        eprintln!("sluice: {e}");
        return ExitCode::FAILURE;
    }
    if cli.check_config {
        let rules = match auth::rules::AuthRules::load(&config.settings) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("sluice: {e}");
                return ExitCode::FAILURE;
            }
        };
        let certs = rules.wants_client_certificates(config.settings.auth_type);
        if let Err(e) = tls::ClientTls::from_settings(&config.settings, certs)
            .map(drop)
            .and_then(|()| tls::ServerTls::from_settings(&config.settings).map(drop))
        {
            eprintln!("sluice: {e}");
            return ExitCode::FAILURE;
        }
        println!(
            "sluice: {} is valid ({} databases, {} auth_file users, {} warnings)",
            cli.config.display(),
            config.databases.len() + usize::from(config.fallback_database.is_some()),
            userlist.len(),
            config.warnings.len()
        );
        return ExitCode::SUCCESS;
    }
    if cli.reboot {
        eprintln!(
            "sluice: -R (online reboot) is not supported; use so_reuseport = 1 and start a second sluice"
        );
        return ExitCode::FAILURE;
    }
    let settings = config.settings.clone();
    if cli.daemon {
        if settings.logfile.is_empty() && !settings.syslog {
            eprintln!("sluice: -d needs logfile or syslog in the configuration");
            return ExitCode::FAILURE;
        }
        if let Err(e) = daemon::daemonize() {
            eprintln!("sluice: cannot daemonize: {e}");
            return ExitCode::FAILURE;
        }
        restart_allocator_thread();
    }
    let verbosity = settings.verbose + u32::from(cli.verbose);
    if let Err(e) = logging::init(&settings.logfile, !cli.quiet && !cli.daemon, verbosity) {
        eprintln!("sluice: cannot open logfile {}: {e}", settings.logfile);
        return ExitCode::FAILURE;
    }
    logging::configure_syslog(&settings);
    daemon::warn_without_effect(&settings);
    auth::scram::set_iterations(settings.scram_iterations);
    let workers = if settings.workers == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        settings.workers
    };
    let rules = match auth::rules::AuthRules::load(&config.settings) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("sluice: {e}");
            return ExitCode::FAILURE;
        }
    };
    let certs = rules.wants_client_certificates(config.settings.auth_type);
    let client_tls = match tls::ClientTls::from_settings(&config.settings, certs) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("sluice: {e}");
            return ExitCode::FAILURE;
        }
    };
    let server_tls = match tls::ServerTls::from_settings(&config.settings) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("sluice: {e}");
            return ExitCode::FAILURE;
        }
    };
    let app = App::new(cli.config.clone(), config, userlist).shared();
    app.set_client_tls(client_tls);
    app.set_auth_rules(rules);
    app.set_server_tls(server_tls);
    let sockets = match workers::bind(&app, workers, settings.runtime) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let metrics_addr = settings.metrics_addr.as_deref().filter(|a| !a.is_empty());
    let metrics = match metrics_addr.map(|a| stats::http::bind(a, settings.so_reuseport)) {
        Some(Err(e)) => {
            tracing::error!(
                "cannot listen on metrics_addr {}: {e}",
                metrics_addr.unwrap_or_default()
            );
            return ExitCode::FAILURE;
        }
        bound => bound.and_then(Result::ok),
    };
    let unix_socket = (!settings.unix_socket_dir.is_empty()).then(|| {
        frontend::listener::unix_socket_path(&settings.unix_socket_dir, settings.listen_port)
    });
    let unix_socket_id = unix_socket.as_deref().and_then(file_id);
    if let Some(user) = cli
        .user
        .as_deref()
        .or(Some(settings.user.as_str()).filter(|u| !u.is_empty()))
        && let Err(e) = daemon::switch_user(user)
    {
        tracing::error!("cannot switch to user {user}: {e}");
        return ExitCode::FAILURE;
    }
    let io_backend = match uring::choose(settings.io_backend, settings.runtime) {
        Ok(line) => line,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let (control, worker_set) =
        match workers::start(app.clone(), workers, settings.runtime, sockets) {
            Ok(started) => started,
            Err(e) => {
                tracing::error!("cannot start workers: {e}");
                return ExitCode::FAILURE;
            }
        };
    tracing::info!(
        "sluice {} listening on {}:{} ({} workers, {:?} runtime, sends: {})",
        env!("CARGO_PKG_VERSION"),
        settings.listen_addr,
        settings.listen_port,
        workers,
        settings.runtime,
        io_backend
    );
    if let (Some(addr), Some(listener)) = (metrics_addr, metrics) {
        let listener = control.block_on(async { tokio::net::TcpListener::from_std(listener) });
        match listener {
            Ok(listener) => {
                // (with the web console and client_tls_* certificates the
                // endpoint speaks HTTPS: review 50 found the log said http)
                let tls =
                    app.config().settings.web_console && app.client_tls().web_acceptor().is_some();
                let scheme = if tls { "https" } else { "http" };
                tracing::info!("metrics on {scheme}://{addr}/metrics");
                control.spawn(stats::http::serve(app.clone(), listener));
            }
            Err(e) => {
                tracing::error!("cannot listen on metrics_addr {addr}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    // Last, once nothing can fail: a start that fails must not leave a
    // running process's pidfile naming a dead one (a rolling restart).
    if !settings.pidfile.is_empty()
        && let Err(e) = std::fs::write(&settings.pidfile, format!("{}\n", std::process::id()))
    {
        tracing::error!("cannot write pidfile {}: {e}", settings.pidfile);
        return ExitCode::FAILURE;
    }
    sd_notify::ready();
    let result = control.block_on(control::run(app.clone(), worker_set));
    // Only files still this process's own: in a rolling restart the new
    // process may have written the pidfile or bound the socket by now.
    if !settings.pidfile.is_empty()
        && std::fs::read_to_string(&settings.pidfile)
            .is_ok_and(|text| text.trim() == std::process::id().to_string())
    {
        let _ = std::fs::remove_file(&settings.pidfile);
    }
    if let Some(path) = unix_socket
        && unix_socket_id.is_some()
        && file_id(&path) == unix_socket_id
    {
        let _ = std::fs::remove_file(path);
    }
    match result {
        Ok(()) => {
            tracing::info!("shutdown complete");
            // Worker threads may still hold idle clients; the process ends here.
            std::process::exit(0)
        }
        Err(e) => {
            tracing::error!("control loop failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Which file a path names now: device, inode and change time (an inode
/// number freed by one socket file is often the next one's).
fn file_id(path: &std::path::Path) -> Option<(u64, u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}
