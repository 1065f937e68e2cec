//! [`KeyStore`](idem_core::KeyStore) for [`PgStore`] (this backend's part of what idem-sql writes once), from
//! [`idem_sql::keys`]: the claim reads first on a reader connection, then
//! opens the transaction and inserts the claim in one message on a writer
//! (see [`inline`](crate::inline)), waiting (bounded by `lock_timeout`) for
//! a concurrent claim of the same key; the record is stored and the
//! transaction committed in one message too. The claim and the record's
//! statements are prepared on each writer when it opens ([`prepared`]), and
//! the messages `EXECUTE` them: no parsing or planning per request.
//!
//! Round trips of a fresh key: the read, `BEGIN` + the claim, the business
//! statements, the record + `COMMIT` (pessimistic); the read, `BEGIN`, the
//! business statements, the record + `COMMIT` (optimistic). A replay: the
//! read. No ping.

use std::sync::LazyLock;
use std::time::Duration;

use idem_core::keys::Claim;
use idem_core::{ClaimMode, Completion, Scope, StoreError, StoredRecord};
use idem_sql::decode::record;
use idem_sql::dialect::{Dialect, Stmt};
use idem_sql::keys::postgres as sql;
use idem_sql::keys::{
    ClaimRequest, INSERT_COMPLETED, Refused, SELECT_RECORD, UPDATE_COMPLETE, completed, outcome,
    scoped,
};
use idem_sql::store::KEEP_AFTER_MESSAGE_BYTES;

use crate::dialect::query;
use crate::errors::map_err_waited;
use crate::inline::{Lit, guarded, inline, is_guard};
use crate::{PgDialect, PgTx, map_err};

/// The scope's three values, first in every key statement.
fn scope_lits(scope: &Scope) -> [Lit<'_>; 3] {
    [
        Lit::Text(scope.tenant.as_str()),
        Lit::Text(scope.operation.as_str()),
        Lit::Text(scope.key.as_str()),
    ]
}

/// The outcome's six columns, as [`idem_sql::keys::outcome`] binds them.
fn outcome_lits<'a>(c: &'a Completion, headers: &'a str) -> [Lit<'a>; 6] {
    let (kind, id) = c.resource_columns();
    [
        Lit::Text(c.state.as_str()),
        Lit::Int(i64::from(c.response.status)),
        Lit::Text(headers),
        Lit::Bytes(&c.response.body),
        Lit::OptText(kind),
        Lit::OptText(id),
    ]
}

/// A stored answer larger than this is bound, not written into the text
/// (hex doubles it, and the text and the driver's buffer would each hold
/// that): its record goes in a message of its own, then `COMMIT` — one
/// round trip more, for large answers only — and the writer is closed
/// after it.
const INLINE_BODY_BYTES: usize = 64 << 10;

/// What a guarded record write that matched no row says.
const NOT_PENDING: &str = "the claimed record is no longer pending";
const LIVE_RECORD: &str = "the key already has a live record";

/// Idem's three statements of the fresh path — the claim, the claimed
/// record's guarded `UPDATE`, the optimistic record's guarded `INSERT` —
/// prepared once on each writer connection, in the message that sets it up
/// (see `conns`). The messages then `EXECUTE` them with the values written
/// in: PostgreSQL parses a short `EXECUTE` and reuses the statement's plan,
/// where the statement's own text would be parsed, analysed and planned on
/// every request (37 % of PostgreSQL's time on a fresh key, profiled).
pub(crate) fn prepared() -> &'static str {
    static PREPARED: LazyLock<String> = LazyLock::new(|| {
        format!(
            "PREPARE idem_claim AS {}; PREPARE idem_complete AS {}; \
             PREPARE idem_insert_completed AS {}",
            sql::INSERT_CLAIM,
            GUARDED_COMPLETE.as_str(),
            GUARDED_INSERT_COMPLETED.as_str(),
        )
    });
    PREPARED.as_str()
}

