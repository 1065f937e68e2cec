//! What the executor counts, through the `metrics` facade (an application
//! installs the recorder). Label values are step names from the workflow's
//! code, never request data.

use crate::error::StepError;

/// Attempts of external calls, sends and compensating calls, by step and
/// result (`ok`, `unknown`, `retry`, `permanent`).
pub const STEP_ATTEMPTS_TOTAL: &str = "idem_step_attempts_total";
/// Compensations that ended, by result (`done`; `nothing_found`: the
/// compensated call's lookup found no effect after the landing window;
/// `failed`).
pub const COMPENSATIONS_TOTAL: &str = "idem_compensations_total";
/// Lookups of calls whose outcome was unknown, made by their compensation
/// (by the compensation's step, and `found`, `not_found`, `unknown`,
/// `retry`, `permanent`).
pub const LOOKUPS_TOTAL: &str = "idem_step_lookups_total";
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

/// Counts a lookup made by compensation `step` by what it answered.
pub(crate) fn lookup<T>(step: &str, answer: &Result<Option<T>, StepError>) {
    let result = match answer {
        Ok(Some(_)) => "found",
        Ok(None) => "not_found",
        Err(StepError::Unknown(_)) => "unknown",
        Err(StepError::Retry(_)) => "retry",
        Err(StepError::Permanent(_)) => "permanent",
    };
    metrics::counter!(LOOKUPS_TOTAL, "step" => step.to_owned(), "result" => result).increment(1);
}

/// Counts a compensation that ended: `done`, `nothing_found` or `failed`.
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
