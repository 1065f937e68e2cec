//! The inbox: which messages a [`Subscriber`] has applied, recorded through
//! the [`InboxStore`] capability in the handler's transaction.

use std::fmt;
use std::future::Future;

use crate::error::StoreError;
use crate::keys::KeyStore;
use crate::outbox::check;
pub use crate::outbox::{MessageError, MessageId};
use crate::position::PositionStore;

/// A consumer of messages, the scope of inbox records: the same message is
/// applied once per subscriber. `[A-Za-z0-9._:-]`, 1 to 128 bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Subscriber(String);

impl Subscriber {
    /// Validates a subscriber name.
    pub fn new(value: impl Into<String>) -> Result<Self, MessageError> {
        let value = value.into();
        check("subscriber", &value, 128, |b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-')
        })?;
        Ok(Self(value))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Subscriber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The inbox table: which messages a subscriber has applied. Records are
/// written in the handler's transaction (a [`KeyStore::begin`] transaction), so
/// the record and the business effect commit together.
///
/// An inbox store also keeps log consumers' positions ([`PositionStore`]):
/// a consumer of a log (Kafka) stores its offset in the same transaction.
pub trait InboxStore: KeyStore + PositionStore {
    /// Records `(subscriber, message_id)` in `tx`. `Ok(true)`: recorded now, the
    /// message is new. `Ok(false)`: a committed record exists, a duplicate. A
    /// concurrent, uncommitted record of the same message is waited for (at
    /// most the store's lock wait, then [`StoreError::Busy`]).
    fn record(
        &self,
        tx: &mut Self::Tx,
        subscriber: &Subscriber,
        message_id: &MessageId,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Whether a committed record exists (for operators and tests).
    fn seen(
        &self,
        subscriber: &Subscriber,
        message_id: &MessageId,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Deletes at most `limit` records that expired at or before `now_ms`.
    fn purge_expired_inbox(
        &self,
        now_ms: i64,
        limit: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscribers() {
        assert!(Subscriber::new("ledger:v1").is_ok());
        assert!(Subscriber::new("led ger").is_err());
    }
}
