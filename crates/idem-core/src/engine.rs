//! The key engine: claim, run the mutation in the same transaction, store, replay.

use std::future::Future;
use std::pin::Pin;

use crate::clock::{Clock, SharedClock};
use crate::error::{Error, StoreError};
use crate::fingerprint::Fingerprint;
use crate::keys::{Claim, Completion, Decision, KeyStore, Settled, StoredRecord, decide};
use crate::policy::{ClaimMode, Policy};
use crate::scope::Scope;

/// A boxed future borrowing the transaction, returned by business closures.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What [`Engine::execute`] did.
#[derive(Debug)]
pub enum Outcome<T> {
    /// The operation ran now; its result is `T` and its completion was stored.
    Executed(T),
    /// The key was used before with the same request; this is the stored outcome.
    Replayed(StoredRecord),
}

/// What [`Engine::abort`] did.
#[derive(Debug)]
pub enum Aborted {
    /// Rolled back; the request's own (not stored) answer stands.
    RolledBack,
    /// Optimistic mode only: rolled back, and a concurrent request with the
    /// same key and request had committed; answer with its record.
    Superseded(StoredRecord),
}

/// A key claimed in an open transaction, from [`Engine::begin`].
///
/// Finish it with [`Engine::finish`] (commit) or [`Engine::abort`] (roll back).
/// Dropping it rolls the transaction back.
#[derive(Debug)]
pub struct Claimed<T> {
    /// The open transaction: it holds the pending record (pessimistic mode)
    /// or nothing yet (optimistic mode); business writes go here.
    pub tx: T,
    /// The key's scope.
    pub scope: Scope,
    /// Optimistic mode: what [`Engine::finish`] inserts the record with.
    optimistic: Option<(Fingerprint, Policy)>,
}

/// What [`Engine::finish`] did.
#[derive(Debug)]
#[must_use = "a superseded request must answer with the stored record, not its own result"]
pub enum Finished {
    /// The outcome was stored and committed with the business writes.
    Committed,
    /// Optimistic mode only: a concurrent request with the same key and
    /// request committed first. This transaction, business writes included,
    /// was rolled back; answer with the winner's record.
    Superseded(StoredRecord),
}

/// What [`Engine::begin`] found.
#[derive(Debug)]
pub enum Begun<T> {
    /// The key is ours: run the operation in `tx`.
    Fresh(Claimed<T>),
    /// Same request seen before: replay this.
    Replay(StoredRecord),
}

/// The key engine over a [`KeyStore`].
///
/// ```
/// # async fn demo<S: idem_core::KeyStore>(store: S) -> Result<(), Box<dyn std::error::Error>> {
/// use idem_core::{Engine, Completion, StoredResponse, Policy, Scope, Tenant, Operation,
///                 IdempotencyKey, FingerprintSpec, RequestParts, Outcome};
/// let engine = Engine::new(store);
/// let op = Operation::new("payments.create")?;
/// let scope = Scope::new(Tenant::new("acme")?, op.clone(), IdempotencyKey::new("k-1")?);
/// let body = br#"{"amount":100}"#;
/// let fp = FingerprintSpec::default().fingerprint(&RequestParts {
///     method: "POST", operation: &op, target: "/payments", json: true, body,
/// });
/// let outcome = engine
///     .execute(&scope, &fp, &Policy::default(), |_tx| Box::pin(async move {
///         // write the payment with `_tx` here, then describe the outcome
///         let response = StoredResponse { status: 201, headers: vec![], body: b"{}".to_vec() };
///         Ok::<_, std::io::Error>(Completion::completed(response))
///     }))
///     .await?;
/// match outcome {
///     Outcome::Executed(c) => println!("ran now: {}", c.response.status),
///     Outcome::Replayed(r) => println!("replayed a {:?} record", r.state),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Engine<S, C = SharedClock> {
    store: S,
    clock: C,
}

impl<S: KeyStore> Engine<S> {
    /// An engine on the store's clock ([`KeyStore::clock`]): the host's for
    /// SQLite, the database server's for PostgreSQL.
    pub fn new(store: S) -> Self {
        let clock = store.clock();
        Self { store, clock }
    }
}