/// The claimed record's `UPDATE`, guarded (`$1`..`$10`).
static GUARDED_COMPLETE: LazyLock<String> =
    LazyLock::new(|| guarded(&format!("{UPDATE_COMPLETE} RETURNING 1"), NOT_PENDING));
/// The optimistic record's `INSERT`, guarded (`$1`..`$12`).
static GUARDED_INSERT_COMPLETED: LazyLock<String> =
    LazyLock::new(|| guarded(INSERT_COMPLETED, LIVE_RECORD));

/// `EXECUTE name($1, …, $n)`: the template [`inline`] writes `n` values into.
fn execute(name: &str, n: usize) -> String {
    let params: Vec<String> = (1..=n).map(|i| format!("${i}")).collect();
    format!("EXECUTE {name}({})", params.join(", "))
}

static EXECUTE_CLAIM: LazyLock<String> = LazyLock::new(|| execute("idem_claim", 6));
static EXECUTE_COMPLETE: LazyLock<String> = LazyLock::new(|| execute("idem_complete", 10));
static EXECUTE_INSERT_COMPLETED: LazyLock<String> =
    LazyLock::new(|| execute("idem_insert_completed", 12));

/// The claimed record's guarded `UPDATE`, its values written in.
fn complete_statement(
    scope: &Scope,
    completion: &Completion,
    now_ms: i64,
) -> Result<String, StoreError> {
    let headers = completion.response.headers_json();
    let mut values = Vec::with_capacity(10);
    values.extend(scope_lits(scope));
    values.extend(outcome_lits(completion, &headers));
    values.push(Lit::Int(now_ms));
    inline(&EXECUTE_COMPLETE, &values)
}

impl PgDialect {
    /// The optimistic claim's completed record, inserted at the end of the
    /// operation's transaction in one message with `COMMIT`; it waits for an
    /// uncommitted duplicate as a claim does. A live record of the key makes
    /// the insert fail (the message's `COMMIT` never runs): the transaction
    /// is rolled back, for `live_record` to read the record.
    pub(crate) async fn insert_commit(
        &self,
        tx: PgTx,
        scope: &Scope,
        r: ClaimRequest<'_>,
        completion: &Completion,
    ) -> Result<(), Refused<()>> {
        let deadline = self.deadline_waiting(r.policy.wait);
        let busy = |refused| match refused {
            Refused::Store(StoreError::Busy { .. }) => Refused::Store(StoreError::Busy {
                waited: r.policy.wait,
            }),
            other => other,
        };
        if completion.response.body.len() > INLINE_BODY_BYTES {
            let insert = completed(GUARDED_INSERT_COMPLETED.as_str(), scope, r, completion);
            return self
                .bound_then_commit(tx, insert, deadline)
                .await
                .map_err(busy);
        }
        let headers = completion.response.headers_json();
        let mut values = Vec::with_capacity(12);
        values.extend(scope_lits(scope));
        values.push(Lit::Bytes(&r.fingerprint.as_bytes()[..]));
        values.extend(outcome_lits(completion, &headers));
        values.push(Lit::Int(r.now_ms));
        values.push(Lit::Int(r.policy.expires_at_ms(r.now_ms)));
        // Appended, not formatted: a stored body is in the text twice over
        // (hex), and a copy of it would double that again.
        let mut message = inline(&EXECUTE_INSERT_COMPLETED, &values)?;
        message.push_str("; COMMIT");
        self.commit_with(tx, message, deadline).await.map_err(busy)
    }

    /// A record too large to write into the text: bound, in a message of
    /// its own, then `COMMIT`; the writer is closed afterwards (see
    /// [`INLINE_BODY_BYTES`]).
    async fn bound_then_commit(
        &self,
        mut tx: PgTx,
        write: Stmt<'_>,
        deadline: Duration,
    ) -> Result<(), Refused<()>> {
        let written = tokio::time::timeout(deadline, query(&write).execute(&mut *tx)).await;
        match written {
            Ok(Ok(_)) => {
                tx.close_after();
                self.commit_with(tx, "COMMIT".into(), deadline).await
            }
            Ok(Err(e)) if is_guard(&e) => {
                self.rollback_writer(tx).await?;
                Err(Refused::Guard(()))
            }
            // Dropped, the transaction is rolled back (see `PgTx`).
            Ok(Err(e)) => Err(Refused::Store(map_err(e))),
            Err(_) => Err(Refused::Store(StoreError::Unavailable {
                source: format!("PostgreSQL did not answer within {deadline:?}").into(),
            })),
        }
    }

