//! Why a request got no answer.

/// The largest answer body read.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// `--max-requests` is used up; nothing was sent.
    #[error("the request budget (--max-requests) is used up")]
    Budget,
    /// No connection to the target.
    #[error("cannot connect to {addr}: {reason}")]
    Connect {
        /// Where.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The exchange took longer than `--timeout`.
    #[error("no complete answer within {0}")]
    Timeout(String),
    /// The connection broke, or the answer was not HTTP.
    #[error("{0}")]
    Transport(String),
    /// The answer body is over [`MAX_ANSWER_BYTES`].
    #[error("the answer is over {MAX_ANSWER_BYTES} bytes")]
    TooLarge,
}
