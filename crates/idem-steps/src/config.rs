//! [`RunsConfig`] (the executor of one process) and [`WorkflowPolicy`] (one
//! operation's deadline).

use std::time::Duration;

use idem_core::{Backoff, ConfigError};

/// How the executor of one process runs: leases, concurrency, retries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunsConfig {
    /// How long a lease holds without a heartbeat; heartbeats renew it every
    /// third of it. A run whose executor died is resumed this long after its
    /// last heartbeat. Default 30 s, 1 s to 1 h.
    pub lease: Duration,
    /// Runs executed at once by this process (started by requests and
    /// resumed by the recovery worker together). Default 64, 1 to 10 000.
    pub max_concurrent: usize,
    /// Delays between attempts of a step. Default 250 ms doubling to 30 s;
    /// `initial` 1 ms to 1 h, `max` at least `initial`, at most 1 h.
    pub backoff: Backoff,
    /// Failed attempts of one step, counted over every executor that
    /// resumed the run, when retrying is not bounded by the run's deadline
    /// (after the point of no return, and in compensation); then the run
    /// waits for an operator. Attempts cut short by a crash or a lost lease
    /// are not failures; [`CUT_SHORT_FACTOR`](crate::CUT_SHORT_FACTOR) times
    /// as many of them stop the run too. Default 10, 1 to 1000.
    pub max_attempts: u32,
    /// The longest one attempt of an external call may take; past it the
    /// attempt's outcome is unknown. Default 30 s, 10 ms to 1 h.
    pub call_timeout: Duration,
    /// How long after a call's attempt is abandoned (its start plus
    /// `call_timeout`) a request it sent may still take effect at the other
    /// system: bytes the network still holds (Linux retransmits an
    /// abandoned connection's data for about 100 s by default), a server
    /// still finishing a request it read. A compensation trusts its lookup's
    /// "not found" only from a lookup that starts after the call's last
    /// attempt plus `call_timeout` plus this; until then it waits (and the
    /// run's answer with it). Set it above the other system's own request
    /// timeout. Default 2 min, 0 to 1 h.
    pub landing_margin: Duration,
    /// A retry delay longer than this gives the run back (due after the
    /// delay, for any executor) instead of holding a slot while sleeping.
    /// Default 10 s, at most 1 h.
    pub release_after: Duration,
    /// How long the send-once ledger remembers a message id. Default 30
    /// days, 1 s to 400 days.
    pub message_retention: Duration,
    /// How often the recovery worker looks for runs whose lease expired.
    /// Default 1 s, 10 ms to 1 h.
    pub poll: Duration,
    /// The executor's name in leases (`holder`). Default
    /// `<pid>-<8 random hex digits>`; 1 to 128 characters.
    pub holder: Option<String>,
}

impl Default for RunsConfig {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(30),
            max_concurrent: 64,
            backoff: Backoff {
                initial: Duration::from_millis(250),
                max: Duration::from_secs(30),
            },
            max_attempts: 10,
            call_timeout: Duration::from_secs(30),
            landing_margin: Duration::from_secs(120),
            release_after: Duration::from_secs(10),
            message_retention: Duration::from_secs(30 * 24 * 3600),
            poll: Duration::from_secs(1),
            holder: None,
        }
    }
}

impl RunsConfig {
    /// Checks every bound (called by [`RunsBuilder::build`](crate::RunsBuilder::build)).
    pub fn validate(&self) -> Result<(), ConfigError> {
        const C: &str = "RunsConfig";
        let hour = Duration::from_secs(3600);
        ConfigError::check_duration(C, "lease", self.lease, Duration::from_secs(1), hour)?;
        ConfigError::check_range(C, "max_concurrent", self.max_concurrent, 1, 10_000)?;
        ConfigError::check_duration(
            C,
            "backoff.initial",
            self.backoff.initial,
            Duration::from_millis(1),
            hour,
        )?;
        ConfigError::check_duration(
            C,
            "backoff.max",
            self.backoff.max,
            self.backoff.initial,
            hour,
        )?;
        ConfigError::check_range(C, "max_attempts", self.max_attempts, 1, 1000)?;
        ConfigError::check_duration(
            C,
            "call_timeout",
            self.call_timeout,
            Duration::from_millis(10),
            hour,
        )?;
        ConfigError::check_duration(
            C,
            "landing_margin",
            self.landing_margin,
            Duration::ZERO,
            hour,
        )?;
        ConfigError::check_duration(C, "release_after", self.release_after, Duration::ZERO, hour)?;
        ConfigError::check_duration(
            C,
            "message_retention",
            self.message_retention,
            Duration::from_secs(1),
            Duration::from_secs(400 * 24 * 3600),
        )?;
        ConfigError::check_duration(C, "poll", self.poll, Duration::from_millis(10), hour)?;
        if let Some(h) = &self.holder {
            let ok = (1..=128).contains(&h.len()) && h.bytes().all(|b| (0x21..=0x7e).contains(&b));
            if !ok {
                return Err(ConfigError::new(
                    C,
                    "holder",
                    "1 to 128 visible ASCII characters",
                    format!("{:?}", h.chars().take(40).collect::<String>()),
                ));
            }
        }
        Ok(())
    }
}

/// One operation's policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkflowPolicy {
    /// From the run's start: after it, a step that fails again makes the run
    /// compensate instead of retrying (unless the run passed its point of no
    /// return). Default 5 min, 1 s to 30 days.
    pub deadline: Duration,
}

impl Default for WorkflowPolicy {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(300),
        }
    }
}

impl WorkflowPolicy {
    /// Checks the bounds.
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::check_duration(
            "WorkflowPolicy",
            "deadline",
            self.deadline,
            Duration::from_secs(1),
            Duration::from_secs(30 * 24 * 3600),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_bounded() {
        assert_eq!(RunsConfig::default().validate(), Ok(()));
        assert_eq!(WorkflowPolicy::default().validate(), Ok(()));
        let bad = |c: RunsConfig| c.validate().unwrap_err().to_string();
        let d = RunsConfig::default;
        assert_eq!(
            bad(RunsConfig {
                lease: Duration::from_millis(10),
                ..d()
            }),
            "RunsConfig.lease must be between 1s and 1h, got 10ms"
        );
        assert!(
            bad(RunsConfig {
                max_concurrent: 0,
                ..d()
            })
            .starts_with("RunsConfig.max_concurrent")
        );
        assert!(
            bad(RunsConfig {
                backoff: Backoff {
                    initial: Duration::from_secs(2),
                    max: Duration::from_secs(1)
                },
                ..d()
            })
            .starts_with("RunsConfig.backoff.max")
        );
        assert_eq!(
            bad(RunsConfig {
                landing_margin: Duration::from_secs(7200),
                ..d()
            }),
            "RunsConfig.landing_margin must be between 0s and 1h, got 2h"
        );
        assert!(
            bad(RunsConfig {
                holder: Some("a b".into()),
                ..d()
            })
            .starts_with("RunsConfig.holder")
        );
        assert!(
            WorkflowPolicy {
                deadline: Duration::ZERO
            }
            .validate()
            .is_err()
        );
    }
}
