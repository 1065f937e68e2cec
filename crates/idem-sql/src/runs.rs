//! Runs, steps and the send-once ledger ([`RunStore`]):
//! the statements both dialects share, and the store's methods, written once.
//! The fenced write, the creation, the takeover and the due claim lock
//! differently on each backend and stay there; the step listing (a JSON
//! array on SQLite, an array on PostgreSQL), the message claim (`MAX` or
//! `GREATEST`) and the run listing (typed NULLs) differ by dialect.

use std::sync::LazyLock;

use idem_core::steps::{NewRun, RunId, RunRecord, attach_steps};
use idem_core::{Operation, StoreError};

pub use crate::calls::{RunWrite, Takeover};
use crate::columns::{MESSAGE_COLUMNS, RUN_COLUMNS, STEP_COLUMNS};
use crate::dialect::{Dialect, On, Stmt, fetch_one, read_row, read_rows};
use crate::row;
use crate::store::SqlStore;
use idem_core::steps::{
    Fence, Lease, MessageClaim, Namespace, RunChange, RunFilter, RunState, RunStore, SentMessage,
    StepRecord,
};

/// A key record's expiry while its run lives: never.
pub const NEVER_MS: i64 = i64::MAX;

/// The store's namespace, when drawn.
pub const NAMESPACE: &str = "SELECT value FROM idem_meta WHERE name = 'namespace'";

/// Draws the namespace `$1` unless one was drawn; answers the one kept.
pub const DRAW_NAMESPACE: &str = "\
INSERT INTO idem_meta (name, value) VALUES ('namespace', $1)
ON CONFLICT (name) DO UPDATE SET value = idem_meta.value RETURNING value";

/// One ledger entry: `$1` message id.
pub static MESSAGE: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {MESSAGE_COLUMNS} FROM idem_send_once WHERE message_id = $1"));

/// One run: `$1` id.
pub static LOAD: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {RUN_COLUMNS} FROM idem_runs WHERE id = $1"));

/// Runs per state.
pub const COUNT: &str = "SELECT state, COUNT(*) FROM idem_runs GROUP BY state ORDER BY state";

/// A takeover of `$1` (run) by `$2` (holder) at `$3` (now) until `$4`: the
/// fence moves on, only when the lease has ended.
pub static TAKE_OVER: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE idem_runs SET fence = fence + 1, holder = $2, locked_until_ms = $4,
             takeovers = takeovers + 1, updated_at_ms = $3
         WHERE id = $1 AND state IN ('running', 'compensating')
           AND locked_until_ms <= $3
         RETURNING {RUN_COLUMNS}"
    )
});

/// A `not_sent` entry is anyone's; a run's own `sending` entry is claimed
/// again (one more attempt); anything else is returned as it is. `$1`
/// message, `$2` run, `$3` step, `$4` now, `$5` expiry.
macro_rules! claim_message {
    ($greatest:literal) => {
        concat!(
            "INSERT INTO idem_send_once (message_id, run_id, step, state, attempts, created_at_ms,
                            updated_at_ms, expires_at_ms)
VALUES ($1, $2, $3, 'sending', 1, $4, $4, $5)
ON CONFLICT (message_id) DO UPDATE SET
    run_id = CASE WHEN idem_send_once.state = 'not_sent' THEN excluded.run_id
                  ELSE idem_send_once.run_id END,
    step = CASE WHEN idem_send_once.state = 'not_sent' THEN excluded.step
                ELSE idem_send_once.step END,
    attempts = idem_send_once.attempts +
        CASE WHEN idem_send_once.state = 'not_sent'
               OR (idem_send_once.state = 'sending' AND idem_send_once.run_id = excluded.run_id)
             THEN 1 ELSE 0 END,
    state = CASE WHEN idem_send_once.state = 'not_sent' THEN 'sending'
                 ELSE idem_send_once.state END,
    updated_at_ms = excluded.updated_at_ms,
    expires_at_ms = ",
            $greatest,
            "(idem_send_once.expires_at_ms, excluded.expires_at_ms)
RETURNING message_id, run_id, step, state, attempts, created_at_ms, sent_at_ms"
        )
    };
}

