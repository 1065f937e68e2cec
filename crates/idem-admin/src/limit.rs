//! The admin token resists guessing: every comparison of a candidate token
//! (a console login, an `Authorization: Bearer` request to `/admin/…` or
//! `/metrics`) is an attempt, limited per source address and in total.
//!
//! - **Per source.** A source is an IPv4 address or an IPv6 /64 (one
//!   subscriber's usual allocation). Its first [`FREE_FAILURES`] − 1
//!   consecutive failures cost nothing; the next locks it out for
//!   [`FIRST_LOCK`] (`--admin-lockout`), and every further failure doubles
//!   the lockout, up to [`MAX_LOCK`]. A success forgets the source's failures. A source is
//!   forgotten [`FORGET`] after its last failure once its lockout ended.
//! - **In total.** At most [`GLOBAL_FAILURES`] failures per
//!   [`GLOBAL_WINDOW`] over all sources; past it every source is locked out
//!   until the window ends — except the few that gave the right token in the
//!   last [`TRUST`] ([`MAX_TRUSTED`] of them), so the operators already at
//!   work keep working while many addresses guess.
//! - **Bounded.** At most [`MAX_SOURCES`] sources are tracked; past it the
//!   entries that are no longer locked go first, then the one whose last
//!   failure is oldest. (An attacker with more addresses than that gets
//!   their entries evicted — the total limit is what stops them.)
//!
//! An attempt is counted as a failure *before* the comparison and forgiven
//! when it succeeds, so many attempts sent at once cannot slip through
//! before the first failure is recorded. A locked-out attempt is refused
//! without being compared. Time is a process-local monotonic clock
//! (`Instant`), passed in so the tests can move it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Consecutive failures from one source before it is locked out.
pub const FREE_FAILURES: u32 = 5;
/// The first lockout of a source, by default (`--admin-lockout`).
pub const FIRST_LOCK: Duration = Duration::from_secs(10);
/// The longest lockout of a source (unless the first is longer).
pub const MAX_LOCK: Duration = Duration::from_secs(15 * 60);
/// How long a source's failures are remembered after the last one.
pub const FORGET: Duration = Duration::from_secs(3600);
/// Failures over all sources per [`GLOBAL_WINDOW`].
pub const GLOBAL_FAILURES: u32 = 100;
/// The window of [`GLOBAL_FAILURES`].
pub const GLOBAL_WINDOW: Duration = Duration::from_secs(60);
/// How long a source that gave the right token is exempt from the total
/// limit.
pub const TRUST: Duration = Duration::from_secs(12 * 3600);
/// The most trusted sources kept.
pub const MAX_TRUSTED: usize = 64;
/// The most sources tracked.
pub const MAX_SOURCES: usize = 4096;

/// The metric: attempts by `via` (`console`, `bearer`) and `result`
/// (`accepted`, `refused`, `locked_out`).
pub const ATTEMPTS_TOTAL: &str = "idem_admin_auth_attempts_total";

/// Where attempts come from: an IPv4 address, an IPv6 /64, or unknown (no
/// peer address, as in an in-process router) — the same peer the server's
/// request body budget shares by ([`idem_http::Peer`]).
pub use idem_http::Peer as Source;

struct Entry {
    failures: u32,
    last: Instant,
    locked_until: Option<Instant>,
}

/// The limiter's settings: the constants above by default.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// [`FREE_FAILURES`].
    pub free_failures: u32,
    /// [`FIRST_LOCK`].
    pub first_lock: Duration,
    /// [`MAX_LOCK`].
    pub max_lock: Duration,
    /// [`FORGET`].
    pub forget: Duration,
    /// [`GLOBAL_FAILURES`].
    pub global_failures: u32,
    /// [`GLOBAL_WINDOW`].
    pub global_window: Duration,
    /// [`TRUST`].
    pub trust: Duration,
    /// [`MAX_TRUSTED`].
    pub max_trusted: usize,
    /// [`MAX_SOURCES`].
    pub max_sources: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            free_failures: FREE_FAILURES,
            first_lock: FIRST_LOCK,
            max_lock: MAX_LOCK,
            forget: FORGET,
            global_failures: GLOBAL_FAILURES,
            global_window: GLOBAL_WINDOW,
            trust: TRUST,
            max_trusted: MAX_TRUSTED,
            max_sources: MAX_SOURCES,
        }
    }
}

impl Limits {
    /// The default settings with a first lockout of `first_lock` (the
    /// longest is then at least as long).
    pub fn with_first_lock(first_lock: Duration) -> Self {
        Self {
            first_lock,
            max_lock: MAX_LOCK.max(first_lock),
            ..Self::default()
        }
    }
}

#[derive(Default)]
struct State {
    sources: HashMap<Source, Entry>,
    trusted: HashMap<Source, Instant>,
    window: Option<(Instant, u32)>,
}

