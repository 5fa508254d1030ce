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
    /// Cancel keys of the admin users' console sessions (process id and
    /// secret packed): a cancel request with one ends the global pause,
    /// PgBouncer's way out of a PAUSE that waits (Ctrl-C in psql).
    console_keys: Mutex<HashSet<u64>>,
}

/// A console session's cancel key, known while the session lasts.
pub struct ConsoleKey<'a> {
    switches: &'a OperatorSwitches,
    pub process_id: i32,
    pub secret_key: i32,
}

impl Drop for ConsoleKey<'_> {
    fn drop(&mut self) {
        self.switches
            .console_keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&pack(self.process_id, self.secret_key));
    }
}

fn pack(process_id: i32, secret_key: i32) -> u64 {
    (u64::from(process_id as u32) << 32) | u64::from(secret_key as u32)
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

    /// Pauses `database`, or (None) everything. The flags change under
    /// the `paused` lock, as in every resume, so that a pause and a resume
    /// at once cannot leave `any_paused` false with something paused.
    pub fn pause(&self, database: Option<&str>) {
        let mut paused = self.paused.lock().unwrap_or_else(|p| p.into_inner());
        match database {
            None => self.all_paused.store(true, Ordering::Release),
            Some(db) => {
                paused.insert(db.to_owned());
            }
        }
        self.any_paused.store(true, Ordering::Release);
    }

    /// Ends the pause of `database`, or (None) every pause: the global one
    /// and those by name.
    pub fn resume(&self, database: Option<&str>) {
        self.resume_with(|all, paused| match database {
            None => {
                all.store(false, Ordering::Release);
                paused.clear();
            }
            Some(db) => {
                paused.remove(db);
            }
        });
    }

    /// Ends the global pause only (SIGUSR2); pauses by name stay.
    pub fn resume_all_only(&self) {
        self.resume_with(|all, _| all.store(false, Ordering::Release));
    }

    /// A resume: `change` under the `paused` lock, then whether anything
    /// is still paused, and the waiting transactions woken to look again.
    fn resume_with(&self, change: impl FnOnce(&AtomicBool, &mut HashSet<String>)) {
        {
            let mut paused = self.paused.lock().unwrap_or_else(|p| p.into_inner());
            change(&self.all_paused, &mut paused);
            let still = self.all_paused.load(Ordering::Acquire) || !paused.is_empty();
            self.any_paused.store(still, Ordering::Release);
        }
        self.resumed.notify_waiters();
    }

    /// A new cancel key for an admin user's console session, shaped by
    /// `shape` (the cancel registry's: with peers, it names this peer).
    pub fn console_key(&self, shape: impl Fn() -> (i32, i32)) -> ConsoleKey<'_> {
        let mut keys = self.console_keys.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let (process_id, secret_key) = shape();
            if keys.insert(pack(process_id, secret_key)) {
                return ConsoleKey {
                    switches: self,
                    process_id,
                    secret_key,
                };
            }
        }
    }

    /// Whether a cancel request carries the key of a live console session.
    pub fn is_console_key(&self, process_id: i32, secret_key: i32) -> bool {
        self.console_keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&pack(process_id, secret_key))
    }

    /// A pause or DISABLE by the name of a database that is gone (`kept`
    /// says which are not: in the configuration, or with a pool its
    /// clients still hold) ends with it, as PgBouncer's switches live on
    /// the database, so that an entry of that name added back later is
    /// neither paused nor disabled.
    pub fn forget_removed(&self, kept: impl Fn(&str) -> bool) {
        self.disabled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|db| kept(db));
        let gone = self
            .paused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|db| !kept(db));
        // (the janitor asks each second: waiters are woken only for a
        // pause that ends)
        if gone {
            self.resume_with(|_, paused| paused.retain(|db| kept(db)));
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_console_key_lives_as_long_as_its_session() {
        let s = OperatorSwitches::default();
        let (pid, secret) = {
            let key = s.console_key(|| (7, 11));
            assert_ne!((key.process_id, key.secret_key), (0, 0));
            assert!(s.is_console_key(key.process_id, key.secret_key));
            assert!(!s.is_console_key(key.process_id, key.secret_key ^ 1));
            (key.process_id, key.secret_key)
        };
        assert!(
            !s.is_console_key(pid, secret),
            "the key outlived its session"
        );
    }

    /// The global pause and pauses by name, and which resume ends which;
    /// `anything_paused` (the hot path's one check) follows.
    #[test]
    fn pauses_and_resumes() {
        let s = OperatorSwitches::default();
        assert!(!s.anything_paused());
        s.pause(Some("a"));
        assert!(s.anything_paused() && s.is_paused("a") && !s.is_paused("b"));
        s.pause(None);
        assert!(s.all_paused() && s.is_paused("b"));
        s.resume_all_only();
        assert!(!s.all_paused() && s.paused_by_name("a") && s.anything_paused());
        s.resume(Some("a"));
        assert!(!s.anything_paused() && !s.is_paused("a"));
        s.pause(Some("a"));
        s.pause(None);
        s.resume(None);
        assert!(!s.anything_paused() && !s.paused_by_name("a") && !s.all_paused());
    }

    /// Pauses and resumes from several threads at once never leave
    /// `anything_paused` false while something is paused.
    #[test]
    fn concurrent_pause_and_resume_agree() {
        let s = std::sync::Arc::new(OperatorSwitches::default());
        for _ in 0..200 {
            let (a, b) = (s.clone(), s.clone());
            let pauser = std::thread::spawn(move || a.pause(None));
            let resumer = std::thread::spawn(move || b.resume(Some("x")));
            pauser.join().expect("pause");
            resumer.join().expect("resume");
            assert!(s.all_paused() && s.anything_paused(), "a pause was lost");
            s.resume(None);
            assert!(!s.anything_paused());
        }
    }
}
