//! The pool's clock: CLOCK_MONOTONIC (the clock `std::time::Instant` reads
//! on Linux) as nanoseconds in a `u64`. A transaction reads it three times
//! and takes four intervals from it (how long the client waited, how long
//! the server was lent, whether the server is past `server_lifetime`, and
//! whether it idled long enough for `server_check_query`); with `Instant`
//! each interval is a checked subtraction of two (seconds, nanoseconds)
//! pairs, about 35 instructions, here it is one. 2^64 nanoseconds is 584
//! years of uptime.

use std::ops::Add;
use std::time::Duration;

/// A point on the monotonic clock, in nanoseconds since boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mono(u64);

impl Mono {
    /// Now.
    pub fn now() -> Mono {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC is
        // always available on Linux (it cannot fail with these arguments).
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
        let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
        Mono(secs.saturating_mul(1_000_000_000).saturating_add(nanos))
    }

    /// The time from `earlier` to `self`; zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Mono) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// The time since `self`.
    pub fn elapsed(self) -> Duration {
        Mono::now().saturating_duration_since(self)
    }

    /// The same point on the wall clock, as the console prints times.
    pub fn to_wall(self) -> std::time::SystemTime {
        let now = std::time::SystemTime::now();
        now.checked_sub(self.elapsed()).unwrap_or(now)
    }

    /// As stored in an atomic (0: never, for a slot's "not yet").
    pub fn nanos(self) -> u64 {
        self.0
    }

    /// Back from [`Mono::nanos`]; `None` for 0.
    pub fn from_nanos(nanos: u64) -> Option<Mono> {
        (nanos != 0).then_some(Mono(nanos))
    }

    /// The same point as a `tokio::time::Instant`, for a timer.
    pub fn to_tokio(self) -> tokio::time::Instant {
        let now = Mono::now();
        let base = tokio::time::Instant::now();
        if self >= now {
            base + self.saturating_duration_since(now)
        } else {
            base.checked_sub(now.saturating_duration_since(self))
                .unwrap_or(base)
        }
    }
}

impl Add<Duration> for Mono {
    type Output = Mono;

    /// Saturates (a setting of years is "never").
    fn add(self, d: Duration) -> Mono {
        Mono(
            self.0
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }
}

impl std::ops::Sub<Duration> for Mono {
    type Output = Mono;

    /// Saturates at the clock's origin.
    fn sub(self, d: Duration) -> Mono {
        Mono(
            self.0
                .saturating_sub(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn reads_the_clock_instant_reads() {
        let (a, i) = (Mono::now(), Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (b, j) = (Mono::now(), Instant::now());
        let gap = b.saturating_duration_since(a);
        assert!(gap >= Duration::from_millis(20), "{gap:?}");
        // The same clock: the two intervals agree (up to the reads' order).
        let diff = gap.abs_diff(j - i);
        assert!(diff < Duration::from_millis(20), "{diff:?}");
        assert_eq!(a.saturating_duration_since(b), Duration::ZERO);
        assert!(b > a);
        // And the same origin: converted, a point lands where Instant has it.
        let a_std = a.to_tokio().into_std();
        assert!(a_std.max(i) - a_std.min(i) < Duration::from_millis(20));
    }

    #[test]
    fn adds_saturating_and_converts_for_timers() {
        let a = Mono::now();
        assert_eq!(
            (a + Duration::from_secs(2)).saturating_duration_since(a),
            Duration::from_secs(2)
        );
        assert_eq!(a + Duration::MAX, Mono(u64::MAX));
        let later = a + Duration::from_secs(5);
        let t = later.to_tokio();
        let left = t.saturating_duration_since(tokio::time::Instant::now());
        assert!(
            left > Duration::from_secs(4) && left <= Duration::from_secs(5),
            "{left:?}"
        );
        assert!(a.to_tokio() <= tokio::time::Instant::now());
    }
}