/// SQLite's texts.
pub mod sqlite {
    use super::*;

    /// The ledger claim.
    pub const CLAIM_MESSAGE: &str = claim_message!("MAX");

    /// The fenced update every write of a run goes through (`$1` run, `$2`
    /// fence, `$3`..`$14` the change: `failure` is kept once set; `$6` says
    /// whether the block is replaced by `$7`/`$8`); answers the run's scope.
    pub const UPDATE_RUN: &str = "\
UPDATE idem_runs SET
    state = COALESCE($3, state),
    recovery_point = COALESCE($4, recovery_point),
    failure = COALESCE(failure, $5),
    blocked_step = CASE WHEN $6 THEN $7 ELSE blocked_step END,
    attention = CASE WHEN $6 THEN $8 ELSE attention END,
    no_return = no_return OR $9,
    locked_until_ms = COALESCE($10, locked_until_ms),
    holder = CASE WHEN $11 THEN NULL ELSE holder END,
    fence = fence + $12,
    finished_at_ms = CASE WHEN $13 IS NULL THEN finished_at_ms ELSE $14 END,
    expires_at_ms = COALESCE($13, expires_at_ms),
    updated_at_ms = $14
WHERE id = $1 AND fence = $2
RETURNING tenant_id, operation, idempotency_key";

    /// The step written with a fenced write.
    pub const UPSERT_STEP: &str = "\
INSERT INTO idem_run_steps (run_id, name, seq, kind, state, attempts, step_key, fence, result,
                            error, started_at_ms, finished_at_ms, updated_at_ms, failures)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
ON CONFLICT (run_id, name) DO UPDATE SET
    state = excluded.state, attempts = excluded.attempts, failures = excluded.failures,
    fence = excluded.fence,
    result = excluded.result, error = excluded.error,
    started_at_ms = COALESCE(idem_run_steps.started_at_ms, excluded.started_at_ms),
    finished_at_ms = excluded.finished_at_ms, updated_at_ms = excluded.updated_at_ms";

    /// The ledger mark written with a fenced write: `$1` message, `$2`
    /// state, `$3` run, `$4` now.
    pub const MARK_MESSAGE: &str = "\
UPDATE idem_send_once SET state = $2,
    sent_at_ms = CASE WHEN $2 = 'sent' THEN $4 ELSE sent_at_ms END, updated_at_ms = $4
WHERE message_id = $1 AND run_id = $3";

    /// The key record's expiry: `$1`..`$3` the scope, `$4` the expiry.
    pub const KEY_EXPIRY: &str = "\
UPDATE idem_keys SET expires_at_ms = $4
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3";

    /// A run of the id about to be created: its state and fence.
    pub const RUN_STATE: &str = "SELECT state, fence FROM idem_runs WHERE id = $1";

    /// A final run of the id, left from a key record that expired.
    pub const DELETE_RUN: &str = "DELETE FROM idem_runs WHERE id = $1";

    /// A new run: `$1`..`$10` as [`super::postgres::CREATE_RUN`], `$11` its
    /// fence.
    pub const INSERT_RUN: &str = "\
INSERT INTO idem_runs (id, tenant_id, operation, idempotency_key, state, input, holder,
                       locked_until_ms, fence, deadline_ms, ttl_ms, created_at_ms,
                       updated_at_ms)
