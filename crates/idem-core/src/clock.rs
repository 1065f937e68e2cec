//! Time, injectable so TTL and lease logic can be tested without sleeping,
//! and shared, so processes on several hosts judge a lease by one clock.
//!
//! - [`Clock`]: wall-clock time in unix milliseconds; every lease, takeover
//!   and expiry decision reads it.
//! - [`SystemClock`]: this host's clock. Right when every process that shares
//!   the records runs on one host (SQLite).
//! - [`SharedClock`]: any of them behind an `Arc`, as a store hands out the
//!   clock its records are judged by.
//! - [`ReferenceClock`] with [`ClockSample`]: a clock that follows another
//!   one — a database server's — from readings of it, so processes on hosts
//!   whose clocks disagree still agree on when a lease ends (PostgreSQL's
//!   `PgClock` samples the server's `clock_timestamp()` into one).
//! - [`ManualClock`]: moves only when told to (tests).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in unix milliseconds.
pub trait Clock: Send + Sync + 'static {
    /// Now, in milliseconds since the unix epoch.
    fn now_ms(&self) -> i64;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to. Clones share the same time.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// Starts at `now_ms`.
    pub fn new(now_ms: i64) -> Self {
        Self(Arc::new(AtomicI64::new(now_ms)))
    }

    /// Starts at the current system time.
    pub fn starting_now() -> Self {
        Self::new(SystemClock.now_ms())
    }

    /// Moves time forward.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as i64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Any clock, behind an `Arc`: what a store hands out
/// ([`KeyStore::clock`](crate::KeyStore::clock)) and what the components
/// built on a store run on by default. Cheap to clone; clones read the same
/// clock.
#[derive(Clone)]
pub struct SharedClock(Arc<dyn Clock>);

impl SharedClock {
    /// Shares `clock`.
    pub fn new(clock: impl Clock) -> Self {
        Self(Arc::new(clock))
    }

    /// The host's clock ([`SystemClock`]).
    pub fn system() -> Self {
        Self::new(SystemClock)
    }
}

impl From<Arc<dyn Clock>> for SharedClock {
    fn from(clock: Arc<dyn Clock>) -> Self {
        Self(clock)
    }
}

impl Clock for SharedClock {
    fn now_ms(&self) -> i64 {
        self.0.now_ms()
    }
}

impl std::fmt::Debug for SharedClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedClock")
            .field("now_ms", &self.now_ms())
            .finish()
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_ms(&self) -> i64 {
        (**self).now_ms()
    }
}

/// The fastest two clocks are assumed to drift apart, in parts per million:
/// this process's monotonic clock against the reference's wall clock. An
/// uncorrected quartz oscillator is within ±100 ppm; the Linux kernel slews
/// a clock NTP corrects by at most 500 ppm (`adjtimex`'s `MAXFREQ`), and
/// `CLOCK_MONOTONIC` is slewed with it. Both ends slewing at the limit, in
/// opposite directions, make 1000 ppm: 1 ms per second since the sample.
pub const MAX_DRIFT_PPM: u64 = 1000;

/// One reading of a reference clock (a database server's `clock_timestamp()`,
/// in unix microseconds), taken between two readings of this process's
/// monotonic clock: `sent` just before the question left, `received` just
/// after the answer arrived.
///
/// The reference read its clock somewhere in between, so at the midpoint
/// of the round trip the reference's time was `reference_us`, give or take
/// half the round trip. Nothing else is assumed of the network (the way
/// there and the way back may take different times).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSample {
    sent: Instant,
    received: Instant,
    reference_us: i64,
}

impl ClockSample {
    /// A reading `reference_us` (unix microseconds) of the reference clock,
    /// asked at `sent` and answered at `received` (monotonic). An answer
    /// "before" its question (not possible with a monotonic clock) counts as
    /// a round trip of zero.
    pub fn new(sent: Instant, reference_us: i64, received: Instant) -> Self {
        Self {
            sent,
            received: received.max(sent),
            reference_us,
        }
    }

    /// The reading, in unix microseconds.
    pub fn reference_us(&self) -> i64 {
        self.reference_us
    }

    /// How long the question and its answer took.
    pub fn round_trip(&self) -> Duration {
        self.received - self.sent
    }

    /// When the reading is assumed to have been taken: the middle of the
    /// round trip.
    fn midpoint(&self) -> Instant {
        self.sent + self.round_trip() / 2
    }

