//! The storage capability every backend implements.

use std::future::Future;

use crate::error::StoreError;
use crate::fingerprint::Fingerprint;
use crate::message::{MessageId, OutboxRecord, OutboxStats, Subscriber};
use crate::policy::Policy;
use crate::record::{Completion, StoredRecord};
use crate::scope::Scope;
use crate::webhook::{Accepted, Finish, NewReceipt, Receipt, ReceiptState, Replay};

/// The result of trying to claim a key.
#[derive(Debug)]
pub enum Claim<T> {
    /// The key was free (or its record had expired): a pending record was
    /// written in the open transaction `T`, which the caller now owns. Business
    /// writes go into `T` and commit with the record.
    Claimed(T),
    /// A live record exists and was committed by someone else. The store has
    /// already ended its own transaction.
    Existing(StoredRecord),
}

/// Key records, stored in the same database as the business data.
///
/// Implementations must enforce uniqueness with the primary key
/// `(tenant_id, operation, idempotency_key)` and an `INSERT … ON CONFLICT`, never
/// a read followed by a write, and must make a concurrent claim of the same key
/// wait at most `policy.wait` before returning [`StoreError::Busy`].
pub trait KeyStore: Clone + Send + Sync + 'static {
    /// An open database transaction handed to business code.
    type Tx: Send + 'static;

    /// Opens a transaction, inserts a pending record for `scope` unless a live
    /// one exists, and returns the transaction or the existing record.
    ///
    /// # Cancel safety
    /// Cancelling the future drops the transaction, which rolls it back.
    fn claim(
        &self,
        scope: &Scope,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now_ms: i64,
    ) -> impl Future<Output = Result<Claim<Self::Tx>, StoreError>> + Send;

    /// Stores the outcome on the record claimed in `tx` and commits the
    /// transaction, business writes included.
    fn complete(
        &self,
        tx: Self::Tx,
        scope: &Scope,
        completion: &Completion,
        now_ms: i64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Opens a transaction that claims no key, for requests sent without one.
    fn begin(&self) -> impl Future<Output = Result<Self::Tx, StoreError>> + Send;

    /// Commits a transaction from [`KeyStore::begin`].
    fn commit(&self, tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Rolls back a transaction: the claim and every business write vanish.
    fn rollback(&self, tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Reads a record without locking it (for operators and tests).
    fn fetch(
        &self,
        scope: &Scope,
    ) -> impl Future<Output = Result<Option<StoredRecord>, StoreError>> + Send;

    /// Deletes at most `limit` records that expired at or before `now_ms` and
    /// returns how many it deleted.
    fn purge_expired(
        &self,
        now_ms: i64,
        limit: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// The outbox table, as a dispatcher uses it. Messages are written with the
/// backend's own `enqueue` function inside the caller's transaction; this trait
/// is the relay's side.
///
/// Implementations must claim with a lease so a crashed dispatcher's messages
/// come back, never hand out a message while an earlier one with the same key
/// is still pending (unsent or backing off), and let several dispatchers claim
/// at once without handing one message to two of them within a lease.
pub trait OutboxStore: Clone + Send + Sync + 'static {
    /// Leases up to `limit` publishable messages until `now_ms + lease`: pending,
    /// available, not leased, and first of their key among pending ones.
    /// Ordered by id.
    fn claim_batch(
        &self,
        now_ms: i64,
        lease: std::time::Duration,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<OutboxRecord>, StoreError>> + Send;

    /// Marks messages the broker acknowledged as sent. Returns how many were
    /// still pending.
    fn mark_sent(
        &self,
        ids: &[i64],
        now_ms: i64,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Records a failed attempt: the message is retried at `retry_at_ms`, or
    /// becomes dead when `dead`.
    fn mark_failed(
        &self,
        id: i64,
        error: &str,
        retry_at_ms: i64,
        dead: bool,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Gives messages back without counting an attempt (the broker was
    /// unreachable, not the message at fault); available again at `retry_at_ms`.
    fn release(
        &self,
        ids: &[i64],
        retry_at_ms: i64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Deletes at most `limit` messages sent at or before `before_ms`.
    fn purge_sent(
        &self,
        before_ms: i64,
        limit: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Pending count, oldest pending message, dead count.
    fn stats(&self) -> impl Future<Output = Result<OutboxStats, StoreError>> + Send;
}

/// The inbox table: which messages a subscriber has applied. Records are
/// written in the handler's transaction (a [`KeyStore::begin`] transaction), so
/// the record and the business effect commit together.
pub trait InboxStore: KeyStore {
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

/// A hint that there may be new work (new outbox messages), so a loop can sleep
/// until either the hint or its polling interval. Hints may be missed; polling
/// is what always works.
pub trait Wake: Send {
    /// Returns when a hint arrives or `max` has passed.
    ///
    /// # Cancel safety
    /// Implementations must be cancel safe.
    fn wait(&mut self, max: std::time::Duration) -> impl Future<Output = ()> + Send;
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
    ) -> impl Future<Output = Result<Replay, StoreError>> + Send;

    /// Deletes at most `limit` receipts (and their inbox records) that expired.
    fn purge_expired_receipts(
        &self,
        now_ms: i64,
        limit: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}