VALUES ($1, $2, $3, $4, 'running', $5, $6, $7, $11, $8, $9, $10, $10)";

    /// The due runs, taken over: `$1` holder, `$2` now, `$3` lease end, `$4`
    /// operations (a JSON array), `$5` limit.
    pub static CLAIM_DUE: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE idem_runs SET fence = fence + 1, holder = $1, locked_until_ms = $3,
                 takeovers = takeovers + 1, updated_at_ms = $2
             WHERE id IN (SELECT id FROM idem_runs
                          WHERE state IN ('running', 'compensating') AND locked_until_ms <= $2
                            AND operation IN (SELECT value FROM json_each($4))
                          ORDER BY locked_until_ms LIMIT $5)
             RETURNING {RUN_COLUMNS}"
        )
    });

    /// The steps of `$1` (a JSON array of run ids).
    pub static STEPS_OF: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {STEP_COLUMNS} FROM idem_run_steps
             WHERE run_id IN (SELECT value FROM json_each($1)) ORDER BY run_id, seq"
        )
    });

    /// A listing: `$1` state, `$2` limit.
    pub static LIST: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {RUN_COLUMNS} FROM idem_runs WHERE ($1 IS NULL OR state = $1)
             ORDER BY created_at_ms DESC, id DESC LIMIT $2"
        )
    });

    /// What the shared code reads.
    pub const TEXTS: Texts = Texts {
        claim_message: CLAIM_MESSAGE,
        claim_due: &CLAIM_DUE,
        steps_of: &STEPS_OF,
        list: &LIST,
    };
}

/// PostgreSQL's texts.
pub mod postgres {
    use super::*;

    /// The ledger claim.
    pub const CLAIM_MESSAGE: &str = claim_message!("GREATEST");

    /// Every write of a run: the fenced update (`$1`..`$14` as SQLite's
    /// `UPDATE_RUN`), and — only when it matched — the step upsert (when
    /// `$15` names a step), the ledger mark (when `$26` names a message) and
    /// the key record's expiry (when `$13` is set). One statement, one round
    /// trip; it answers 1 when written, 0 when fenced out.
    pub const RECORD: &str = "\
WITH r AS (
    UPDATE idem_runs SET
        state = COALESCE($3, state),
        recovery_point = COALESCE($4, recovery_point),
        failure = COALESCE(failure, $5),
        blocked_step = CASE WHEN $6 THEN $7 ELSE blocked_step END,
        attention = CASE WHEN $6 THEN $8 ELSE attention END,
        no_return = no_return OR $9,
        locked_until_ms = COALESCE($10, locked_until_ms),
        holder = CASE WHEN $11 THEN NULL ELSE holder END,
        fence = fence + $12,
        finished_at_ms = CASE WHEN $13::bigint IS NULL THEN finished_at_ms ELSE $14 END,
        expires_at_ms = COALESCE($13, expires_at_ms),
        updated_at_ms = $14
    WHERE id = $1 AND fence = $2
    RETURNING id, tenant_id, operation, idempotency_key),
s AS (
    INSERT INTO idem_run_steps (run_id, name, seq, kind, state, attempts, step_key, fence,
                                result, error, started_at_ms, finished_at_ms, updated_at_ms,
                                failures)
    SELECT r.id, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $14, $28
    FROM r WHERE $15::text IS NOT NULL
    ON CONFLICT (run_id, name) DO UPDATE SET
        state = excluded.state, attempts = excluded.attempts, failures = excluded.failures,
        fence = excluded.fence,
        result = excluded.result, error = excluded.error,
        started_at_ms = COALESCE(idem_run_steps.started_at_ms, excluded.started_at_ms),
        finished_at_ms = excluded.finished_at_ms, updated_at_ms = excluded.updated_at_ms),
m AS (
    UPDATE idem_send_once SET state = $27,
        sent_at_ms = CASE WHEN $27 = 'sent' THEN $14 ELSE sent_at_ms END, updated_at_ms = $14
    FROM r WHERE idem_send_once.message_id = $26 AND idem_send_once.run_id = r.id),
k AS (
    UPDATE idem_keys SET expires_at_ms = $13 FROM r
    WHERE $13::bigint IS NOT NULL AND idem_keys.tenant_id = r.tenant_id
      AND idem_keys.operation = r.operation AND idem_keys.idempotency_key = r.idempotency_key)
SELECT count(*) FROM r";

    /// A new run (`$1` id, `$2`..`$4` the scope, `$5` input, `$6` holder,
    /// `$7` lease end, `$8` deadline, `$9` TTL, `$10` now, `$11` the key's
    /// expiry while it lives). A final run of the id (left from an expired
    /// key record) is replaced, its fence carried on; a live one is left
    /// alone and nothing is returned.
    pub const CREATE_RUN: &str = "\
WITH k AS (
    UPDATE idem_keys SET expires_at_ms = $11
    WHERE tenant_id = $2 AND operation = $3 AND idempotency_key = $4),
