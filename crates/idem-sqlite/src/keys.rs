//! [`KeyStore`](idem_core::KeyStore) for [`SqliteStore`] (this backend's part of what idem-sql writes once), from
//! [`idem_sql::keys`]: the claim reads first without the write lock, then,
//! behind the key's in-process gate and on the writer (see
//! [`writer`](crate::writer)), sends `BEGIN IMMEDIATE` and the claim in one
//! message; the record is stored and the transaction committed in one
//! message too, the write guarded so that a record that could not be
//! stored never commits.
//!
//! Statements of a fresh key: the read, `BEGIN IMMEDIATE` + the claim, the
//! business statements, the record + `COMMIT` (pessimistic); the read,
//! `BEGIN IMMEDIATE`, the business statements, the record + `COMMIT`
//! (optimistic). A replay: the read. No ping.
//!
//! The messages bind their values (`$n`, numbered across the message's
//! statements) and are prepared once per connection: sqlx's SQLite driver
//! runs every statement of a query's text in turn. (sqlx marks this
//! behaviour of its SQLite driver as deprecated for `query()`; the
//! statement-count test pins it.)

use std::sync::LazyLock;

use futures_util::StreamExt;
use idem_core::keys::Claim;
use idem_core::{ClaimMode, Completion, Scope, StoreError, StoredRecord};
use idem_sql::decode::record;
use idem_sql::dialect::Dialect;
use idem_sql::keys::sqlite::INSERT_CLAIM;
use idem_sql::keys::{
    ClaimRequest, INSERT_COMPLETED, Refused, SELECT_RECORD, UPDATE_COMPLETE, completed, outcome,
    scoped,
};
use sqlx::sqlite::SqliteArguments;
use sqlx::{Either, Sqlite};

use crate::dialect::query;
use crate::errors::outcome_unknown;
use crate::writer::Lease;
use crate::{SqliteDialect, SqliteTx};

/// Fails the statement (SQLite's `abs()` of the smallest integer is an
/// "integer overflow" error) unless the statement before it changed
/// exactly one row. The failing value depends on `changes()`, so SQLite
/// cannot evaluate it once up front as a constant.
pub(crate) const GUARD: &str = "SELECT CASE changes() WHEN 1 THEN 1 \
    ELSE abs(-9223372036854775807 - 1 + 0 * changes()) END";

/// The pessimistic claim: `BEGIN IMMEDIATE` and the claim, one message.
static BEGIN_CLAIM: LazyLock<String> = LazyLock::new(|| format!("BEGIN IMMEDIATE; {INSERT_CLAIM}"));

/// The claimed record completed, guarded, and `COMMIT`: one message.
static COMPLETE_COMMIT: LazyLock<String> =
    LazyLock::new(|| format!("{UPDATE_COMPLETE}; {GUARD}; COMMIT"));

/// The optimistic claim's record inserted, guarded, and `COMMIT`: one message.
static INSERT_COMMIT: LazyLock<String> =
    LazyLock::new(|| format!("{INSERT_COMPLETED}; {GUARD}; COMMIT"));

type Query<'q> = sqlx::query::Query<'q, Sqlite, SqliteArguments<'q>>;

impl SqliteDialect {
    /// The claim, under the write lock (the read-first step before it ran
    /// without: WAL readers never wait for it).
    pub(crate) async fn claim_writer(
        &self,
        scope: &Scope,
        r: ClaimRequest<'_>,
    ) -> Result<Claim<SqliteTx>, StoreError> {
        if r.policy.mode == ClaimMode::Optimistic {
            return self.begin_writer().await.map(Claim::Claimed);
        }
        let gate = self.gates.enter(scope, r.policy.wait).await?;
        let mut lease = self.writer.acquire().await?;
        let claim = scoped(BEGIN_CLAIM.as_str(), scope)
            .bind(&r.fingerprint.as_bytes()[..])
            .bind(r.now_ms)
            .bind(r.policy.expires_at_ms(r.now_ms));
        let claimed = query(&claim).fetch_optional(lease.conn()).await;
        match claimed {
            Ok(Some(_)) => Ok(Claim::Claimed(SqliteTx::new(lease, Some(gate)))),
            Ok(None) => self.live_record_in(lease, scope).await.map(Claim::Existing),
            Err(e) => {
                // The BEGIN may have succeeded and the claim failed.
                lease.roll_back().await;
                Err(self.map(e))
            }
        }
    }

    /// The optimistic claim's completed record, inserted at the end of the
    /// operation's transaction (which holds the write lock) in one message
    /// with `COMMIT`; a live record of the key makes the guard fail before
    /// the `COMMIT`, leaving the transaction open for `live_record`.
    pub(crate) async fn insert_commit(
        &self,
        tx: SqliteTx,
        scope: &Scope,
        r: ClaimRequest<'_>,
        completion: &Completion,
    ) -> Result<(), Refused<Lease>> {
        let insert = completed(INSERT_COMMIT.as_str(), scope, r, completion);
        self.commit_with(tx.lease, query(&insert), 3).await
    }

