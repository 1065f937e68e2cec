//! Webhook receipts: what a receiver stores before it answers, what workers
//! process, and the [`WebhookStore`] capability behind both.

use std::fmt;
use std::future::Future;

use crate::error::StoreError;

/// Where a receipt is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReceiptState {
    /// Stored, waiting for a worker.
    Received,
    /// The handler succeeded.
    Processed,
    /// The handler failed; retried later.
    Failed,
    /// The handler failed for good (or too often); an operator may replay it.
    Dead,
    /// Older than the newest applied receipt of its entity: not applied.
    Stale,
}

impl ReceiptState {
    /// The name used in storage.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Received => "received",
            Self::Processed => "processed",
            Self::Failed => "failed",
            Self::Dead => "dead",
            Self::Stale => "stale",
        }
    }

    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "received" => Self::Received,
            "processed" => Self::Processed,
            "failed" => Self::Failed,
            "dead" => Self::Dead,
            "stale" => Self::Stale,
            _ => return None,
        })
    }
}

impl fmt::Display for ReceiptState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A verified delivery to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewReceipt {
    /// The endpoint it was sent to.
    pub endpoint: String,
    /// The provider's delivery id (the dedupe key with the endpoint).
    pub delivery_id: String,
    /// The event type, when the provider says.
    pub event_type: Option<String>,
    /// The request headers, minus credentials.
    pub headers: Vec<(String, String)>,
    /// The raw body, byte for byte.
    pub body: Vec<u8>,
    /// The entity the event is about, for order awareness.
    pub entity_id: Option<String>,
    /// Its version (a number, or a timestamp in unix ms).
    pub entity_version: Option<i64>,
    /// The SHA-256 of the body, when the delivery is also deduplicated on its
    /// content: for schemes whose delivery id is not covered by the signature
    /// (GitHub, Shopify), a stored receipt with the same endpoint and content
    /// hash makes this one a duplicate whatever its delivery id.
    pub content_sha256: Option<[u8; 32]>,
}

/// A stored receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    /// Row id, in arrival order.
    pub id: i64,
    /// What was received.
    pub receipt: NewReceipt,
    /// Where it is.
    pub state: ReceiptState,
    /// Handler runs so far, the successful one included (a stale receipt
    /// is not run). An operator's replay starts again from 0.
    pub attempts: u32,
    /// The last failure.
    pub last_error: Option<String>,
    /// When it arrived (unix ms).
    pub received_at_ms: i64,
    /// When it was processed, found stale or became dead (unix ms); `None`
    /// while it waits or retries, and again after an operator's replay.
    pub finished_at_ms: Option<i64>,
}

/// What [`WebhookStore::accept`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// First time: stored.
    New,
    /// This delivery was stored before; nothing changed.
    Duplicate,
}

/// How a worker's run of a receipt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// Done; the entity's newest applied version moves up to the receipt's.
    Processed,
    /// Older than what was applied: recorded, not applied.
    Stale,
    /// Failed; try again at `at_ms`.
    Retry {
        /// Why.
        error: String,
        /// When to try again (unix ms).
        at_ms: i64,
    },
    /// Failed for good.
    Dead {
        /// Why.
        error: String,
    },
}

/// What an operator's replay of a receipt did ([`WebhookStore::replay_receipt`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// A failed or dead receipt is queued to run again.
    Requeued,
    /// Nothing to do: it is already waiting for a worker.
    AlreadyQueued,
    /// Nothing to do: it finished (processed or stale); replaying it would
    /// apply it twice.
    AlreadyFinished(ReceiptState),
    /// No such receipt.
    NotFound,
}

/// A receipt row's columns as read from any backend, before validation.
#[derive(Debug, Clone, Default)]
pub struct ReceiptColumns {
    /// `id`.
    pub id: i64,
    /// `endpoint`.
    pub endpoint: String,
    /// `delivery_id`.
    pub delivery_id: String,
    /// `event_type`.
    pub event_type: Option<String>,
    /// `headers` (JSON list of pairs).
    pub headers: String,
    /// `body`.
    pub body: Vec<u8>,
    /// `entity_id`.
    pub entity_id: Option<String>,
    /// `entity_version`.
    pub entity_version: Option<i64>,
    /// `content_sha256`.
    pub content_sha256: Option<Vec<u8>>,
    /// `state`.
    pub state: String,
    /// `attempts`.
    pub attempts: i64,
    /// `last_error`.
    pub last_error: Option<String>,
    /// `received_at_ms`.
    pub received_at_ms: i64,
    /// `finished_at_ms`.
    pub finished_at_ms: Option<i64>,
}

impl ReceiptColumns {
    /// Validates the columns; the error names the bad one.
    pub fn decode(self) -> Result<Receipt, StoreError> {
        let corrupt = |what: &str| StoreError::Corrupt {
            detail: format!("webhook receipt {}: {what}", self.id),
        };
        Ok(Receipt {
            id: self.id,
            state: ReceiptState::parse(&self.state).ok_or_else(|| corrupt("state"))?,
            attempts: u32::try_from(self.attempts).map_err(|_| corrupt("attempts"))?,
            receipt: NewReceipt {
                headers: crate::headers::from_json(&self.headers)
                    .ok_or_else(|| corrupt("headers are not a JSON list of pairs"))?,
                endpoint: self.endpoint,
                delivery_id: self.delivery_id,
                event_type: self.event_type,
                body: self.body,
                entity_id: self.entity_id,
                entity_version: self.entity_version,
                content_sha256: match self.content_sha256 {
                    None => None,
                    Some(h) => Some(
                        <[u8; 32]>::try_from(h)
                            .map_err(|_| corrupt("content_sha256 is not 32 bytes"))?,
                    ),
                },
            },
            last_error: self.last_error,
            received_at_ms: self.received_at_ms,
            finished_at_ms: self.finished_at_ms,
        })
    }
}

