//! What an operator switched from the console or with signals: PAUSE /
//! RESUME (all databases or one; new transactions wait, servers are released
//! and closed) and DISABLE / ENABLE (new logins to a database are refused).

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// Pause and disable switches.
#[derive(Default)]
pub struct OperatorSwitches {
    all_paused: AtomicBool,
    /// True while anything is paused: the one check a transaction makes.
    any_paused: AtomicBool,
    paused: Mutex<HashSet<String>>,
    disabled: Mutex<HashSet<String>>,
    pub resumed: Notify,
}

impl OperatorSwitches {
    /// Whether `database` is paused ("" asks about the global pause).
    pub fn is_paused(&self, database: &str) -> bool {
        self.all_paused.load(Ordering::Acquire)
            || (!database.is_empty()
                && self
                    .paused
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains(database))
    }

    /// Whether everything is paused (PAUSE without a database, SIGUSR1).
    pub fn all_paused(&self) -> bool {
        self.all_paused.load(Ordering::Acquire)
    }

    /// Whether `database` was paused by name (PAUSE <db>, KILL <db>).
    pub fn paused_by_name(&self, database: &str) -> bool {
        self.paused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(database)
    }

    /// Cheap check for the hot path: is anything paused at all?
    pub fn anything_paused(&self) -> bool {
        self.any_paused.load(Ordering::Acquire)
    }

    pub fn pause(&self, database: Option<&str>) {
        self.any_paused.store(true, Ordering::Release);
        match database {
            None => self.all_paused.store(true, Ordering::Release),
            Some(db) => {
                self.paused
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(db.to_owned());
            }
        }
    }

    /// Ends the pause of `database`, or (None) every pause: the global one
    /// and those by name.
    pub fn resume(&self, database: Option<&str>) {
        match database {
            None => {
                self.all_paused.store(false, Ordering::Release);
                self.paused
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clear();
            }
            Some(db) => {
                self.paused
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(db);
            }
        }
        self.after_resume();
    }

    /// Ends the global pause only (SIGUSR2); pauses by name stay.
    pub fn resume_all_only(&self) {
        self.all_paused.store(false, Ordering::Release);
        self.after_resume();
    }

    /// After a resume: whether anything is still paused, and the waiting
    /// transactions woken to look again.
    fn after_resume(&self) {
        let still = self.all_paused.load(Ordering::Acquire)
            || !self
                .paused
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty();
        self.any_paused.store(still, Ordering::Release);
        self.resumed.notify_waiters();
    }

    pub fn is_disabled(&self, database: &str) -> bool {
        self.disabled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(database)
    }

    pub fn set_disabled(&self, database: &str, disabled: bool) {
        let mut d = self.disabled.lock().unwrap_or_else(|p| p.into_inner());
        if disabled {
            d.insert(database.to_owned());
        } else {
            d.remove(database);
        }
    }
}