    /// The claimed record completed and the transaction committed, in one
    /// message; a record no longer pending fails the guard before the
    /// `COMMIT`, and nothing of the operation commits.
    pub(crate) async fn complete_commit(
        &self,
        tx: SqliteTx,
        scope: &Scope,
        completion: &Completion,
        now_ms: i64,
    ) -> Result<(), Refused<()>> {
        let update = outcome(scoped(COMPLETE_COMMIT.as_str(), scope), completion).bind(now_ms);
        match self.commit_with(tx.lease, query(&update), 3).await {
            Err(Refused::Guard(lease)) => {
                lease.roll_back().await;
                Err(Refused::Guard(()))
            }
            Err(Refused::Store(e)) => Err(Refused::Store(e)),
            Ok(()) => Ok(()),
        }
    }

    pub(crate) async fn commit_writer(&self, tx: SqliteTx) -> Result<(), StoreError> {
        self.commit_with(tx.lease, sqlx::query("COMMIT"), 1)
            .await
            .map_err(Refused::unguarded)
    }

    /// A transaction for business writes: `BEGIN IMMEDIATE` on the writer,
    /// no gate.
    pub(crate) async fn begin_writer(&self) -> Result<SqliteTx, StoreError> {
        let mut lease = self.writer.acquire().await?;
        match sqlx::Executor::execute(lease.conn(), sqlx::query("BEGIN IMMEDIATE")).await {
            Ok(_) => Ok(SqliteTx::new(lease, None)),
            Err(e) => {
                lease.roll_back().await;
                Err(self.map(e))
            }
        }
    }

    /// The record a claim or an optimistic insert conflicted with, read in
    /// its transaction, which holds the write lock: it is committed and
    /// stays as read until the rollback.
    pub(crate) async fn live_record_in(
        &self,
        mut lease: Lease,
        scope: &Scope,
    ) -> Result<StoredRecord, StoreError> {
        let select = scoped(SELECT_RECORD, scope);
        let row = query(&select).fetch_optional(lease.conn()).await;
        lease.roll_back().await;
        match row.map_err(|e| self.map(e))? {
            Some(row) => record(&row),
            None => Err(StoreError::Corrupt {
                detail: "conflicting key record vanished inside a write transaction".into(),
            }),
        }
    }

    /// A key record, read without the write lock, on a reader (no ping
    /// when it goes back; see [`readers`](crate::readers)).
    pub(crate) async fn read_first_here(
        &self,
        scope: &Scope,
    ) -> Result<Option<StoredRecord>, StoreError> {
        let select = scoped(SELECT_RECORD, scope);
        let row = self
            .readers
            .fetch_optional(query(&select))
            .await
            .map_err(|e| self.map(e))?;
        row.as_ref().map(record).transpose()
    }

    /// Sends `message` — `statements` statements, the last `COMMIT`; with
    /// three, a write and its [`GUARD`] before it — on the writer. An error
    /// before the `COMMIT` means it did not run: the transaction is rolled
    /// back (or handed back, when the guard refused). A `COMMIT` that failed
    /// with an I/O error, or a worker that died, leaves the outcome unknown.
    pub(crate) async fn commit_with(
        &self,
        mut lease: Lease,
        message: Query<'_>,
        statements: usize,
    ) -> Result<(), Refused<Lease>> {
        let mut ended = 0;
        let mut written = None;
        let mut failed = None;
        {
            let mut results = sqlx::Executor::fetch_many(lease.conn(), message);
            while let Some(result) = results.next().await {
                match result {
                    Ok(Either::Left(done)) => {
                        written.get_or_insert(done.rows_affected());
                        ended += 1;
                    }
                    Ok(Either::Right(_)) => {}
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
        }
        match failed {
            None if ended == statements => {
                lease.release();
                Ok(())
            }
            Some(e @ sqlx::Error::Database(_)) if ended + 1 == statements => {
                // The COMMIT itself failed; whatever is left open ends here.
                lease.roll_back().await;
                Err(Refused::Store(if outcome_unknown(&e) {
                    StoreError::OutcomeUnknown { source: e.into() }
                } else {
                    self.map(e)
                }))
            }
            Some(sqlx::Error::Database(_))
                if statements == 3 && ended == 1 && written != Some(1) =>
            {
                Err(Refused::Guard(lease))
            }
            Some(e @ sqlx::Error::Database(_)) => {
                lease.roll_back().await;
                Err(Refused::Store(self.map(e)))
            }
            // The worker died or the results stopped short: whether the
            // COMMIT ran is unknown. Closing the connection ends the rest.
            failed => {
                lease.discard();
                let source = match failed {
                    Some(e) => e.into(),
                    None => format!("{ended} of {statements} statements answered").into(),
                };
                Err(Refused::Store(StoreError::OutcomeUnknown { source }))
            }
        }
    }
}
