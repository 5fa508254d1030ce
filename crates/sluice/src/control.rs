//! The control loop on the main thread: signals (HUP reload, TERM wait for
//! clients, INT wait for servers, QUIT now, USR1/USR2 logged until the console
//! lands), the janitor tick that keeps pools within their timeouts, and the
//! exit when a shutdown phase has run its course.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};

use crate::app::{App, Phase};
use crate::reload::reload;
use crate::workers::Workers;

/// Janitor period.
const TICK: Duration = Duration::from_millis(500);
/// How long SIGINT's shutdown waits, once no server is lent, for woken
/// clients to be told why they are cut.
const GOODBYE_GRACE: Duration = Duration::from_millis(200);

/// Runs until the process should exit; returns then.
pub async fn run(app: Arc<App>, workers: Arc<Workers>) -> std::io::Result<()> {
    let mut busy = BusyWatch::default();
    let mut last_stats = std::time::Instant::now();
    app.stats.sample(app.totals_by_database());
    let mut hup = signal(SignalKind::hangup())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut quit = signal(SignalKind::quit())?;
    let mut usr1 = signal(SignalKind::user_defined1())?;
    let mut usr2 = signal(SignalKind::user_defined2())?;
    let mut tick = tokio::time::interval(TICK);
    let mut done_since = None;
    app.prewarm();
    loop {
        tokio::select! {
            _ = hup.recv() => {
                tracing::info!("got SIGHUP, re-reading config");
                reload(&app);
            }
            // A second SIGTERM or SIGINT while shutting down exits at once,
            // as PgBouncer's does: the operator has stopped waiting.
            _ = term.recv() => {
                if app.phase() != Phase::Running {
                    tracing::info!("got SIGTERM while shutting down, fast exit");
                    app.begin_shutdown(Phase::Immediate);
                } else {
                    tracing::info!("got SIGTERM, shutting down, waiting for all clients disconnect");
                    app.begin_shutdown(Phase::WaitForClients);
                }
            }
            _ = int.recv() => {
                if app.phase() != Phase::Running {
                    tracing::info!("got SIGINT while shutting down, fast exit");
                    app.begin_shutdown(Phase::Immediate);
                } else {
                    tracing::info!("got SIGINT, shutting down, waiting for all servers connections to be released");
                    app.begin_shutdown(Phase::WaitForServers);
                }
            }
            _ = quit.recv() => {
                tracing::info!("got SIGQUIT, fast exit");
                app.begin_shutdown(Phase::Immediate);
            }
            _ = usr1.recv() => {
                if app.phase() != Phase::Running {
                    tracing::info!("got SIGUSR1 while shutting down, ignoring");
                } else if app.control.all_paused() {
                    tracing::info!("got SIGUSR1, but already paused/suspended");
                } else {
                    tracing::info!("got SIGUSR1, pausing all activity");
                    app.control.pause(None);
                    // As the console's PAUSE: once no server is lent, the
                    // idle ones are closed (PgBouncer's pause mode). It
                    // waits as long as the pause lasts.
                    let paused = app.clone();
                    tokio::spawn(async move {
                        if paused.wait_paused_released(None, None).await {
                            tracing::info!("SIGUSR1: all servers released and closed");
                        }
                    });
                }
            }
            // As PgBouncer's: ends the global pause only; databases paused
            // by name stay paused (RESUME on the console ends those).
            _ = usr2.recv() => {
                if app.phase() != Phase::Running {
                    tracing::info!("got SIGUSR2 while shutting down, ignoring");
                } else if app.control.all_paused() {
                    tracing::info!("got SIGUSR2, continuing from PAUSE");
                    app.control.resume_all_only();
                } else {
                    tracing::info!("got SIGUSR2, but not paused/suspended");
                }
            }
            _ = tick.tick() => {
                for pool in app.pools() {
                    pool.maintain(|task| app.spawn_on_worker(task));
                }
                for pool in app.retiring_pools() {
                    pool.expire_waiters();
                }
                busy.check(&app, &workers);
                app.param_sets.prune();
                app.statements.prune();
                app.free_unused_pools();
                let period = app.config().settings.stats_period.max(std::time::Duration::from_secs(1));
                if last_stats.elapsed() >= period {
                    last_stats = std::time::Instant::now();
                    let averages = app.stats.sample(app.totals_by_database());
                    if app.config().settings.log_stats {
                        log_stats(&averages);
                    }
                }
            }
        }
        if !shutdown_done(&app) {
            done_since = None;
            continue;
        }
        // No server is lent: the clients SIGINT woke (those paused, those
        // that asked for a server) get a moment, a tick or so, to be told
        // "server shutting down" before the process ends.
        if app.phase() == Phase::WaitForServers
            && done_since
                .get_or_insert_with(std::time::Instant::now)
                .elapsed()
                < GOODBYE_GRACE
        {
            continue;
        }
        for pool in app.pools() {
            pool.close_idle(crate::backend::pool::Closing::ShuttingDown);
        }
        return Ok(());
    }
}