/// The attempt limiter (see the module's documentation).
#[derive(Default)]
pub struct Limiter {
    limits: Limits,
    state: Mutex<State>,
}

/// A counted attempt: call [`Limiter::succeeded_at`] when the token was
/// right; a wrong one needs nothing more (it was counted already).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Attempt(Source);

impl Limiter {
    /// A limiter with these settings.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            state: Mutex::default(),
        }
    }

    /// How long the lockout keeps after `failures` consecutive failures.
    fn lock_for(&self, failures: u32) -> Option<Duration> {
        let over = failures.checked_sub(self.limits.free_failures)?;
        let lock = self.limits.first_lock.saturating_mul(1u32 << over.min(20));
        Some(lock.min(self.limits.max_lock))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts an attempt from `source` at `now` as a failure, or refuses it
    /// with how long the lockout keeps (at least a second): then the
    /// candidate must not be compared.
    pub fn attempt_at(&self, source: Source, now: Instant) -> Result<Attempt, Duration> {
        let limits = self.limits;
        let mut state = self.lock();
        if let Some(Some(until)) = state.sources.get(&source).map(|e| e.locked_until)
            && until > now
        {
            return Err(until - now);
        }
        let trusted = state
            .trusted
            .get(&source)
            .is_some_and(|&t| now.saturating_duration_since(t) < limits.trust);
        let window = match state.window {
            Some((start, n)) if now.saturating_duration_since(start) < limits.global_window => {
                (start, n)
            }
            _ => (now, 0),
        };
        if window.1 >= limits.global_failures && !trusted {
            state.window = Some(window);
            return Err((window.0 + limits.global_window).saturating_duration_since(now));
        }
        state.window = Some((window.0, window.1.saturating_add(1)));
        if !state.sources.contains_key(&source) {
            make_room(&mut state.sources, &limits, now);
        }
        let entry = state.sources.entry(source).or_insert(Entry {
            failures: 0,
            last: now,
            locked_until: None,
        });
        if now.saturating_duration_since(entry.last) >= limits.forget {
            entry.failures = 0;
        }
        entry.failures = entry.failures.saturating_add(1);
        entry.last = now;
        let failures = entry.failures;
        entry.locked_until = self.lock_for(failures).map(|d| now + d);
        if failures == limits.free_failures {
            tracing::warn!(
                source = %source,
                failures,
                "admin token: too many wrong attempts from one source; locking it out"
            );
        }
        Ok(Attempt(source))
    }

    /// The attempt gave the right token: its source's failures are
    /// forgotten, its failure is taken back from the total, and the source
    /// is trusted for [`TRUST`].
    pub fn succeeded_at(&self, attempt: Attempt, now: Instant) {
        let Attempt(source) = attempt;
        let max_trusted = self.limits.max_trusted;
        let mut state = self.lock();
        state.sources.remove(&source);
        if let Some((_, n)) = &mut state.window {
            *n = n.saturating_sub(1);
        }
        if !state.trusted.contains_key(&source) && state.trusted.len() >= max_trusted {
            let oldest = state
                .trusted
                .iter()
                .min_by_key(|(_, t)| **t)
                .map(|(s, _)| *s);
            if let Some(s) = oldest {
                state.trusted.remove(&s);
            }
        }
        state.trusted.insert(source, now);
    }

    /// How many sources are tracked.
    pub fn tracked(&self) -> usize {
        self.lock().sources.len()
    }
}

/// Makes room for one more source: drops the forgotten entries, then, if
/// still full, the unlocked entry whose last failure is oldest, else the
/// locked one whose last failure is oldest.
fn make_room(sources: &mut HashMap<Source, Entry>, limits: &Limits, now: Instant) {
    let max = limits.max_sources;
    if sources.len() < max {
        return;
    }
    let locked = |e: &Entry| e.locked_until.is_some_and(|u| u > now);
    sources.retain(|_, e| locked(e) || now.saturating_duration_since(e.last) < limits.forget);
    while sources.len() >= max {
        let victim = sources
            .iter()
            .min_by_key(|(_, e)| (locked(e), e.last))
            .map(|(s, _)| *s);
        match victim {
            Some(s) => sources.remove(&s),
            None => break,
        };
    }
}