    /// The reference's time at `at` (a monotonic instant), in unix
    /// microseconds: the reading plus the monotonic time since the midpoint
    /// (minus it, for an instant before the midpoint).
    pub fn reference_us_at(&self, at: Instant) -> i64 {
        let mid = self.midpoint();
        if at >= mid {
            self.reference_us
                .saturating_add(micros(at.duration_since(mid)))
        } else {
            self.reference_us
                .saturating_sub(micros(mid.duration_since(at)))
        }
    }

    /// How far [`ClockSample::reference_us_at`] may be from the reference's
    /// true time at `at`: half the round trip (where in it the reading was
    /// taken is unknown), plus [`MAX_DRIFT_PPM`] of the time since the
    /// midpoint (how far the two clocks may have drifted apart since).
    pub fn error_at(&self, at: Instant) -> Duration {
        let mid = self.midpoint();
        let age = at.max(mid) - mid;
        let drift = age.as_nanos() * u128::from(MAX_DRIFT_PPM) / 1_000_000;
        self.round_trip() / 2 + Duration::from_nanos(u64::try_from(drift).unwrap_or(u64::MAX))
    }

    /// Whether `self`, a newer sample, should replace `current` at `at`:
    /// when its error there is no larger, or when the two disagree by more
    /// than their errors allow — the reference was stepped, or drifted faster
    /// than [`MAX_DRIFT_PPM`], and `current` no longer describes it.
    pub fn supersedes(&self, current: &ClockSample, at: Instant) -> bool {
        let (mine, theirs) = (self.error_at(at), current.error_at(at));
        if mine <= theirs {
            return true;
        }
        let apart = self
            .reference_us_at(at)
            .abs_diff(current.reference_us_at(at));
        u128::from(apart) > (mine + theirs).as_micros()
    }
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// A clock that follows a reference clock — a database server's — from
/// [`ClockSample`]s of it: now is the best sample's reading plus the
/// monotonic time elapsed since it was taken.
///
/// Whoever owns it offers new samples now and then
/// ([`ReferenceClock::offer`]); the one with the smallest error bound at
/// that moment is kept, so a sample taken during a slow round trip does not
/// displace a tight one, while an old sample, whose bound grows with its age
/// ([`MAX_DRIFT_PPM`]), gives way to a fresh one. Between samples the clock
/// runs on this process's monotonic clock, which no change of the host's
/// wall clock moves: a host whose wall clock is minutes off reads the
/// reference's time all the same.
///
/// # Error bound
/// [`ReferenceClock::error_bound`]: half the best sample's round trip plus
/// the drift since (1 ms per second of age, at most). Two processes following
/// one reference read times at most the sum of their bounds apart.
///
/// # Not monotonic
/// It follows the reference, not this process's earlier readings: when a
/// newer sample is adopted the clock may step back by up to the difference
/// of the two samples' errors (well under a millisecond on a local network),
/// and it steps back with the reference when the reference is set back.
/// Holding still instead would leave this process ahead of every process
/// that read the reference after the step — exactly what makes a live lease
/// look expired.
#[derive(Debug)]
pub struct ReferenceClock {
    best: Mutex<ClockSample>,
}

impl ReferenceClock {
    /// A clock following the reference from `first` on.
    pub fn new(first: ClockSample) -> Self {
        Self {
            best: Mutex::new(first),
        }
    }

    /// Offers a newer sample at `at` (a monotonic instant, not before the
    /// sample's answer): kept when it [supersedes](ClockSample::supersedes)
    /// the current one. Returns whether it was.
    pub fn offer(&self, sample: ClockSample, at: Instant) -> bool {
        let mut best = self.best.lock().unwrap_or_else(|e| e.into_inner());
        let adopt = sample.supersedes(&best, at);
        if adopt {
            *best = sample;
        }
        adopt
    }