/// log_stats: PgBouncer's periodic line, over all databases, per second
/// and per transaction/query/assignment for the last stats_period.
fn log_stats(averages: &std::collections::HashMap<String, crate::stats::Averages>) {
    let mut total = crate::stats::Averages::default();
    // Times are means over all databases' transactions (weighted by their
    // counts), as PgBouncer computes them from the totals.
    let (mut xact_us, mut query_us, mut wait_us) = (0u128, 0u128, 0u128);
    for a in averages.values() {
        total.merge(a);
        xact_us += u128::from(a.xact_time_us) * u128::from(a.xacts);
        query_us += u128::from(a.query_time_us) * u128::from(a.queries);
        wait_us += u128::from(a.wait_time_us) * u128::from(a.server_assignments);
    }
    let mean = |sum: u128, n: u64| {
        u64::try_from(sum.checked_div(u128::from(n)).unwrap_or(0)).unwrap_or(u64::MAX)
    };
    total.xact_time_us = mean(xact_us, total.xacts);
    total.query_time_us = mean(query_us, total.queries);
    total.wait_time_us = mean(wait_us, total.server_assignments);
    tracing::info!(
        "stats: {} xacts/s, {} queries/s, {} client parses/s, {} server parses/s, {} binds/s, \
         {} client logins/s, in {} B/s, out {} B/s, xact {} us, query {} us, wait {} us",
        total.xacts,
        total.queries,
        0,
        0,
        0,
        total.client_logins,
        total.received,
        total.sent,
        total.xact_time_us,
        total.query_time_us,
        total.wait_time_us
    );
}

/// Samples the accepting workers' CPU time and wakes a dormant worker when
/// they are busy (per-core layout).
#[derive(Default)]
struct BusyWatch {
    samples: std::collections::VecDeque<(std::time::Instant, u64, usize)>,
}

/// Samples averaged over: 2 s of ticks.
const BUSY_WINDOW: usize = 4;

impl BusyWatch {
    fn check(&mut self, app: &App, workers: &Workers) {
        let percent = app.config().settings.worker_busy_percent;
        // Shutting down: a listener started now would take connections
        // into its queue only to close it.
        if !workers.has_dormant() || app.phase() != Phase::Running {
            return;
        }
        if percent == 0 {
            while workers.activate_next() {}
            return;
        }
        let ticks = workers.accepting_cpu_ticks();
        let now = std::time::Instant::now();
        self.samples
            .push_back((now, ticks.iter().sum(), ticks.len()));
        if self.samples.len() <= BUSY_WINDOW {
            return;
        }
        let Some((then, old_ticks, old_count)) = self.samples.pop_front() else {
            return;
        };
        let (_, new_ticks, count) = (now, ticks.iter().sum::<u64>(), ticks.len());
        if count != old_count || count == 0 {
            return; // a worker joined within the window: measure afresh
        }
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let cpu_secs = new_ticks.saturating_sub(old_ticks) as f64 / hz;
        let per_worker = cpu_secs / now.duration_since(then).as_secs_f64() / count as f64;
        if per_worker * 100.0 >= f64::from(percent) && workers.activate_next() {
            tracing::info!("accepting workers at {:.0}% CPU each", per_worker * 100.0);
            self.samples.clear();
        }
    }
}

fn shutdown_done(app: &App) -> bool {
    match app.phase() {
        Phase::Running => false,
        // The listeners first: a client accepted just before one closed
        // is counted by then.
        Phase::WaitForClients => {
            app.listening.load(Ordering::Acquire) == 0 && app.clients.load(Ordering::Acquire) == 0
        }
        Phase::WaitForServers => app.pools().iter().all(|p| p.no_transactions()),
        Phase::Immediate => true,
    }
}
