//! What can go wrong, and what the caller can still do about it.

use std::fmt;
use std::time::Duration;

use http::StatusCode;

use crate::Answer;

/// The one error type of this crate.
///
/// Three families, which [`ClientError::nothing_sent`] and
/// [`ClientError::retryable`] tell apart:
///
/// - **invalid input** ([`InvalidUrl`](Self::InvalidUrl),
///   [`InvalidPolicy`](Self::InvalidPolicy), [`InvalidKey`](Self::InvalidKey),
///   [`InvalidRequest`](Self::InvalidRequest)): refused before anything was
///   sent;
/// - **gave up** ([`DeadlineExceeded`](Self::DeadlineExceeded),
///   [`AttemptsExhausted`](Self::AttemptsExhausted)): every attempt failed in
///   a retryable way; the request *may* have taken effect, and sending the
///   same intent again later (same key) is safe and gets its outcome;
/// - **unusable answer** ([`ResponseTooLarge`](Self::ResponseTooLarge)): the
///   server answered, the body was over the configured limit.
///
/// A final answer that is not retryable (any 2xx, 3xx, or a 4xx other than
/// 429 and an in-flight 409) is *not* an error: it is returned as an
/// [`Answer`] and the caller decides.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The base URL cannot be used; nothing was sent.
    #[error("invalid base url {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A field of the [`RetryPolicy`](crate::RetryPolicy) or of the client
    /// configuration is out of range; nothing was sent.
    #[error("invalid client configuration: `{field}` {reason}")]
    InvalidPolicy {
        /// The field, as named in the API (`max_attempts`, `deadline`, …).
        field: &'static str,
        /// What it must be.
        reason: &'static str,
    },
    /// The idempotency key given by the caller is not 1 to 255 visible ASCII
    /// characters; nothing was sent.
    #[error("invalid idempotency key: {reason}")]
    InvalidKey {
        /// What is wrong with it (the key itself is not repeated here).
        reason: String,
    },
    /// The request could not be built (a bad path or header, a body that
    /// does not serialize); nothing was sent.
    #[error("invalid request: {reason}")]
    InvalidRequest {
        /// What is wrong with it.
        reason: String,
    },
    /// The total deadline ran out, or the next wait (a `Retry-After`, or the
    /// backoff) would have ended after it. The request may have taken
    /// effect: send the same intent again (same key) to learn its outcome.
    #[error(
        "deadline of {deadline:?} exceeded after {attempts} attempt(s) with idempotency key {key}; last: {last}"
    )]
    DeadlineExceeded {
        /// The idempotency key every attempt carried.
        key: String,
        /// How many attempts were sent.
        attempts: u32,
        /// The configured total deadline.
        deadline: Duration,
        /// How the last attempt failed.
        last: Failure,
    },
    /// `max_attempts` attempts all failed in a retryable way. The request
    /// may have taken effect: send the same intent again (same key) to learn
    /// its outcome.
    #[error("gave up after {attempts} attempt(s) with idempotency key {key}; last: {last}")]
    AttemptsExhausted {
        /// The idempotency key every attempt carried.
        key: String,
        /// How many attempts were sent (`max_attempts`).
        attempts: u32,
        /// How the last attempt failed.
        last: Failure,
    },
    /// The response body was over the configured limit; it was not read to
    /// the end and not retried (a retry would get the same answer). The
    /// request may have taken effect.
    #[error(
        "response body over the limit of {limit} bytes (status {status}, attempt {attempts}, idempotency key {key})"
    )]
    ResponseTooLarge {
        /// The idempotency key the request carried.
        key: String,
        /// How many attempts were sent.
        attempts: u32,
        /// The status of the oversized answer.
        status: StatusCode,
        /// The configured limit, in bytes.
        limit: usize,
    },
}

impl ClientError {
    /// True when the request was refused before anything went on the wire.
    pub fn nothing_sent(&self) -> bool {
        matches!(
            self,
            Self::InvalidUrl { .. }
                | Self::InvalidPolicy { .. }
                | Self::InvalidKey { .. }
                | Self::InvalidRequest { .. }
        )
    }

    /// True when sending the same intent again later (same
    /// [`RequestBuilder`](crate::RequestBuilder), hence the same key) can
    /// succeed: the client gave up on a deadline or an attempt budget, not on
    /// the request itself.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            Self::DeadlineExceeded { .. } | Self::AttemptsExhausted { .. }
        )
    }

    /// The idempotency key the attempts carried, when something was sent.
    /// Keep it: a later retry with this key replays the outcome.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::DeadlineExceeded { key, .. }
            | Self::AttemptsExhausted { key, .. }
            | Self::ResponseTooLarge { key, .. } => Some(key),
            _ => None,
        }
    }

    /// How many attempts were sent (0 for invalid input).
    pub fn attempts(&self) -> u32 {
        match self {
            Self::DeadlineExceeded { attempts, .. }
            | Self::AttemptsExhausted { attempts, .. }
            | Self::ResponseTooLarge { attempts, .. } => *attempts,
            _ => 0,
        }
    }

    /// The status of the last answer, when the last attempt got one.
    pub fn last_status(&self) -> Option<StatusCode> {
        match self {
            Self::DeadlineExceeded { last, .. } | Self::AttemptsExhausted { last, .. } => {
                last.status()
            }
            Self::ResponseTooLarge { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// How one attempt failed in a way worth retrying.
#[derive(Debug)]
#[non_exhaustive]
pub enum Failure {
    /// The server answered with a retryable status: 429, 5xx, or a 409 that
    /// says the first request with this key is still running. The whole
    /// answer is kept (a `409 needs-attention` problem, for one, says what
    /// an operator must do).
    Status(Box<Answer>),
    /// No complete answer arrived: the connection was refused, reset or
    /// closed early.
    Transport(Box<dyn std::error::Error + Send + Sync>),
    /// No complete answer arrived within the attempt's time.
    Timeout {
        /// The time the attempt had: `attempt_timeout`, or less when the
        /// deadline was nearer.
        after: Duration,
    },
}

impl Failure {
    /// The status, when the server answered.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Self::Status(answer) => Some(answer.status),
            _ => None,
        }
    }

    /// The server's answer, when it gave one.
    pub fn answer(&self) -> Option<&Answer> {
        match self {
            Self::Status(answer) => Some(answer),
            _ => None,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Status(answer) => write!(f, "status {}", answer.status),
            Self::Transport(e) => {
                write!(f, "transport error: {e}")?;
                let mut source = e.source();
                while let Some(s) = source {
                    write!(f, ": {s}")?;
                    source = s.source();
                }
                Ok(())
            }
            Self::Timeout { after } => write!(f, "no answer within {after:?}"),
        }
    }
}