impl<S: KeyStore, C: Clock + Clone> Engine<S, C> {
    /// An engine with its own clock (tests use a [`ManualClock`](crate::ManualClock)).
    pub fn with_clock(store: S, clock: C) -> Self {
        Self { store, clock }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Claims `scope` or decides what the request gets instead.
    ///
    /// Read first: a committed, unexpired record is answered from one
    /// indexed read outside any transaction — a replay, or a mismatch when
    /// the fingerprint differs whatever the record's state (see
    /// [`answered_by_read`](crate::keys::answered_by_read)). Only a miss, an
    /// expired record, or (pessimistic mode) a pending record a lease holds
    /// goes on to claim the key: pessimistic mode writes the pending record
    /// now, optimistic mode opens a plain transaction and writes the record
    /// in [`Engine::finish`]. A
    /// record committed between the read and the claim is found by the
    /// claim (pessimistic) or by the insert in `finish` (optimistic).
    ///
    /// # Cancel safety
    /// Cancel safe: a cancelled claim rolls back and leaves no record.
    pub async fn begin(
        &self,
        scope: &Scope,
        fingerprint: &Fingerprint,
        policy: &Policy,
    ) -> Result<Begun<S::Tx>, Error> {
        let now = self.clock.now_ms();
        match self.store.claim(scope, fingerprint, policy, now).await {
            Ok(Claim::Claimed(tx)) => Ok(Begun::Fresh(Claimed {
                tx,
                scope: scope.clone(),
                optimistic: (policy.mode == ClaimMode::Optimistic)
                    .then_some((*fingerprint, *policy)),
            })),
            Ok(Claim::Existing(record)) => replayable(record, fingerprint, now).map(Begun::Replay),
            Err(e) => Err(in_flight_when_busy(e)),
        }
    }

    /// Stores the outcome and commits key record and business writes together.
    ///
    /// In optimistic mode the record is inserted now; when a concurrent
    /// request with the same key committed first, this transaction rolls
    /// back and the result is [`Finished::Superseded`] with that request's
    /// record (or [`Error::FingerprintMismatch`] when it was a different
    /// request, [`Error::InFlight`] when it still holds a lease).
    pub async fn finish(
        &self,
        claimed: Claimed<S::Tx>,
        completion: &Completion,
    ) -> Result<Finished, Error> {
        let now = self.clock.now_ms();
        let Some((fingerprint, policy)) = claimed.optimistic else {
            self.store
                .complete(claimed.tx, &claimed.scope, completion, now)
                .await?;
            return Ok(Finished::Committed);
        };
        let settled = self
            .store
            .insert_completed(
                claimed.tx,
                &claimed.scope,
                &fingerprint,
                completion,
                &policy,
                now,
            )
            .await
            .map_err(in_flight_when_busy)?;
        match settled {
            Settled::Committed => Ok(Finished::Committed),
            Settled::Existing(record) => {
                replayable(record, &fingerprint, now).map(Finished::Superseded)
            }
        }
    }

    /// Rolls back the claim and every business write made in its transaction.
    ///
    /// In optimistic mode the key is then read once: a concurrent duplicate
    /// may have committed meanwhile, and this request's work may have failed
    /// *because* of its effect (the row it wanted was gone). Its record is
    /// then the answer: [`Aborted::Superseded`], or
    /// [`Error::FingerprintMismatch`] when it was another request. A failed
    /// rollback still leaves nothing committed (the database discards the
    /// transaction with its connection), so it is not reported.
    pub async fn abort(&self, claimed: Claimed<S::Tx>) -> Result<Aborted, Error> {
        let rolled_back = self.store.rollback(claimed.tx).await;
        let Some((fingerprint, _)) = claimed.optimistic else {
            return rolled_back
                .map(|()| Aborted::RolledBack)
                .map_err(Error::Store);
        };
        let now = self.clock.now_ms();
        let Ok(Some(record)) = self.store.fetch(&claimed.scope).await else {
            // No winner (or it could not be read): the request's own answer.
            return Ok(Aborted::RolledBack);
        };
        if record.expires_at_ms <= now {
            return Ok(Aborted::RolledBack);
        }
        match replayable(record, &fingerprint, now) {
            Ok(record) => Ok(Aborted::Superseded(record)),
            Err(Error::FingerprintMismatch) => Err(Error::FingerprintMismatch),
            // A lease still holds it: the request's own answer.
            Err(_) => Ok(Aborted::RolledBack),
        }
    }

    /// Opens a transaction that claims no key, for work that needs the
    /// engine's transaction without idempotency (a request sent without a key
    /// on a route where keys are optional). Finish it with
    /// [`Engine::commit_unkeyed`] or [`Engine::abort_unkeyed`]; dropping it
    /// rolls it back.
    ///
    /// # Cancel safety
    /// Cancel safe: a cancelled begin leaves no transaction open.
    pub async fn begin_unkeyed(&self) -> Result<S::Tx, StoreError> {
        self.store.begin().await
    }

    /// Commits a transaction from [`Engine::begin_unkeyed`] with every write
    /// made in it.
    pub async fn commit_unkeyed(&self, tx: S::Tx) -> Result<(), StoreError> {
        self.store.commit(tx).await
    }

    /// Rolls back a transaction from [`Engine::begin_unkeyed`] and every
    /// write made in it.
    pub async fn abort_unkeyed(&self, tx: S::Tx) -> Result<(), StoreError> {
        self.store.rollback(tx).await
    }

    /// Runs `operation` at most once per key and request.
    ///
    /// The closure gets the open transaction that holds the pending key record;
    /// whatever it writes there commits if and only if the record commits. On
    /// `Ok(completion)` the completion is stored and replayed to later
    /// identical requests; on `Err` everything is rolled back, so a retry
    /// executes again. A panic in the closure drops the transaction, which
    /// rolls it back too.
    pub async fn execute<F, E>(
        &self,
        scope: &Scope,
        fingerprint: &Fingerprint,
        policy: &Policy,
        operation: F,
    ) -> Result<Outcome<Completion>, Error<E>>
    where
        F: for<'t> FnOnce(&'t mut S::Tx) -> BoxFuture<'t, Result<Completion, E>>,
    {
        let mut claimed = match self.begin(scope, fingerprint, policy).await {
            Ok(Begun::Fresh(claimed)) => claimed,
            Ok(Begun::Replay(record)) => return Ok(Outcome::Replayed(record)),
            Err(e) => return Err(widen(e)),
        };
        match operation(&mut claimed.tx).await {
            Ok(completion) => match self.finish(claimed, &completion).await.map_err(widen)? {
                Finished::Committed => Ok(Outcome::Executed(completion)),
                Finished::Superseded(record) => Ok(Outcome::Replayed(record)),
            },
            Err(e) => match self.abort(claimed).await {
                Ok(Aborted::Superseded(record)) => Ok(Outcome::Replayed(record)),
                Err(Error::FingerprintMismatch) => Err(Error::FingerprintMismatch),
                // A failed rollback still leaves the transaction uncommitted:
                // the database discards it when the connection goes away.
                _ => Err(Error::Operation(e)),
            },
        }
    }

