//! How long and how often to retry: the policy, the backoff with full
//! jitter, and `Retry-After`.

use std::time::{Duration, SystemTime};

use http::HeaderMap;

use crate::ClientError;

/// The most attempts a policy may ask for.
pub const MAX_ATTEMPTS_LIMIT: u32 = 100;
/// The longest total deadline a policy may ask for.
pub const DEADLINE_LIMIT: Duration = Duration::from_secs(24 * 60 * 60);

/// How one intent is retried. Every field is bounded; [`RetryPolicy::default`]
/// is 5 attempts, backoff from 100 ms doubling to 5 s, 10 s per attempt and a
/// 30 s total deadline.
///
/// Change fields on a default (the struct is `#[non_exhaustive]` so that new
/// bounds can be added):
///
/// ```
/// use std::time::Duration;
/// let mut policy = idem_client::RetryPolicy::default();
/// policy.max_attempts = 3;
/// policy.deadline = Duration::from_secs(5);
/// assert!(policy.validate().is_ok());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1 = never retry), at most
    /// [`MAX_ATTEMPTS_LIMIT`].
    pub max_attempts: u32,
    /// The cap of the first backoff; the cap doubles after each failed
    /// attempt. The wait is drawn uniformly in `0..=cap` ("full jitter").
    pub initial_backoff: Duration,
    /// The largest cap of a backoff.
    pub max_backoff: Duration,
    /// The total time of one send: every attempt and every wait between
    /// them, at most [`DEADLINE_LIMIT`].
    pub deadline: Duration,
    /// The time one attempt has to get a complete answer (connect, send,
    /// read the whole body); shortened to what is left of the deadline.
    pub attempt_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            deadline: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// A policy of one attempt: failures are reported, never retried.
    pub fn no_retries() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// Checks every bound; the error names the first field out of range.
    pub fn validate(&self) -> Result<(), ClientError> {
        let invalid = |field, reason| Err(ClientError::InvalidPolicy { field, reason });
        if self.max_attempts == 0 {
            return invalid("max_attempts", "must be at least 1");
        }
        if self.max_attempts > MAX_ATTEMPTS_LIMIT {
            return invalid("max_attempts", "must be at most 100");
        }
        if self.initial_backoff.is_zero() {
            return invalid("initial_backoff", "must be greater than zero");
        }
        if self.max_backoff < self.initial_backoff {
            return invalid("max_backoff", "must be at least initial_backoff");
        }
        if self.max_backoff > DEADLINE_LIMIT {
            return invalid("max_backoff", "must be at most 24 h");
        }
        if self.deadline.is_zero() {
            return invalid("deadline", "must be greater than zero");
        }
        if self.deadline > DEADLINE_LIMIT {
            return invalid("deadline", "must be at most 24 h");
        }
        if self.attempt_timeout.is_zero() {
            return invalid("attempt_timeout", "must be greater than zero");
        }
        Ok(())
    }

    /// The cap of the backoff after `failed` failed attempts (1 = the first):
    /// `initial_backoff × 2^(failed-1)`, at most `max_backoff`.
    pub(crate) fn backoff_cap(&self, failed: u32) -> Duration {
        let exp = failed.saturating_sub(1).min(31);
        self.initial_backoff
            .saturating_mul(1u32 << exp)
            .min(self.max_backoff)
    }

    /// A full-jitter backoff: uniform in `0..=backoff_cap(failed)`.
    pub(crate) fn backoff(&self, failed: u32, rng: &mut XorShift) -> Duration {
        let cap = self.backoff_cap(failed);
        // The cap is at most 24 h, which is far below u64::MAX nanoseconds.
        let cap_nanos = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rng.below_inclusive(cap_nanos))
    }
}

/// xorshift64*: fast, small, good enough to spread retries apart. Not for
/// anything secret.
#[derive(Clone, Debug)]
pub(crate) struct XorShift(u64);

impl XorShift {
    /// Seeded from a v4 UUID (the OS's randomness), so two clients started
    /// in the same instant do not retry in lockstep.
    pub(crate) fn from_entropy() -> Self {
        let (a, b) = uuid::Uuid::new_v4().as_u64_pair();
        Self::seeded(a ^ b.rotate_left(32))
    }