    /// The live record that refused an optimistic insert, read after its
    /// transaction rolled back.
    pub(crate) async fn live_record_after(
        &self,
        scope: &Scope,
    ) -> Result<StoredRecord, StoreError> {
        match self.bounded(self.read_first_here(scope)).await? {
            Some(record) => Ok(record),
            // Collected between the two: the caller's retry claims it.
            None => Err(StoreError::Busy {
                waited: Duration::ZERO,
            }),
        }
    }

    /// The claimed record completed and the transaction committed, in one
    /// message; a record no longer pending fails the message before its
    /// `COMMIT`.
    pub(crate) async fn complete_commit(
        &self,
        tx: PgTx,
        scope: &Scope,
        completion: &Completion,
        now_ms: i64,
    ) -> Result<(), Refused<()>> {
        if completion.response.body.len() > INLINE_BODY_BYTES {
            let update = outcome(scoped(GUARDED_COMPLETE.as_str(), scope), completion).bind(now_ms);
            return self.bound_then_commit(tx, update, self.deadline()).await;
        }
        let mut message = complete_statement(scope, completion, now_ms)?;
        message.push_str("; COMMIT");
        self.commit_with(tx, message, self.deadline()).await
    }

    pub(crate) async fn commit_writer(&self, tx: PgTx) -> Result<(), StoreError> {
        self.commit_with(tx, "COMMIT".into(), self.deadline())
            .await
            .map_err(Refused::unguarded)
    }

    pub(crate) async fn rollback_writer(&self, tx: PgTx) -> Result<(), StoreError> {
        let writers = tx.writers().clone();
        let mut lease = tx.into_lease();
        let done = self
            .bounded(async {
                sqlx::Executor::execute(&mut lease.conn, sqlx::raw_sql("ROLLBACK"))
                    .await
                    .map_err(map_err)
            })
            .await;
        if done.is_ok() {
            writers.release(lease);
        }
        done.map(|_| ())
    }

    /// A transaction for business writes, waiting the pool's `lock_timeout`.
    pub(crate) async fn begin_business(&self) -> Result<PgTx, StoreError> {
        self.bounded(async {
            let (tx, _) = self.begin_writer("BEGIN".into(), self.lock_timeout).await?;
            Ok(tx)
        })
        .await
    }

    /// The claim's first step: one indexed read of the committed record,
    /// on a reader connection (no ping when it goes back; see `conns`).
    pub(crate) async fn read_first_here(
        &self,
        scope: &Scope,
    ) -> Result<Option<StoredRecord>, StoreError> {
        let binds = [
            scope.tenant.as_str().to_owned(),
            scope.operation.as_str().to_owned(),
            scope.key.as_str().to_owned(),
        ];
        let row = self
            .readers
            .fetch_optional(SELECT_RECORD, binds, self.deadline())
            .await
            .map_err(map_err)?;
        row.as_ref().map(record).transpose()
    }