    /// Deletes expired records in batches of `batch_size` until a batch comes back
    /// short or `max_batches` ran. Returns how many were deleted.
    pub async fn purge_expired(
        &self,
        batch_size: u32,
        max_batches: u32,
    ) -> Result<u64, StoreError> {
        let mut total = 0;
        for _ in 0..max_batches {
            let n = self
                .store
                .purge_expired(self.clock.now_ms(), batch_size)
                .await?;
            total += n;
            if n < u64::from(batch_size) {
                break;
            }
        }
        Ok(total)
    }
}

/// The record a request replays when its key has a live one, or why not.
fn replayable(
    record: StoredRecord,
    fingerprint: &Fingerprint,
    now: i64,
) -> Result<StoredRecord, Error> {
    match decide(record, fingerprint, now) {
        Decision::Replay(record) => Ok(record),
        Decision::Mismatch => Err(Error::FingerprintMismatch),
        Decision::InFlight { retry_after } => Err(Error::InFlight { retry_after }),
    }
}

/// A claim that waited its whole bound for a concurrent request is "in
/// flight" to the caller, never sooner than a second from now.
fn in_flight_when_busy(e: StoreError) -> Error {
    match e {
        StoreError::Busy { waited } => Error::InFlight {
            retry_after: waited.max(std::time::Duration::from_secs(1)),
        },
        e => Error::Store(e),
    }
}

fn widen<E>(e: Error) -> Error<E> {
    match e {
        Error::FingerprintMismatch => Error::FingerprintMismatch,
        Error::InFlight { retry_after } => Error::InFlight { retry_after },
        Error::Store(s) => Error::Store(s),
        Error::Operation(never) => match never {},
    }
}