s AS (DELETE FROM idem_run_steps WHERE run_id = $1
      AND EXISTS (SELECT 1 FROM idem_runs WHERE id = $1 AND state IN ('completed', 'failed')))
INSERT INTO idem_runs (id, tenant_id, operation, idempotency_key, state, input, holder,
                       locked_until_ms, fence, deadline_ms, ttl_ms, created_at_ms, updated_at_ms)
VALUES ($1, $2, $3, $4, 'running', $5, $6, $7, 1, $8, $9, $10, $10)
ON CONFLICT (id) DO UPDATE SET
    state = 'running', input = excluded.input, recovery_point = NULL, failure = NULL,
    blocked_step = NULL, attention = NULL, no_return = FALSE, holder = excluded.holder,
    locked_until_ms = excluded.locked_until_ms, fence = idem_runs.fence + 1, takeovers = 0,
    deadline_ms = excluded.deadline_ms, ttl_ms = excluded.ttl_ms,
    created_at_ms = excluded.created_at_ms, updated_at_ms = excluded.updated_at_ms,
    finished_at_ms = NULL, expires_at_ms = NULL
WHERE idem_runs.state IN ('completed', 'failed')
RETURNING fence";

    /// The due runs, taken over, skipping rows another claimer holds: `$1`
    /// holder, `$2` now, `$3` lease end, `$4` operations (an array), `$5`
    /// limit.
    pub static CLAIM_DUE: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE idem_runs SET fence = fence + 1, holder = $1, locked_until_ms = $3,
                 takeovers = takeovers + 1, updated_at_ms = $2
             WHERE id = ANY(ARRAY(
                 SELECT id FROM idem_runs
                 WHERE state IN ('running', 'compensating') AND locked_until_ms <= $2
                   AND operation = ANY($4)
                 ORDER BY locked_until_ms LIMIT $5
                 FOR UPDATE SKIP LOCKED))
               AND state IN ('running', 'compensating') AND locked_until_ms <= $2
             RETURNING {RUN_COLUMNS}"
        )
    });

    /// The steps of `$1` (an array of run ids).
    pub static STEPS_OF: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {STEP_COLUMNS} FROM idem_run_steps WHERE run_id = ANY($1) \
             ORDER BY run_id, seq"
        )
    });

    /// A listing: `$1` state, `$2` limit.
    pub static LIST: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {RUN_COLUMNS} FROM idem_runs WHERE ($1::text IS NULL OR state = $1)
             ORDER BY created_at_ms DESC, id DESC LIMIT $2"
        )
    });

    /// What the shared code reads.
    pub const TEXTS: Texts = Texts {
        claim_message: CLAIM_MESSAGE,
        claim_due: &CLAIM_DUE,
        steps_of: &STEPS_OF,
        list: &LIST,
    };
}

/// One dialect's texts the shared run code reads.
#[derive(Debug)]
pub struct Texts {
    /// The ledger claim.
    pub claim_message: &'static str,
    /// The due runs, taken over: `$1` holder, `$2` now, `$3` lease end,
    /// `$4` operations (a list), `$5` limit.
    pub claim_due: &'static LazyLock<String>,
    /// The steps of `$1` (a list of run ids).
    pub steps_of: &'static LazyLock<String>,
    /// A listing: `$1` state, `$2` limit.
    pub list: &'static LazyLock<String>,
}

/// This capability's text in `D`'s SQL family.
pub(crate) fn texts<D: Dialect>() -> &'static Texts {
    D::FAMILY.pick(&sqlite::TEXTS, &postgres::TEXTS)
}