    pub(crate) fn seeded(seed: u64) -> Self {
        // Zero is the one state xorshift never leaves.
        Self(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..=max` (by rejection, so without modulo bias).
    pub(crate) fn below_inclusive(&mut self, max: u64) -> u64 {
        let Some(range) = max.checked_add(1) else {
            return self.next_u64();
        };
        let zone = u64::MAX - (u64::MAX % range);
        loop {
            let x = self.next_u64();
            if x < zone {
                return x % range;
            }
        }
    }
}

/// The `Retry-After` of an answer as a wait from now: delta-seconds or an
/// HTTP-date (a date in the past is no wait). `None` when absent or
/// unreadable; a huge value saturates, so it is always beyond the deadline.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return Some(match value.parse::<u64>() {
            Ok(secs) => Duration::from_secs(secs),
            Err(_) => Duration::MAX,
        });
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(
        at.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn default_policy_is_valid_and_bounded() {
        let p = RetryPolicy::default();
        assert!(p.validate().is_ok());
        assert!(RetryPolicy::no_retries().validate().is_ok());
        assert_eq!(p.backoff_cap(1), Duration::from_millis(100));
        assert_eq!(p.backoff_cap(2), Duration::from_millis(200));
        assert_eq!(p.backoff_cap(6), Duration::from_millis(3200));
        assert_eq!(p.backoff_cap(7), Duration::from_secs(5));
        assert_eq!(p.backoff_cap(u32::MAX), Duration::from_secs(5));
    }

    #[test]
    fn validation_names_the_field() {
        let field_of = |p: RetryPolicy| match p.validate() {
            Err(ClientError::InvalidPolicy { field, .. }) => field,
            other => panic!("expected InvalidPolicy, got {other:?}"),
        };
        let d = RetryPolicy::default();
        let mut p = d;
        p.max_attempts = 0;
        assert_eq!(field_of(p), "max_attempts");
        p.max_attempts = 101;
        assert_eq!(field_of(p), "max_attempts");
        let mut p = d;
        p.initial_backoff = Duration::ZERO;
        assert_eq!(field_of(p), "initial_backoff");
        let mut p = d;
        p.max_backoff = Duration::from_millis(10);
        assert_eq!(field_of(p), "max_backoff");
        let mut p = d;
        p.deadline = Duration::ZERO;
        assert_eq!(field_of(p), "deadline");
        p.deadline = Duration::from_secs(24 * 3600 + 1);
        assert_eq!(field_of(p), "deadline");
        let mut p = d;
        p.attempt_timeout = Duration::ZERO;
        assert_eq!(field_of(p), "attempt_timeout");
    }

    #[test]
    fn full_jitter_stays_within_the_cap_and_spreads() {
        let p = RetryPolicy::default();
        let mut rng = XorShift::seeded(42);
        for failed in 1..=10 {
            let cap = p.backoff_cap(failed);
            let draws: Vec<_> = (0..200).map(|_| p.backoff(failed, &mut rng)).collect();
            assert!(draws.iter().all(|d| *d <= cap), "over the cap {cap:?}");
            // Full jitter: both halves of 0..=cap are used.
            assert!(
                draws.iter().any(|d| *d < cap / 2),
                "nothing low for {cap:?}"
            );
            assert!(
                draws.iter().any(|d| *d > cap / 2),
                "nothing high for {cap:?}"
            );
        }
        assert_eq!(
            XorShift::seeded(0).next_u64(),
            XorShift::seeded(0).next_u64()
        );
        assert_ne!(XorShift::seeded(0).next_u64(), 0);
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(http::header::RETRY_AFTER, HeaderValue::from_static(v));
            retry_after(&h)
        };
        assert_eq!(retry_after(&HeaderMap::new()), None);
        assert_eq!(with("3"), Some(Duration::from_secs(3)));
        assert_eq!(with(" 0 "), Some(Duration::ZERO));
        assert_eq!(with("99999999999999999999999"), Some(Duration::MAX));
        assert_eq!(with("-1"), None);
        assert_eq!(with("soon"), None);
        assert_eq!(with("Sun, 06 Nov 1994 08:49:37 GMT"), Some(Duration::ZERO));
        let later = SystemTime::now() + Duration::from_secs(120);
        let mut h = HeaderMap::new();
        h.insert(
            http::header::RETRY_AFTER,
            HeaderValue::from_str(&httpdate::fmt_http_date(later)).unwrap(),
        );
        let wait = retry_after(&h).unwrap();
        assert!(wait > Duration::from_secs(100) && wait <= Duration::from_secs(120));
    }
}
