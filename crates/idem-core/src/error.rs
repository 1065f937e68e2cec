//! Errors of the core crate.

use std::error::Error as StdError;
use std::time::Duration;

/// A boxed error from a backend or from business code.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Displays an error and its sources on one line, each text once: drivers
/// often repeat their source's message in their own, and clients often say
/// only which step failed (`client error (Connect)`) and leave the cause
/// (`Connection refused`) to their sources.
///
/// ```
/// let io = std::io::Error::new(std::io::ErrorKind::Other, "refused");
/// let e = idem_core::StoreError::Unavailable { source: io.into() };
/// assert_eq!(idem_core::ErrorChain(&e).to_string(), "key store unavailable: refused");
/// ```
#[derive(Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn StdError + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut line = self.0.to_string();
        let mut source = self.0.source();
        while let Some(s) = source {
            let text = s.to_string();
            if !text.is_empty() && !line.contains(&text) {
                line.push_str(": ");
                line.push_str(&text);
            }
            source = s.source();
        }
        f.write_str(&line)
    }
}

impl std::fmt::Debug for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// Why an idempotency key was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is empty.
    #[error("idempotency key is empty")]
    Empty,
    /// The key is longer than 255 characters.
    #[error("idempotency key is {len} characters long, the maximum is 255")]
    TooLong {
        /// The length that was sent.
        len: usize,
    },
    /// The key holds a character outside visible ASCII.
    #[error("idempotency key has a character outside visible ASCII at position {position}")]
    InvalidChar {
        /// Byte offset of the first bad character.
        position: usize,
    },
    /// A bare key holds `"` or `\`, which only a quoted key may carry.
    #[error(
        "idempotency key has a '\"' or '\\' at position {position}, allowed only in a quoted key (\"…\" with \\ escapes)"
    )]
    NeedsQuoting {
        /// Byte offset of the first such character.
        position: usize,
    },
    /// A quoted key is not a well-formed RFC 8941 string.
    #[error("idempotency key is not a well-formed quoted string (position {position})")]
    BadQuoting {
        /// Byte offset where parsing failed.
        position: usize,
    },
}

/// Why a tenant id or an operation name was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScopeError {
    /// Empty or longer than 128 characters.
    #[error("{kind} must be 1 to 128 characters, got {len}")]
    Length {
        /// `tenant` or `operation`.
        kind: &'static str,
        /// The length that was given.
        len: usize,
    },
    /// A character outside the allowed set.
    #[error("{kind} has a character that is not allowed at position {position}")]
    InvalidChar {
        /// `tenant` or `operation`.
        kind: &'static str,
        /// Byte offset of the first bad character.
        position: usize,
    },
}

/// A failure of a key store backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database cannot be reached (connection refused, pool exhausted, I/O).
    #[error("key store unavailable")]
    Unavailable {
        /// The backend's error.
        #[source]
        source: BoxError,
    },
    /// A lock could not be taken within the configured wait: another
    /// transaction holds the key (or, on SQLite, the database's write lock).
    #[error("key store busy: lock not acquired within {waited:?}")]
    Busy {
        /// How long the store waited before giving up.
        waited: Duration,
    },
    /// A stored record could not be decoded; the row was not changed.
    #[error("stored key record is corrupt: {detail}")]
    Corrupt {
        /// What was wrong with it.
        detail: String,
    },
    /// `COMMIT` was sent but its answer never arrived (the connection broke,
    /// or the database did not answer within the store's deadline): the
    /// transaction may or may not have committed. Retrying the same request
    /// with the same key finds out — a replay if it committed, an execution
    /// if it did not — so it is retryable, but nobody may claim that nothing
    /// was written.
    #[error("outcome unknown: the commit was sent but not acknowledged")]
    OutcomeUnknown {
        /// The backend's error.
        #[source]
        source: BoxError,
    },
    /// The database refused a value the caller supplied (on PostgreSQL a data
    /// exception, SQLSTATE `22…`, such as a NUL character in text or a number
    /// out of range, or a value too large for an index, `54000`). Nothing was
    /// changed; the same input fails the same way again.
    #[error("the database refused a value")]
    InvalidValue {
        /// The backend's error.
        #[source]
        source: BoxError,
    },
    /// Any other database error (a constraint, a syntax error in a migration, …).
    #[error("key store error")]
    Database {
        /// The backend's error.
        #[source]
        source: BoxError,
    },
}

impl StoreError {
    /// Whether retrying the same call later may succeed.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            Self::Unavailable { .. } | Self::Busy { .. } | Self::OutcomeUnknown { .. }
        )
    }
}

/// The outcome of [`Engine`](crate::Engine) calls that did not execute or
/// replay.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error<E = std::convert::Infallible> {
    /// The key was used before with a different request fingerprint. Nothing was
    /// executed and the stored record is untouched.
    #[error("idempotency key reused with a different request")]
    FingerprintMismatch,
    /// Another request with this key is still running.
    #[error("a request with this idempotency key is still in flight")]
    InFlight {
        /// When the caller should try again.
        retry_after: Duration,
    },
    /// The key store failed. Nothing was committed, except for
    /// [`StoreError::OutcomeUnknown`], where the commit may have happened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The business operation returned an error; key and mutation were rolled back.
    #[error("operation failed")]
    Operation(#[source] E),
}

impl<E> Error<E> {
    /// Whether retrying the same request later may succeed.
    pub fn retryable(&self) -> bool {
        match self {
            Self::FingerprintMismatch => false,
            Self::InFlight { .. } => true,
            Self::Store(e) => e.retryable(),
            // A business error rolled everything back, so a retry re-executes.
            Self::Operation(_) => true,
        }
    }
}