/// Whole seconds for `Retry-After`, rounded up, at least 1.
pub fn retry_after_secs(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

/// Counts an attempt in the metric.
pub fn count(via: &'static str, result: &'static str) {
    metrics::counter!(ATTEMPTS_TOTAL, "via" => via, "result" => result).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    fn v4(last: u8) -> Source {
        Source::of(Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, last))))
    }

    #[test]
    fn a_source_is_locked_out_longer_and_longer_then_released() {
        let l = Limiter::default();
        let t0 = Instant::now();
        let s = v4(1);
        for _ in 1..FREE_FAILURES {
            assert!(l.attempt_at(s, t0).is_ok());
        }
        // The FREE_FAILURES-th failure locks for a second.
        assert!(l.attempt_at(s, t0).is_ok());
        assert_eq!(l.attempt_at(s, t0), Err(FIRST_LOCK));
        assert_eq!(
            l.attempt_at(s, t0 + Duration::from_millis(400)),
            Err(FIRST_LOCK - Duration::from_millis(400))
        );
        // Another source is not affected.
        assert!(l.attempt_at(v4(2), t0).is_ok());
        // After the lockout, one more failure doubles it.
        let t1 = t0 + FIRST_LOCK;
        assert!(l.attempt_at(s, t1).is_ok());
        assert_eq!(l.attempt_at(s, t1), Err(2 * FIRST_LOCK));
        let t2 = t1 + 2 * FIRST_LOCK;
        assert!(l.attempt_at(s, t2).is_ok());
        assert_eq!(l.attempt_at(s, t2), Err(4 * FIRST_LOCK));
        // Capped.
        let mut t = t2 + 4 * FIRST_LOCK;
        for _ in 0..30 {
            assert!(l.attempt_at(s, t).is_ok());
            let wait = l.attempt_at(s, t).unwrap_err();
            assert!(wait <= MAX_LOCK);
            t += wait;
        }
        assert_eq!(
            l.attempt_at(s, t - Duration::from_secs(1)).unwrap_err(),
            Duration::from_secs(1)
        );
        // A success forgets the failures.
        let a = l.attempt_at(s, t).unwrap();
        l.succeeded_at(a, t);
        for _ in 1..FREE_FAILURES {
            assert!(l.attempt_at(s, t).is_ok());
        }
        // And failures long ago are forgotten.
        let later = t + FORGET;
        for _ in 1..FREE_FAILURES {
            assert!(l.attempt_at(s, later).is_ok());
        }
        assert!(l.attempt_at(s, later).is_ok(), "the count started again");
    }

    #[test]
    fn the_total_is_limited_but_trusted_sources_go_on() {
        let l = Limiter::default();
        let t0 = Instant::now();
        let good = v4(250);
        let a = l.attempt_at(good, t0).unwrap();
        l.succeeded_at(a, t0);
        for i in 0..GLOBAL_FAILURES {
            let s = Source::of(Some(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i))));
            assert!(l.attempt_at(s, t0).is_ok(), "{i}");
        }
        let fresh = v4(3);
        let t = t0 + Duration::from_secs(10);
        assert_eq!(
            l.attempt_at(fresh, t),
            Err(GLOBAL_WINDOW - Duration::from_secs(10))
        );
        // The operator who logged in before still can, and that takes its
        // attempt back.
        let a = l.attempt_at(good, t).unwrap();
        l.succeeded_at(a, t);
        // The window ends.
        assert!(l.attempt_at(fresh, t0 + GLOBAL_WINDOW).is_ok());
    }

    #[test]
    fn ipv6_sources_are_their_64_prefix_and_mapped_ipv4_is_ipv4() {
        let a: Ipv6Addr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: Ipv6Addr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        let c: Ipv6Addr = "2001:db8:1:3::1".parse().unwrap();
        let of = |ip: Ipv6Addr| Source::of(Some(IpAddr::V6(ip)));
        assert_eq!(of(a), of(b));
        assert_ne!(of(a), of(c));
        let mapped: Ipv6Addr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(of(mapped), v4(7));
        assert_eq!(Source::of(None), Source::Unknown);
        assert_eq!(of(a).to_string(), "2001:db8:1:2::/64");
        assert_eq!(v4(7).to_string(), "192.0.2.7");
    }

    #[test]
    fn tracked_sources_are_bounded_and_locked_ones_are_kept_longest() {
        let l = Limiter::new(Limits {
            max_sources: 16,
            ..Limits::default()
        });
        let t0 = Instant::now();
        let locked = v4(9);
        for _ in 0..FREE_FAILURES {
            assert!(l.attempt_at(locked, t0).is_ok());
        }
        let ip = |i: u32| Source::of(Some(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i))));
        for i in 0..60 {
            let t = t0 + Duration::from_millis(u64::from(i));
            assert!(l.attempt_at(ip(i), t).is_ok());
            assert!(l.tracked() <= 16, "{i}");
        }
        assert_eq!(
            l.attempt_at(locked, t0),
            Err(FIRST_LOCK),
            "kept: still locked"
        );
        // The newest sources are kept, with their failures.
        for _ in 1..FREE_FAILURES {
            assert!(
                l.attempt_at(ip(59), t0 + Duration::from_millis(100))
                    .is_ok()
            );
        }
        assert!(
            l.attempt_at(ip(59), t0 + Duration::from_millis(100))
                .is_err()
        );
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(60)), 60);
    }
}
