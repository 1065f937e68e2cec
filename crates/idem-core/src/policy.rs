//! Per-operation policy: retention, bounded waits and the claim mode.

use std::time::Duration;

/// How a fresh key is held while its operation runs.
///
/// Either way a request whose key already has a committed record is answered
/// from one indexed read, without a transaction; the mode only decides what
/// happens on a miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClaimMode {
    /// A pending record is written before the operation runs and holds the
    /// key: a concurrent duplicate waits (up to [`Policy::wait`]) and then
    /// replays. The operation body runs at most once per key, so it may also
    /// have effects outside the transaction (calling a payment provider
    /// with the same key, say). The default.
    #[default]
    Pessimistic,
    /// No pending record: the operation runs in a plain transaction and the
    /// completed record is inserted at its end, where the primary key decides
    /// a race. A concurrent duplicate may run the operation body too; it then
    /// rolls back and replays the winner's outcome. One write of the record
    /// instead of two, no claim statement. Only for operations whose every
    /// effect is inside the transaction.
    Optimistic,
}

/// How long records live, how long a concurrent request waits, and how a
/// fresh key is claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// How long a record is kept after it was claimed. It must cover the longest
    /// of client retries, queue redrive, webhook redelivery, operator replay and
    /// settlement windows. After it, a retry with the same key executes again.
    pub ttl: Duration,
    /// How long a request waits for a concurrent request with the same key
    /// before it gets "in flight".
    pub wait: Duration,
    /// Pessimistic (the default) or optimistic claims.
    pub mode: ClaimMode,
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

    /// Claims keys optimistically (see [`ClaimMode::Optimistic`]).
    pub fn optimistic(mut self) -> Self {
        self.mode = ClaimMode::Optimistic;
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
            mode: ClaimMode::Pessimistic,
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
        assert_eq!(Policy::default().mode, ClaimMode::Pessimistic);
        let optimistic = Policy::with_ttl(Duration::from_secs(5)).optimistic();
        assert_eq!(
            (optimistic.mode, optimistic.ttl),
            (ClaimMode::Optimistic, Duration::from_secs(5))
        );
    }
}
