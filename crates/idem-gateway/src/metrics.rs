//! The gateway's counters, through the `metrics` facade (nothing is
//! recorded until the application installs a recorder). Takeovers and
//! refused writes of a stale lease count with the runs' in
//! `idem_lease_takeovers_total` and `idem_fence_rejections_total`.

/// Forwards whose outcome became unknown, by operation and `on_unknown`.
pub const UNKNOWN_OUTCOMES_TOTAL: &str = "idem_gateway_unknown_outcomes_total";
/// Lookups of `verify` routes, by operation and result (`found`,
/// `not_found`, `failed`).
pub const VERIFICATIONS_TOTAL: &str = "idem_gateway_verifications_total";

pub(crate) fn unknown(operation: &str, policy: idem_core::leased::OnUnknown) {
    metrics::counter!(UNKNOWN_OUTCOMES_TOTAL, "operation" => operation.to_owned(),
        "on_unknown" => policy.as_str())
    .increment(1);
}

pub(crate) fn verified(operation: &str, result: &'static str) {
    metrics::counter!(VERIFICATIONS_TOTAL, "operation" => operation.to_owned(), "result" => result)
        .increment(1);
}

pub(crate) fn takeover() {
    metrics::counter!(idem_steps::metrics::LEASE_TAKEOVERS_TOTAL).increment(1);
}

/// A write refused to a stale lease token (another claimer took the key
/// over), counted with the runs' refused fenced writes.
pub(crate) fn fence_rejected() {
    metrics::counter!(idem_steps::metrics::FENCE_REJECTIONS_TOTAL).increment(1);
}