/// Webhook receipts. A receipt is stored — with an inbox record for its
/// endpoint — in one transaction before the receiver answers, and processed
/// by workers afterwards.
///
/// Implementations must make `(endpoint, delivery_id)` unique, and
/// `(endpoint, content_sha256)` among receipts that have a content hash,
/// both enforced by the one insert of [`WebhookStore::accept`] (never a read
/// before the write); lease claimed receipts so a crashed worker's come back;
/// and never hand out a receipt while an earlier unfinished receipt of the
/// same `(endpoint, entity_id)` exists, so one entity's deliveries are
/// processed one at a time, in arrival order.
pub trait WebhookStore: Clone + Send + Sync + 'static {
    /// Stores the receipt and its inbox record (subscriber `webhook:<endpoint>`)
    /// in one transaction, unless the delivery was stored before: the same
    /// delivery id, or — when the receipt has a content hash — the same
    /// content, on the same endpoint.
    fn accept(
        &self,
        receipt: &NewReceipt,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> impl Future<Output = Result<Accepted, StoreError>> + Send;

    /// Leases up to `limit` receipts of `endpoint` that are due (received, or
    /// failed and past their retry time), first of their entity, in arrival
    /// order. Endpoints are claimed separately so that one endpoint's backlog
    /// or slow handler never holds up another's.
    fn claim_receipts(
        &self,
        endpoint: &str,
        now_ms: i64,
        lease: std::time::Duration,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<Receipt>, StoreError>> + Send;

    /// The newest applied version of an entity.
    fn newest_version(
        &self,
        endpoint: &str,
        entity_id: &str,
    ) -> impl Future<Output = Result<Option<i64>, StoreError>> + Send;

    /// Records how a run ended (for `Processed`, moving the entity's newest
    /// applied version up in the same transaction). `Processed`, `Retry` and
    /// `Dead` count a handler run in `attempts`; `Processed`, `Stale` and
    /// `Dead` set `finished_at_ms`.
    fn finish(
        &self,
        id: i64,
        outcome: &Finish,
        now_ms: i64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Receipts, newest first, optionally of one endpoint and one state.
    fn list_receipts(
        &self,
        endpoint: Option<&str>,
        state: Option<ReceiptState>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<Receipt>, StoreError>> + Send;

    /// One receipt.
    fn get_receipt(
        &self,
        endpoint: &str,
        delivery_id: &str,
    ) -> impl Future<Output = Result<Option<Receipt>, StoreError>> + Send;

    /// An operator's replay: a failed or dead receipt runs again, with
    /// `attempts` back at 0 and no `finished_at_ms`; a processed or stale
    /// one is left alone.
    fn replay_receipt(
        &self,
        endpoint: &str,
        delivery_id: &str,
        now_ms: i64,
    ) -> impl Future<Output = Result<Requeue, StoreError>> + Send;

    /// Deletes at most `limit` receipts (and their inbox records) that expired.
    fn purge_expired_receipts(
        &self,
        now_ms: i64,
        limit: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// How many receipts each endpoint holds in each state (the pairs with
    /// none are left out), ordered by endpoint and state: one grouped
    /// `COUNT`, for the metrics gauges.
    fn count_receipts(
        &self,
    ) -> impl Future<Output = Result<Vec<(String, ReceiptState, u64)>, StoreError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_and_columns_decode() {
        for s in [
            ReceiptState::Received,
            ReceiptState::Processed,
            ReceiptState::Failed,
            ReceiptState::Dead,
            ReceiptState::Stale,
        ] {
            assert_eq!(ReceiptState::parse(s.as_str()), Some(s));
        }
        let good = ReceiptColumns {
            id: 3,
            endpoint: "github".into(),
            delivery_id: "d".into(),
            headers: "[]".into(),
            state: "received".into(),
            ..ReceiptColumns::default()
        };
        assert_eq!(good.clone().decode().unwrap().state, ReceiptState::Received);
        let bad = ReceiptColumns {
            state: "gone".into(),
            ..good.clone()
        };
        assert!(bad.decode().unwrap_err().to_string().contains("state"));
        let bad = ReceiptColumns {
            attempts: -1,
            ..good.clone()
        };
        assert!(bad.decode().unwrap_err().to_string().contains("attempts"));
        let bad = ReceiptColumns {
            content_sha256: Some(vec![1; 31]),
            ..good.clone()
        };
        assert!(
            bad.decode()
                .unwrap_err()
                .to_string()
                .contains("content_sha256")
        );
        let hashed = ReceiptColumns {
            content_sha256: Some(vec![7; 32]),
            ..good
        };
        assert_eq!(
            hashed.decode().unwrap().receipt.content_sha256,
            Some([7; 32])
        );
    }
}