/// A fenced write's `$1` (run) .. `$14` (now) of `sql`.
pub fn change_stmt<'a>(sql: &'a str, w: &RunWrite<'a>) -> Stmt<'a> {
    let change = w.change;
    let (set_block, blocked, why) = match change.attention {
        None => (false, None, None),
        Some(None) => (true, None, None),
        Some(Some((step, why))) => (true, Some(step), Some(why)),
    };
    Stmt::new(sql)
        .bind(w.lease.run.as_str())
        .bind(w.lease.fence.0)
        .bind(change.state.map(|s| s.as_str()))
        .bind(change.recovery_point)
        .bind(change.failure.map(|f| f.to_json()))
        .bind(set_block)
        .bind(blocked)
        .bind(why)
        .bind(change.no_return)
        .bind(change.locked_until_ms)
        .bind(change.release)
        .bind(i64::from(change.bump_fence))
        .bind(change.expires_at_ms)
        .bind(w.now_ms)
}

/// The takeover of `id` ([`TAKE_OVER`]).
pub fn take_over_stmt<'a>(id: &'a RunId, t: Takeover<'a>) -> Stmt<'a> {
    Stmt::new(TAKE_OVER.as_str())
        .bind(id.as_str())
        .bind(t.holder)
        .bind(t.now_ms)
        .bind(t.locked_until_ms)
}

/// The claim of the due runs of `operations`, at most `limit` (the
/// dialect's `CLAIM_DUE`).
pub fn claim_due_stmt<'a, D: Dialect>(
    operations: &[Operation],
    t: Takeover<'a>,
    limit: u32,
) -> Stmt<'a> {
    let ops = operations.iter().map(|o| o.as_str().to_owned()).collect();
    Stmt::new(texts::<D>().claim_due.as_str())
        .bind(t.holder)
        .bind(t.now_ms)
        .bind(t.locked_until_ms)
        .texts(ops)
        .bind(i64::from(limit))
}

/// A new run's `$1` (id) .. `$10` (now) of `sql`.
pub fn new_run_stmt<'a>(sql: &'a str, run: &'a NewRun<'a>) -> Stmt<'a> {
    Stmt::new(sql)
        .bind(run.id.as_str())
        .bind(run.scope.tenant.as_str())
        .bind(run.scope.operation.as_str())
        .bind(run.scope.key.as_str())
        .bind(run.input)
        .bind(run.holder)
        .bind(run.locked_until_ms)
        .bind(run.deadline_ms)
        .bind(run.ttl_ms)
        .bind(run.now_ms)
}

/// Reads the steps of `runs` on `conn` and attaches them.
pub async fn steps_of<D: Dialect>(
    conn: &mut <D::Db as sqlx::Database>::Connection,
    runs: &mut [RunRecord],
) -> Result<(), StoreError> {
    if runs.is_empty() {
        return Ok(());
    }
    let ids = runs.iter().map(|r| r.id.as_str().to_owned()).collect();
    let s = Stmt::new(texts::<D>().steps_of.as_str()).texts(ids);
    let rows = D::fetch_all(On::Conn(conn), s).await.map_err(D::map_err)?;
    let steps = rows
        .iter()
        .map(crate::decode::step)
        .collect::<Result<Vec<_>, _>>()?;
    attach_steps(runs, steps);
    Ok(())
}

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        detail: e.to_string(),
    }
}

impl<D: Dialect> RunStore for SqlStore<D> {
    async fn namespace(&self) -> Result<Namespace, StoreError> {
        let d = &self.0;
        // Read first: a read takes no write lock (the caller may hold it).
        let kept = read_row(d, Stmt::new(NAMESPACE), |row| {
            row::get_at::<String, _>(row, 0)
        })
        .await?;
        if let Some(kept) = kept {
            return Namespace::new(kept).map_err(corrupt);
        }
        let drawn = Namespace::generate();
        let draw = Stmt::new(DRAW_NAMESPACE).bind(drawn.as_str());
        let row = d
            .bounded_write(fetch_one::<D>(On::Pool(d.pool()), draw))
            .await?;
        Namespace::new(row::get_at::<String, _>(&row, 0)?).map_err(corrupt)
    }

