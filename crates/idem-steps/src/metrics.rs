//! What the executor counts, through the `metrics` facade (an application
//! installs the recorder). Label values are step names from the workflow's
//! code, never request data.

use crate::StepError;

/// Attempts of external calls, sends and compensating calls, by step and
/// result (`ok`, `unknown`, `retry`, `permanent`).
pub const STEP_ATTEMPTS_TOTAL: &str = "idem_step_attempts_total";
/// Compensations that ended, by result (`done`, `failed`).
pub const COMPENSATIONS_TOTAL: &str = "idem_compensations_total";
/// Runs taken over after their lease lapsed (by a retry or by recovery).
pub const LEASE_TAKEOVERS_TOTAL: &str = "idem_lease_takeovers_total";
/// Fenced writes refused because another executor holds the run.
pub const FENCE_REJECTIONS_TOTAL: &str = "idem_fence_rejections_total";

/// Counts an attempt of `step` by what it answered.
pub(crate) fn attempt<T>(step: &str, answer: &Result<T, StepError>) {
    let result = match answer {
        Ok(_) => "ok",
        Err(StepError::Unknown(_)) => "unknown",
        Err(StepError::Retry(_)) => "retry",
        Err(StepError::Permanent(_)) => "permanent",
    };
    metrics::counter!(STEP_ATTEMPTS_TOTAL, "step" => step.to_owned(), "result" => result)
        .increment(1);
}

/// Counts a compensation that ended: `done` or `failed`.
pub(crate) fn compensation(result: &'static str) {
    metrics::counter!(COMPENSATIONS_TOTAL, "result" => result).increment(1);
}

/// Counts `n` lease takeovers.
pub(crate) fn takeovers(n: u64) {
    metrics::counter!(LEASE_TAKEOVERS_TOTAL).increment(n);
}

/// Counts a refused fenced write.
pub(crate) fn fence_rejected() {
    metrics::counter!(FENCE_REJECTIONS_TOTAL).increment(1);
}
