//! The storage capability every backend implements.

use std::future::Future;

use crate::error::StoreError;
use crate::fingerprint::Fingerprint;
use crate::policy::Policy;
use crate::record::{Completion, StoredRecord};
use crate::scope::Scope;

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