    async fn create_run(tx: &mut D::Tx, run: &NewRun<'_>) -> Result<Fence, StoreError> {
        D::create_run_here(tx, run).await
    }

    async fn record_run_in(
        tx: &mut D::Tx,
        lease: &Lease,
        change: &RunChange<'_>,
        step: Option<&StepRecord>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let w = RunWrite {
            lease,
            change,
            step,
            now_ms,
        };
        D::record_in(tx, w).await
    }

    async fn record_run(
        &self,
        lease: &Lease,
        change: &RunChange<'_>,
        step: Option<&StepRecord>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let w = RunWrite {
            lease,
            change,
            step,
            now_ms,
        };
        self.0.record_here(w).await
    }

    async fn claim_message(
        tx: &mut D::Tx,
        claim: &MessageClaim<'_>,
    ) -> Result<SentMessage, StoreError> {
        let s = Stmt::new(texts::<D>().claim_message)
            .bind(claim.message_id)
            .bind(claim.run.as_str())
            .bind(claim.step)
            .bind(claim.now_ms)
            .bind(claim.expires_at_ms);
        let row = fetch_one::<D>(On::Conn(&mut **tx), s)
            .await
            .map_err(D::map_err)?;
        crate::decode::message(&row)
    }

    async fn message(&self, message_id: &str) -> Result<Option<SentMessage>, StoreError> {
        let d = &self.0;
        let s = Stmt::new(MESSAGE.as_str()).bind(message_id);
        read_row(d, s, crate::decode::message).await
    }

    async fn take_over(
        &self,
        id: &RunId,
        holder: &str,
        now_ms: i64,
        locked_until_ms: i64,
    ) -> Result<Option<RunRecord>, StoreError> {
        let t = Takeover {
            holder,
            now_ms,
            locked_until_ms,
        };
        self.0.take_over_here(id, t).await
    }

    async fn claim_due(
        &self,
        operations: &[Operation],
        holder: &str,
        now_ms: i64,
        locked_until_ms: i64,
        limit: u32,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let t = Takeover {
            holder,
            now_ms,
            locked_until_ms,
        };
        self.0.claim_due_here(operations, t, limit).await
    }

    /// The run and its steps, on one pooled connection.
    async fn load_run(&self, id: &RunId) -> Result<Option<RunRecord>, StoreError> {
        let d = &self.0;
        d.bounded(async {
            let mut conn = d.pool().acquire().await.map_err(|e| d.map(e))?;
            let s = Stmt::new(LOAD.as_str()).bind(id.as_str());
            let row = D::fetch_optional(On::Conn(&mut *conn), s)
                .await
                .map_err(|e| d.map(e))?;
            let Some(row) = row else { return Ok(None) };
            let mut runs = vec![crate::decode::run(&row)?];
            steps_of::<D>(&mut conn, &mut runs).await?;
            Ok(runs.pop())
        })
        .await
    }

    async fn count_runs(&self) -> Result<Vec<(RunState, u64)>, StoreError> {
        let d = &self.0;
        let counts = read_rows(d, Stmt::new(COUNT), |row| {
            let state: String = row::get_at(row, 0)?;
            let n: i64 = row::get_at(row, 1)?;
            Ok(RunState::parse(&state).zip(u64::try_from(n).ok()))
        })
        .await?;
        Ok(counts.into_iter().flatten().collect())
    }

    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        let d = &self.0;
        let s = Stmt::new(texts::<D>().list.as_str())
            .bind(filter.state.map(|s| s.as_str()))
            .bind(i64::from(filter.limit.clamp(1, 1000)));
        read_rows(d, s, crate::decode::run).await
    }

    async fn purge_runs(&self, now_ms: i64, limit: u32) -> Result<u64, StoreError> {
        crate::purge::purge(&self.0, crate::purge::batches::<D>().runs, now_ms, limit).await
    }

    async fn purge_messages(&self, now_ms: i64, limit: u32) -> Result<u64, StoreError> {
        crate::purge::purge(
            &self.0,
            crate::purge::batches::<D>().messages,
            now_ms,
            limit,
        )
        .await
    }
}
