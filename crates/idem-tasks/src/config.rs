//! [`TasksConfig`] (bounds on everything read from a caller) and
//! [`TaskSpec`] (a task to create).

use std::time::Duration;

use idem_core::ConfigError;

/// Bounds on what callers send, and the defaults of what they leave out.
#[derive(Clone, Debug)]
pub struct TasksConfig {
    /// The largest payload or result, in bytes of JSON (default 64 KiB).
    pub max_payload_bytes: usize,
    /// The largest cursor, in bytes of JSON (default 4 KiB).
    pub max_cursor_bytes: usize,
    /// Tasks one observation may create (default 100).
    pub max_tasks_per_observation: usize,
    /// A task's attempts when its creator names none (default 5).
    pub default_max_attempts: u32,
    /// The most attempts a creator may ask for (default 100).
    pub max_attempts_limit: u32,
    /// The shortest lease a claim may ask for (default 1 s).
    pub min_lease: Duration,
    /// The longest lease a claim may ask for (default 1 h).
    pub max_lease: Duration,
    /// The most tasks one claim takes (default 100).
    pub max_claim: u32,
    /// The longest error text kept from a failing worker (default 4 KiB).
    pub max_error_bytes: usize,
    /// How long a failed task waits before its next attempt when the worker
    /// names no `retry_in`: this, doubled per attempt, at most 5 minutes
    /// (default 1 s).
    pub retry_base: Duration,
    /// How long an action's ledger entry is kept (default 30 days).
    pub action_retention: Duration,
    /// The longest a claim may wait for a task to become due (`wait`,
    /// default 30 s).
    pub max_wait: Duration,
    /// The longest one operation of [`Tasks`](crate::Tasks) (its own
    /// transaction) may take before it gives up with
    /// [`StoreError::OutcomeUnknown`](idem_core::StoreError::OutcomeUnknown)
    /// — a stalled database must not hold a caller forever; every task
    /// write is safe to repeat, so the caller retries (default 10 s).
    pub deadline: Duration,
}

impl Default for TasksConfig {
    fn default() -> Self {
        Self {
            max_payload_bytes: 64 * 1024,
            max_cursor_bytes: 4096,
            max_tasks_per_observation: 100,
            default_max_attempts: 5,
            max_attempts_limit: 100,
            min_lease: Duration::from_secs(1),
            max_lease: Duration::from_secs(3600),
            max_claim: 100,
            max_error_bytes: 4096,
            retry_base: Duration::from_secs(1),
            action_retention: Duration::from_secs(30 * 86_400),
            max_wait: Duration::from_secs(30),
            deadline: Duration::from_secs(10),
        }
    }
}

impl TasksConfig {
    /// Checks the bounds.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let c = "TasksConfig";
        ConfigError::check_range(c, "max_payload_bytes", self.max_payload_bytes, 2, 16 << 20)?;
        ConfigError::check_range(c, "max_cursor_bytes", self.max_cursor_bytes, 2, 1 << 20)?;
        ConfigError::check_range(
            c,
            "max_tasks_per_observation",
            self.max_tasks_per_observation,
            1,
            10_000,
        )?;
        ConfigError::check_range(c, "max_attempts_limit", self.max_attempts_limit, 1, 10_000)?;
        ConfigError::check_range(
            c,
            "default_max_attempts",
            self.default_max_attempts,
            1,
            self.max_attempts_limit,
        )?;
        ConfigError::check_duration(
            c,
            "min_lease",
            self.min_lease,
            Duration::from_millis(100),
            self.max_lease,
        )?;
        ConfigError::check_duration(
            c,
            "max_lease",
            self.max_lease,
            self.min_lease,
            Duration::from_secs(86_400),
        )?;
        ConfigError::check_range(c, "max_claim", self.max_claim, 1, 1000)?;
        ConfigError::check_range(c, "max_error_bytes", self.max_error_bytes, 16, 1 << 20)?;
        ConfigError::check_duration(
            c,
            "retry_base",
            self.retry_base,
            Duration::from_millis(10),
            Duration::from_secs(300),
        )?;
        ConfigError::check_duration(
            c,
            "deadline",
            self.deadline,
            Duration::from_millis(100),
            Duration::from_secs(600),
        )?;
        ConfigError::check_duration(
            c,
            "max_wait",
            self.max_wait,
            Duration::ZERO,
            Duration::from_secs(300),
        )?;
        ConfigError::check_duration(
            c,
            "action_retention",
            self.action_retention,
            Duration::from_secs(3600),
            Duration::from_secs(365 * 86_400),
        )
    }
}

/// A task to create: its payload, and optionally when it may run, its
/// priority and its attempts.
#[derive(Clone, Debug)]
pub struct TaskSpec {
    /// The payload: JSON, kept with every digit of its numbers.
    pub payload: crate::JsonText,
    /// Not claimed before (unix ms); now when `None`.
    pub run_at_ms: Option<i64>,
    /// Higher first (default 0).
    pub priority: i64,
    /// Attempts before it is dead; [`TasksConfig::default_max_attempts`]
    /// when `None`.
    pub max_attempts: Option<u32>,
}

impl TaskSpec {
    /// A task with `payload`, now, at priority 0, with the default attempts.
    pub fn new(payload: impl Into<crate::JsonText>) -> Self {
        Self {
            payload: payload.into(),
            run_at_ms: None,
            priority: 0,
            max_attempts: None,
        }
    }
}
