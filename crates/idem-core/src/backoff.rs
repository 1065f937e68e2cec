//! Retry delays shared by the dispatcher, the consumer and the webhook
//! workers.

use std::time::Duration;

/// Exponential backoff with jitter, bounded: `initial × 2^attempt`, capped at
/// `max`, then scaled into `[½, 1]` of itself by the jitter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Delay after the first failure.
    pub initial: Duration,
    /// Longest delay.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The delay after `attempt` failures (1 = the first), with `jitter` in
    /// `[0, 1]` (clamped) choosing where in `[½, 1]` of the full delay it lands.
    pub fn delay(&self, attempt: u32, jitter: f64) -> Duration {
        let exp = attempt.saturating_sub(1).min(31);
        let full = self
            .initial
            .saturating_mul(1u32 << exp)
            .min(self.max)
            .max(self.initial.min(self.max));
        full.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_caps_and_jitters() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        assert_eq!(b.delay(1, 1.0), Duration::from_millis(100));
        assert_eq!(b.delay(2, 1.0), Duration::from_millis(200));
        assert_eq!(b.delay(4, 1.0), Duration::from_millis(800));
        assert_eq!(b.delay(5, 1.0), Duration::from_secs(1));
        assert_eq!(b.delay(500, 1.0), Duration::from_secs(1));
        assert_eq!(b.delay(1, 0.0), Duration::from_millis(50));
        assert_eq!(b.delay(0, 7.0), Duration::from_millis(100));
    }
}