    /// The sample the clock follows.
    pub fn sample(&self) -> ClockSample {
        *self.best.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The reference's time at `at` (a monotonic instant), in unix
    /// microseconds.
    pub fn now_us_at(&self, at: Instant) -> i64 {
        self.sample().reference_us_at(at)
    }

    /// How far [`Clock::now_ms`] may be from the reference's time now (plus
    /// the millisecond it is truncated to).
    pub fn error_bound(&self) -> Duration {
        self.sample().error_at(Instant::now())
    }
}

impl Clock for ReferenceClock {
    fn now_ms(&self) -> i64 {
        self.now_us_at(Instant::now()).div_euclid(1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    /// 2023-11-14T22:13:20Z in microseconds.
    const T: i64 = 1_700_000_000_000_000;

    fn at(base: Instant, ms: u64) -> Instant {
        base + MS * ms as u32
    }

    #[test]
    fn a_sample_reads_the_reference_from_the_middle_of_its_round_trip() {
        let base = Instant::now();
        // Asked at 0, answered at 10 ms: read at 5 ms, give or take 5 ms.
        let s = ClockSample::new(base, T, at(base, 10));
        assert_eq!(s.round_trip(), 10 * MS);
        assert_eq!(s.reference_us_at(at(base, 5)), T);
        assert_eq!(s.reference_us_at(at(base, 1005)), T + 1_000_000);
        assert_eq!(s.reference_us_at(base), T - 5_000, "before the midpoint");
        assert_eq!(s.error_at(at(base, 5)), 5 * MS);
        // A second later, the drift allowance is 1 ms.
        assert_eq!(s.error_at(at(base, 1005)), 6 * MS);
        // An answer before its question is a round trip of zero.
        let odd = ClockSample::new(at(base, 10), T, base);
        assert_eq!(odd.round_trip(), Duration::ZERO);
    }

    #[test]
    fn the_tightest_sample_wins_until_its_age_makes_a_fresh_one_tighter() {
        let base = Instant::now();
        let tight = ClockSample::new(base, T, at(base, 2)); // ±1 ms
        let clock = ReferenceClock::new(tight);
        // A slow round trip just after: ±20 ms, not adopted.
        let slow = ClockSample::new(at(base, 100), T + 110_000, at(base, 140));
        assert!(!clock.offer(slow, at(base, 140)));
        assert_eq!(clock.sample(), tight);
        // A minute later the tight sample's bound is 1 ms + 60 ms of drift:
        // the same slow sample, taken then, is better.
        let later = ClockSample::new(at(base, 60_000), T + 60_009_000, at(base, 60_040));
        assert!(clock.offer(later, at(base, 60_040)));
        assert_eq!(clock.sample(), later);
        // An equally tight sample taken later always wins (the tie goes to
        // the newer one).
        let fresh = ClockSample::new(at(base, 60_100), T + 60_101_000, at(base, 60_102));
        assert!(clock.offer(fresh, at(base, 60_102)));
    }

    #[test]
    fn a_reference_set_back_or_forward_is_followed_at_the_next_sample() {
        let base = Instant::now();
        let clock = ReferenceClock::new(ClockSample::new(base, T, at(base, 2)));
        // One second later the reference reads five minutes earlier: its
        // clock was set back. The new sample is looser (±10 ms against
        // ±2 ms), but the two cannot both be right: follow the reference.
        let stepped = ClockSample::new(at(base, 1000), T - 300_000_000, at(base, 1020));
        assert!(clock.offer(stepped, at(base, 1020)));
        assert_eq!(clock.now_us_at(at(base, 1010)), T - 300_000_000);
        // Within the errors, a looser sample is not evidence of anything.
        let near = ClockSample::new(at(base, 1100), T - 299_900_000 + 3_000, at(base, 1140));
        assert!(!clock.offer(near, at(base, 1140)));
    }

    #[test]
    fn the_clock_reads_the_reference_not_the_host() {
        // A reference one hour ahead of this host: the clock says so, and
        // moves with the monotonic clock from there.
        let host = SystemClock.now_ms();
        let sent = Instant::now();
        let reference = (host + 3_600_000) * 1000;
        let clock = ReferenceClock::new(ClockSample::new(sent, reference, sent));
        let now = clock.now_ms();
        assert!(now >= host + 3_600_000, "{now} vs {host}");
        assert!(now < host + 3_600_000 + 60_000, "{now} vs {host}");
        assert!(clock.error_bound() < Duration::from_secs(1));
        // Milliseconds round down, before the epoch too.
        let early = ReferenceClock::new(ClockSample::new(sent, -1, sent));
        assert_eq!(early.now_us_at(sent).div_euclid(1000), -1);
    }

    #[test]
    fn readings_far_from_the_sample_saturate_instead_of_overflowing() {
        let base = Instant::now();
        let s = ClockSample::new(base, i64::MAX - 10, base);
        assert_eq!(s.reference_us_at(at(base, 1000)), i64::MAX);
        let s = ClockSample::new(at(base, 1000), i64::MIN + 10, at(base, 1000));
        assert_eq!(s.reference_us_at(base), i64::MIN);
    }
}