    /// The claim after the read-first step (both under
    /// `Dialect::bounded_claim`'s deadline).
    pub(crate) async fn claim_writer(
        &self,
        scope: &Scope,
        r: ClaimRequest<'_>,
    ) -> Result<Claim<PgTx>, StoreError> {
        let ClaimRequest {
            fingerprint,
            policy,
            now_ms,
        } = r;
        let begin = self.begin_statement(policy.wait);
        if policy.mode == ClaimMode::Optimistic {
            let (tx, _) = self.begin_writer(begin, policy.wait).await?;
            return Ok(Claim::Claimed(tx));
        }
        let mut values = Vec::with_capacity(6);
        values.extend(scope_lits(scope));
        values.push(Lit::Bytes(&fingerprint.as_bytes()[..]));
        values.push(Lit::Int(now_ms));
        values.push(Lit::Int(policy.expires_at_ms(now_ms)));
        let message = format!("{begin}; {}", inline(&EXECUTE_CLAIM, &values)?);
        let (mut tx, inserted) = self.begin_writer(message, policy.wait).await?;
        if inserted {
            return Ok(Claim::Claimed(tx));
        }
        let claim = |sql: &'static str| {
            scoped(sql, scope)
                .bind(&fingerprint.as_bytes()[..])
                .bind(now_ms)
                .bind(policy.expires_at_ms(now_ms))
        };
        // Between two statements a record can be collected or taken over by
        // another claim; each turn then sees a newer committed state, so a few
        // turns settle it. Usually the first statement decides.
        for turn in 0..3 {
            if turn > 0 {
                let inserted = query(&claim(sql::INSERT_CLAIM))
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(|e| map_err_waited(e, policy.wait))?;
                if inserted.is_some() {
                    return Ok(Claim::Claimed(tx));
                }
            }
            // READ COMMITTED: this statement sees the row the conflicting
            // transaction committed while our INSERT waited for it.
            let row = query(&scoped(SELECT_RECORD, scope))
                .fetch_optional(&mut *tx)
                .await
                .map_err(map_err)?;
            let Some(row) = row else { continue };
            let record = record(&row)?;
            if record.expires_at_ms > now_ms {
                self.rollback_writer(tx).await?;
                return Ok(Claim::Existing(record));
            }
            let taken = query(&claim(sql::TAKE_OVER_EXPIRED))
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| map_err_waited(e, policy.wait))?;
            if taken.is_some() {
                return Ok(Claim::Claimed(tx));
            }
        }
        self.rollback_writer(tx).await?;
        Err(StoreError::Busy {
            waited: policy.wait,
        })
    }
}

impl PgDialect {
    /// Sends `message` — statements ending in `COMMIT` — on `tx`'s
    /// connection under `deadline`. Once it may have been sent, a broken
    /// connection or a missing answer leaves the outcome unknown; an error
    /// the server answered with means it rolled back.
    pub(crate) async fn commit_with(
        &self,
        tx: PgTx,
        message: String,
        deadline: Duration,
    ) -> Result<(), Refused<()>> {
        use crate::errors::connection_lost;
        let writers = tx.writers().clone();
        let close_after = tx.closes_after();
        let mut lease = tx.into_lease();
        let sent = tokio::time::timeout(
            deadline,
            sqlx::Executor::execute(&mut lease.conn, sqlx::raw_sql(&message)),
        )
        .await;
        match sent {
            Ok(Ok(_)) => {
                // The driver keeps a connection's send buffer as large as
                // its largest message: one that carried a large stored
                // answer is closed rather than kept, so idle writers hold
                // no such buffers.
                if message.len() <= KEEP_AFTER_MESSAGE_BYTES && !close_after {
                    writers.release(lease);
                }
                Ok(())
            }
            Ok(Err(e)) if connection_lost(&e) || matches!(e, sqlx::Error::Protocol(_)) => {
                Err(Refused::Store(StoreError::OutcomeUnknown {
                    source: e.into(),
                }))
            }
            Ok(Err(e)) if crate::errors::lost_prepared(&e) => {
                // Business code deallocated Idem's prepared statements: the
                // transaction failed before its COMMIT; closing the
                // connection ends it, and a new one is prepared again.
                drop(lease);
                Err(Refused::Store(map_err(e)))
            }
            Ok(Err(e)) => {
                // The transaction failed before its COMMIT: end it, keep the
                // connection.
                crate::tx::roll_back(lease, writers, self.deadline()).await;
                if is_guard(&e) {
                    Err(Refused::Guard(()))
                } else {
                    Err(Refused::Store(map_err(e)))
                }
            }
            Err(_) => Err(Refused::Store(StoreError::OutcomeUnknown {
                source: format!("PostgreSQL did not answer COMMIT within {deadline:?}").into(),
            })),
        }
    }
}
