//! What the layer did with a request, as a response extension for logs and
//! metrics.

use std::time::Duration;

use http::Response;
use idem_core::Operation;

use crate::problem::Rejection;

/// The counter of requests the layer answered, by operation and outcome.
pub const REQUESTS_TOTAL: &str = "idem_http_requests_total";
/// The histogram of their durations in seconds, by operation and outcome.
pub const REQUEST_DURATION: &str = "idem_http_request_duration_seconds";

/// What the idempotency layer did with a request. Every response the layer
/// produces or passes back carries one in its extensions (methods the layer
/// does not cover carry none), so a logging or metrics layer outside it can
/// tell a replay from an execution without parsing headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RequestOutcome {
    /// The handler ran and its response was stored with the key.
    Executed,
    /// The handler ran and its response was not stored (a 5xx, a validation
    /// 400, a `Disposition::Discard`): key and writes rolled back.
    NotStored,
    /// A stored response was replayed.
    Replayed,
    /// A gateway's forward had an unknown outcome and the upstream's
    /// lookup found the intent: what it found was stored and answered.
    Verified,
    /// Optimistic claims: the handler ran, a concurrent duplicate committed
    /// first, so this request's writes rolled back and it answered with the
    /// winner's stored response (marked replayed). Counts the wasted work.
    Superseded,
    /// No key on a route where it is optional: run in a transaction, no record.
    Unkeyed,
    /// Same key, different request (422).
    Mismatch,
    /// Same key still running (409).
    InFlight,
    /// No key where one is required (400).
    MissingKey,
    /// A malformed key, or one sent twice (400).
    MalformedKey,
    /// No tenant (401).
    TenantUnresolved,
    /// Body over the limit (413).
    TooLarge,
    /// The body could not be read (400).
    UnreadableBody,
    /// The store failed before anything was written (503).
    StoreUnavailable,
    /// The commit was not acknowledged (503).
    OutcomeUnknown,
    /// The handler did not answer in time; rolled back (503).
    HandlerTimeout,
    /// A multi-step run was started (or resumed) and goes on after the
    /// answer (202); its outcome is stored when it ends.
    Accepted,
    /// The key's run waits for an operator (409).
    NeedsAttention,
    /// No slot for another multi-step run (503).
    AtCapacity,
    /// The response was too large to store; rolled back (500).
    ResponseTooLarge,
    /// Anything else (500).
    Internal,
}

impl RequestOutcome {
    /// A stable lowercase name (`executed`, `replayed`, `in_flight`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Executed => "executed",
            Self::NotStored => "not_stored",
            Self::Replayed => "replayed",
            Self::Verified => "verified",
            Self::Superseded => "superseded",
            Self::Unkeyed => "unkeyed",
            Self::Mismatch => "mismatch",
            Self::InFlight => "in_flight",
            Self::MissingKey => "missing_key",
            Self::MalformedKey => "malformed_key",
            Self::TenantUnresolved => "tenant_unresolved",
            Self::TooLarge => "too_large",
            Self::UnreadableBody => "unreadable_body",
            Self::StoreUnavailable => "store_unavailable",
            Self::OutcomeUnknown => "outcome_unknown",
            Self::HandlerTimeout => "handler_timeout",
            Self::Accepted => "accepted",
            Self::NeedsAttention => "needs_attention",
            Self::AtCapacity => "at_capacity",
            Self::ResponseTooLarge => "response_too_large",
            Self::Internal => "internal",
        }
    }

    /// The outcome a rejection stands for.
    pub fn of(rejection: &Rejection) -> Self {
        match rejection {
            Rejection::MissingKey => Self::MissingKey,
            Rejection::MalformedKey(_) | Rejection::KeySentTwice => Self::MalformedKey,
            Rejection::TenantUnresolved | Rejection::TenantSentTwice => Self::TenantUnresolved,
            Rejection::FingerprintMismatch => Self::Mismatch,
            Rejection::InFlight(_) => Self::InFlight,
            Rejection::BodyTooLarge => Self::TooLarge,
            Rejection::UnreadableBody => Self::UnreadableBody,
            Rejection::StoreUnavailable(_) => Self::StoreUnavailable,
            Rejection::OutcomeUnknown(_) => Self::OutcomeUnknown,
            Rejection::HandlerTimeout(_) => Self::HandlerTimeout,
            Rejection::NeedsAttention(_) => Self::NeedsAttention,
            Rejection::AtCapacity(_) => Self::AtCapacity,
            Rejection::ResponseTooLarge => Self::ResponseTooLarge,
            Rejection::Internal => Self::Internal,
        }
    }

    /// Counts a request that ended with this outcome on `operation`:
    /// `idem_http_requests_total{operation,outcome}` and the histogram
    /// `idem_http_request_duration_seconds{operation,outcome}`, through the
    /// `metrics` facade (nothing is recorded until an application installs
    /// a recorder). The layer calls it for every request it covers; a
    /// service that uses [`admit`](crate::admit) and
    /// [`execute`](crate::execute) on its own calls it too.
    pub fn record(self, operation: &Operation, elapsed: Duration) {
        let operation = operation.as_str().to_owned();
        let outcome = self.as_str();
        metrics::counter!(REQUESTS_TOTAL, "operation" => operation.clone(), "outcome" => outcome)
            .increment(1);
        metrics::histogram!(REQUEST_DURATION, "operation" => operation, "outcome" => outcome)
            .record(elapsed.as_secs_f64());
    }

    /// Puts this outcome in the response's extensions.
    pub fn mark<B>(self, mut res: Response<B>) -> Response<B> {
        res.extensions_mut().insert(self);
        res
    }
}

impl std::fmt::Display for RequestOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
