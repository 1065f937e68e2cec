//! Per-operation policy: retention and bounded waits.

use std::time::Duration;

/// How long records live and how long a concurrent request waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// How long a record is kept after it was claimed. It must cover the longest
    /// of client retries, queue redrive, webhook redelivery, operator replay and
    /// settlement windows. After it, a retry with the same key executes again.
    pub ttl: Duration,
    /// How long a request waits for a concurrent request with the same key
    /// before it gets "in flight".
    pub wait: Duration,
}

impl Policy {
    /// Default retention: 24 hours.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);
    /// Longest retention accepted: 400 days.
    pub const MAX_TTL: Duration = Duration::from_secs(400 * 24 * 60 * 60);
    /// Default wait for a concurrent request: 5 seconds.
    pub const DEFAULT_WAIT: Duration = Duration::from_secs(5);
    /// Longest wait accepted: 60 seconds.
    pub const MAX_WAIT: Duration = Duration::from_secs(60);

    /// A policy with the given TTL and the default wait, both clamped to their
    /// maxima (and the TTL to at least one second).
    pub fn with_ttl(ttl: Duration) -> Self {
        Self::default().ttl(ttl)
    }

    /// Sets the TTL, clamped to `1 s ..= MAX_TTL`.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl.clamp(Duration::from_secs(1), Self::MAX_TTL);
        self
    }

    /// Sets the wait, clamped to `MAX_WAIT`.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait.min(Self::MAX_WAIT);
        self
    }

    /// When a record claimed at `now_ms` expires.
    pub fn expires_at_ms(&self, now_ms: i64) -> i64 {
        now_ms.saturating_add(self.ttl.as_millis().min(i64::MAX as u128) as i64)
    }
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            ttl: Self::DEFAULT_TTL,
            wait: Self::DEFAULT_WAIT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_enforced() {
        assert_eq!(Policy::default().ttl, Duration::from_secs(86_400));
        assert_eq!(Policy::with_ttl(Duration::ZERO).ttl, Duration::from_secs(1));
        assert_eq!(Policy::with_ttl(Duration::MAX).ttl, Policy::MAX_TTL);
        assert_eq!(Policy::default().wait(Duration::MAX).wait, Policy::MAX_WAIT);
        assert_eq!(
            Policy::with_ttl(Duration::from_secs(2)).expires_at_ms(1_000),
            3_000
        );
    }
}
