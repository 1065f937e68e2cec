//! The operator's queries and actions ([`AdminStore`]):
//! the statements, and the store's methods, written once. The listings differ by dialect
//! (PostgreSQL types its NULL tests and orders text by byte, `COLLATE "C"`;
//! its actions lock the row they decide on, `FOR UPDATE`, where SQLite's
//! `BEGIN IMMEDIATE` already holds the write lock): [`sqlite`] and
//! [`postgres`]. The rest is one text.

use std::sync::LazyLock;

use idem_core::admin::{
    OutboxState, ReleaseColumns, ReleaseRow, like_prefix, page, release_decision,
};
use idem_core::steps::RunState;
use idem_core::webhooks::ReceiptState;
use idem_core::{RecordState, StoreError};

use crate::columns::{KEY_COLUMNS, OUTBOX_ENTRY_COLUMNS, RECEIPT_COLUMNS, RUN_COLUMNS};
use crate::decode;
use crate::dialect::{Dialect, On, Stmt, fetch_one, read_row, read_rows};
use crate::keys::scoped;
use crate::row::{self, Columns};
use crate::store::SqlStore;
use idem_core::Scope;
use idem_core::admin::{
    AdminStore, AuditEntry, AuditFilter, InboxEntry, InboxFilter, KeyDetail, KeyFilter, KeyRelease,
    KeySummary, LeaseEnd, NewAudit, OutboxEntry, OutboxFilter, OutboxRequeue, ReceiptFilter,
    ReleaseRequest, RunPageFilter, StateCounts,
};
use idem_core::steps::{RunId, RunRecord};
use idem_core::webhooks::{Receipt, Requeue};

/// A key record as the operator sees it (`$1`..`$3` the scope).
pub static KEY_DETAIL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {KEY_COLUMNS} FROM idem_keys
         WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3"
    )
});

/// A dead message made pending again: `$1` message id, `$2` now.
pub const REQUEUE_OUTBOX: &str = "\
UPDATE idem_outbox SET state = 'pending', attempts = 0, available_at_ms = $2,
    locked_until_ms = NULL
WHERE message_id = $1 AND state = 'dead'";

/// One inbox record: `$1` subscriber, `$2` message id.
pub const INBOX_ENTRY: &str = "\
SELECT subscriber_id, message_id, processed_at_ms, expires_at_ms FROM idem_inbox
WHERE subscriber_id = $1 AND message_id = $2";

/// A failed or dead receipt queued again: `$1` endpoint, `$2` delivery,
/// `$3` now.
pub const REPLAY_RECEIPT: &str = "\
UPDATE idem_webhook_receipts SET state = 'received', attempts = 0,
    available_at_ms = $3, locked_until_ms = NULL, finished_at_ms = NULL
WHERE endpoint = $1 AND delivery_id = $2";

/// An audit entry; answers its id.
pub const INSERT_AUDIT: &str = "\
INSERT INTO idem_admin_audit (at_ms, actor, action, target, detail, idempotency_key)
VALUES ($1, $2, $3, $4, $5, $6) RETURNING id";

/// `SELECT state, count(*)` of each table the overview counts.
pub const STATE_COUNTS: [&str; 3] = [
    "SELECT state, count(*) FROM idem_keys GROUP BY state ORDER BY state",
    "SELECT state, count(*) FROM idem_runs GROUP BY state ORDER BY state",
    "SELECT state, count(*) FROM idem_webhook_receipts GROUP BY state ORDER BY state",
];

/// SQLite's texts: the write lock is the transaction's, `substr` makes a
/// prefix exact (`LIKE` is case-insensitive there), `min` of two values.
pub mod sqlite {
    use super::*;

    /// The key listing (no stored response).
    pub static LIST_KEYS: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {} FROM idem_keys
             WHERE (?1 IS NULL OR tenant_id = ?1) AND (?2 IS NULL OR operation = ?2)
               AND (?3 IS NULL OR (idempotency_key LIKE ?3 ESCAPE '\\'
                    AND substr(idempotency_key, 1, length(?4)) = ?4))
               AND (?5 IS NULL OR state = ?5)
               AND (?6 IS NULL OR (tenant_id, operation, idempotency_key) > (?6, ?7, ?8))
             ORDER BY tenant_id, operation, idempotency_key LIMIT ?9",
            crate::columns::KEY_LIST_COLUMNS
        )
    });

    /// The outbox listing.
    pub static LIST_OUTBOX: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {OUTBOX_ENTRY_COLUMNS} FROM idem_outbox
             WHERE (?1 IS NULL OR state = ?1) AND (?2 IS NULL OR topic = ?2)
               AND (?3 IS NULL OR id < ?3)
             ORDER BY id DESC LIMIT ?4"
        )
    });

    /// The inbox listing.
    pub const LIST_INBOX: &str = "\
SELECT subscriber_id, message_id, processed_at_ms, expires_at_ms FROM idem_inbox
WHERE (?1 IS NULL OR subscriber_id = ?1)
  AND (?2 IS NULL OR (processed_at_ms, subscriber_id, message_id) < (?2, ?3, ?4))
ORDER BY processed_at_ms DESC, subscriber_id DESC, message_id DESC LIMIT ?5";

    /// The receipt listing.
    pub static LIST_RECEIPTS: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {RECEIPT_COLUMNS} FROM idem_webhook_receipts
             WHERE (?1 IS NULL OR endpoint = ?1) AND (?2 IS NULL OR state = ?2)
               AND (?3 IS NULL OR id < ?3)
             ORDER BY id DESC LIMIT ?4"
        )
    });

    /// The run listing.
    pub static LIST_RUNS: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {RUN_COLUMNS} FROM idem_runs
             WHERE (?1 IS NULL OR state = ?1) AND (?2 IS NULL OR operation = ?2)
               AND (?3 IS NULL OR (created_at_ms, id) < (?3, ?4))
             ORDER BY created_at_ms DESC, id DESC LIMIT ?5"
        )
    });

    /// The audit listing.
    pub const LIST_AUDIT: &str = "\
SELECT id, at_ms, actor, action, target, detail, idempotency_key
FROM idem_admin_audit
WHERE (?1 IS NULL OR action = ?1) AND (?2 IS NULL OR id < ?2)
ORDER BY id DESC LIMIT ?3";

    /// [`crate::keys::RELEASE_SELECT`] (the write lock is held).
    pub const RELEASE_SELECT: &str = crate::keys::RELEASE_SELECT;
    /// A message's state, before a requeue.
    pub const OUTBOX_STATE: &str = "SELECT state FROM idem_outbox WHERE message_id = $1";
    /// A receipt's state, before a replay.
    pub const RECEIPT_STATE: &str =
        "SELECT state FROM idem_webhook_receipts WHERE endpoint = $1 AND delivery_id = $2";
    /// A run's state, before its lease is ended.
    pub const RUN_STATE: &str = "SELECT state FROM idem_runs WHERE id = $1";
    /// A run's lease ended now (`$2`) unless it already has.
    pub const END_RUN_LEASE: &str = "\
UPDATE idem_runs SET locked_until_ms = min(locked_until_ms, $2), updated_at_ms = $2
WHERE id = $1";
    /// What the shared code reads.
    pub const TEXTS: Texts = Texts {
        list_keys: &LIST_KEYS,
        list_outbox: &LIST_OUTBOX,
        list_inbox: LIST_INBOX,
        list_receipts: &LIST_RECEIPTS,
        list_runs: &LIST_RUNS,
        list_audit: LIST_AUDIT,
        release_select: || RELEASE_SELECT,
        outbox_state: OUTBOX_STATE,
        receipt_state: RECEIPT_STATE,
        run_state: RUN_STATE,
        end_run_lease: END_RUN_LEASE,
    };
}

/// PostgreSQL's texts: typed NULL tests, byte order (`COLLATE "C"`) for
/// the cursors, row locks on the actions' reads.
pub mod postgres {
    use super::*;

    /// The listed columns: no stored response (typed NULLs, as the decoder
    /// reads them).
    pub const KEY_LIST_COLUMNS: &str = "tenant_id, operation, idempotency_key, request_hash, \
        state, status_code, NULL::text AS response_headers, NULL::bytea AS response_body, \
        resource_type, resource_id, recovery_point, locked_until_ms, \
        lock_token IS NOT NULL AS leased, created_at_ms, updated_at_ms, expires_at_ms, on_unknown";

    /// The key listing (no stored response).
    pub static LIST_KEYS: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {KEY_LIST_COLUMNS} FROM idem_keys
             WHERE ($1::text IS NULL OR tenant_id = $1) AND ($2::text IS NULL OR operation = $2)
               AND ($3::text IS NULL OR (idempotency_key LIKE $3 ESCAPE '\\'
                    AND left(idempotency_key, length($4::text)) = $4))
               AND ($5::text IS NULL OR state = $5)
               AND ($6::text IS NULL OR (tenant_id COLLATE \"C\", operation COLLATE \"C\",
                    idempotency_key COLLATE \"C\") > ($6, $7::text, $8::text))
             ORDER BY tenant_id COLLATE \"C\", operation COLLATE \"C\",
                      idempotency_key COLLATE \"C\" LIMIT $9"
        )
    });

    /// The outbox listing.
    pub static LIST_OUTBOX: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {OUTBOX_ENTRY_COLUMNS} FROM idem_outbox
             WHERE ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR topic = $2)
               AND ($3::bigint IS NULL OR id < $3)
             ORDER BY id DESC LIMIT $4"
        )
    });

    /// The inbox listing.
    pub const LIST_INBOX: &str = "\
SELECT subscriber_id, message_id, processed_at_ms, expires_at_ms FROM idem_inbox
WHERE ($1::text IS NULL OR subscriber_id = $1)
  AND ($2::bigint IS NULL OR (processed_at_ms, subscriber_id COLLATE \"C\",
       message_id COLLATE \"C\") < ($2, $3::text, $4::text))
ORDER BY processed_at_ms DESC, subscriber_id COLLATE \"C\" DESC,
         message_id COLLATE \"C\" DESC LIMIT $5";

    /// The receipt listing.
    pub static LIST_RECEIPTS: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {RECEIPT_COLUMNS} FROM idem_webhook_receipts
             WHERE ($1::text IS NULL OR endpoint = $1) AND ($2::text IS NULL OR state = $2)
               AND ($3::bigint IS NULL OR id < $3)
             ORDER BY id DESC LIMIT $4"
        )
    });

    /// The run listing.
    pub static LIST_RUNS: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {RUN_COLUMNS} FROM idem_runs
             WHERE ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR operation = $2)
               AND ($3::bigint IS NULL OR (created_at_ms, id COLLATE \"C\") < ($3, $4::text))
             ORDER BY created_at_ms DESC, id COLLATE \"C\" DESC LIMIT $5"
        )
    });

    /// The audit listing.
    pub const LIST_AUDIT: &str = "\
SELECT id, at_ms, actor, action, target, detail, idempotency_key
FROM idem_admin_audit
WHERE ($1::text IS NULL OR action = $1) AND ($2::bigint IS NULL OR id < $2)
ORDER BY id DESC LIMIT $3";

    /// [`crate::keys::RELEASE_SELECT`], locking the row.
    pub static RELEASE_SELECT: LazyLock<String> =
        LazyLock::new(|| format!("{} FOR UPDATE", crate::keys::RELEASE_SELECT));
    /// A message's state, locked, before a requeue.
    pub const OUTBOX_STATE: &str = "SELECT state FROM idem_outbox WHERE message_id = $1 FOR UPDATE";
    /// A receipt's state, locked, before a replay.
    pub const RECEIPT_STATE: &str = "SELECT state FROM idem_webhook_receipts \
        WHERE endpoint = $1 AND delivery_id = $2 FOR UPDATE";
    /// A run's state, locked, before its lease is ended.
    pub const RUN_STATE: &str = "SELECT state FROM idem_runs WHERE id = $1 FOR UPDATE";
    /// A run's lease ended now (`$2`) unless it already has.
    pub const END_RUN_LEASE: &str = "\
UPDATE idem_runs SET locked_until_ms = LEAST(locked_until_ms, $2), updated_at_ms = $2
WHERE id = $1";
    /// What the shared code reads.
    pub const TEXTS: Texts = Texts {
        list_keys: &LIST_KEYS,
        list_outbox: &LIST_OUTBOX,
        list_inbox: LIST_INBOX,
        list_receipts: &LIST_RECEIPTS,
        list_runs: &LIST_RUNS,
        list_audit: LIST_AUDIT,
        release_select: || RELEASE_SELECT.as_str(),
        outbox_state: OUTBOX_STATE,
        receipt_state: RECEIPT_STATE,
        run_state: RUN_STATE,
        end_run_lease: END_RUN_LEASE,
    };
}

/// One dialect's admin texts.
#[derive(Debug)]
pub struct Texts {
    /// The key listing (no stored response).
    pub list_keys: &'static LazyLock<String>,
    /// The outbox listing.
    pub list_outbox: &'static LazyLock<String>,
    /// The inbox listing.
    pub list_inbox: &'static str,
    /// The receipt listing.
    pub list_receipts: &'static LazyLock<String>,
    /// The run listing.
    pub list_runs: &'static LazyLock<String>,
    /// The audit listing.
    pub list_audit: &'static str,
    /// The release's read (`ReleaseRow`), with the dialect's row lock.
    pub release_select: fn() -> &'static str,
    /// An outbox message's state, locked.
    pub outbox_state: &'static str,
    /// A receipt's state, locked.
    pub receipt_state: &'static str,
    /// A run's state, locked.
    pub run_state: &'static str,
    /// A run's lease ended.
    pub end_run_lease: &'static str,
}

/// This capability's text in `D`'s SQL family.
pub(crate) fn texts<D: Dialect>() -> &'static Texts {
    D::FAMILY.pick(&sqlite::TEXTS, &postgres::TEXTS)
}

fn counts<R: Columns>(rows: &[R]) -> Result<Vec<(String, u64)>, StoreError> {
    rows.iter()
        .map(|r| {
            let state: String = row::get_at(r, 0)?;
            let n: i64 = row::get_at(r, 1)?;
            Ok((state, u64::try_from(n).unwrap_or(0)))
        })
        .collect()
}

/// The state the row `s` answers on the transaction (its first column),
/// read by `parse`; `what` names it when the text is no state.
async fn state_in<D: Dialect, T>(
    tx: &mut D::Tx,
    s: Stmt<'_>,
    parse: fn(&str) -> Option<T>,
    what: &str,
) -> Result<Option<T>, StoreError> {
    let Some(row) = D::fetch_optional(On::Conn(&mut **tx), s)
        .await
        .map_err(D::map_err)?
    else {
        return Ok(None);
    };
    let text: String = row::get_at(&row, 0)?;
    parse(&text).map(Some).ok_or_else(|| StoreError::Corrupt {
        detail: format!("{what} state {text:?}"),
    })
}

impl<D: Dialect> AdminStore for SqlStore<D> {
    async fn list_keys(&self, f: &KeyFilter) -> Result<Vec<KeySummary>, StoreError> {
        let d = &self.0;
        let (after_t, after_o, after_k) = match &f.after {
            Some((t, o, k)) => (Some(t.as_str()), Some(o.as_str()), Some(k.as_str())),
            None => (None, None, None),
        };
        let s = Stmt::new(texts::<D>().list_keys.as_str())
            .bind(f.tenant.as_ref().map(|t| t.as_str()))
            .bind(f.operation.as_ref().map(|o| o.as_str()))
            .bind(f.prefix.as_deref().map(like_prefix))
            .bind(f.prefix.as_deref())
            .bind(f.state.map(RecordState::as_str))
            .bind(after_t)
            .bind(after_o)
            .bind(after_k)
            .bind(page(f.limit));
        read_rows(d, s, |r| decode::key_detail(r).map(|d| d.summary)).await
    }

    async fn key_detail(&self, scope: &Scope) -> Result<Option<KeyDetail>, StoreError> {
        let d = &self.0;
        read_row(d, scoped(KEY_DETAIL.as_str(), scope), decode::key_detail).await
    }

    /// In the caller's transaction.
    async fn release_key<'a>(
        tx: &'a mut D::Tx,
        scope: &'a Scope,
        request: ReleaseRequest,
        now_ms: i64,
    ) -> Result<KeyRelease, StoreError> {
        let select = scoped((texts::<D>().release_select)(), scope);
        let Some(row) = D::fetch_optional(On::Conn(&mut **tx), select)
            .await
            .map_err(D::map_err)?
        else {
            return Ok(KeyRelease::NotFound);
        };
        let row: ReleaseRow = (
            row::get_at(&row, 0)?,
            row::get_at(&row, 1)?,
            row::get_at(&row, 2)?,
            row::get_at(&row, 3)?,
        );
        let token = match release_decision(ReleaseColumns::from(row), request, now_ms)? {
            Ok(token) => token,
            Err(answer) => return Ok(answer),
        };
        let delete = scoped(crate::keys::RELEASE_DELETE, scope).bind(token);
        let done = D::execute(On::Conn(&mut **tx), delete)
            .await
            .map_err(D::map_err)?;
        Ok(if done == 1 {
            KeyRelease::Released
        } else {
            KeyRelease::NotFound
        })
    }

    /// On one pooled connection.
    async fn state_counts(&self) -> Result<StateCounts, StoreError> {
        let d = &self.0;
        d.bounded(async {
            let mut conn = d.pool().acquire().await.map_err(|e| d.map(e))?;
            let mut out = StateCounts::default();
            let [keys, runs, receipts] = STATE_COUNTS;
            for (statement, into) in [
                (keys, &mut out.keys),
                (runs, &mut out.runs),
                (receipts, &mut out.receipts),
            ] {
                let rows = D::fetch_all(On::Conn(&mut *conn), Stmt::new(statement))
                    .await
                    .map_err(|e| d.map(e))?;
                *into = counts(&rows)?;
            }
            Ok(out)
        })
        .await
    }

    async fn list_outbox(&self, f: &OutboxFilter) -> Result<Vec<OutboxEntry>, StoreError> {
        let d = &self.0;
        let s = Stmt::new(texts::<D>().list_outbox.as_str())
            .bind(f.state.map(OutboxState::as_str))
            .bind(f.topic.as_deref())
            .bind(f.before_id)
            .bind(page(f.limit));
        read_rows(d, s, decode::outbox_entry).await
    }

    /// In the caller's transaction.
    async fn requeue_outbox<'a>(
        tx: &'a mut D::Tx,
        message_id: &'a str,
        now_ms: i64,
    ) -> Result<OutboxRequeue, StoreError> {
        let read = Stmt::new(texts::<D>().outbox_state).bind(message_id);
        let Some(state) = state_in::<D, _>(tx, read, OutboxState::parse, "outbox").await? else {
            return Ok(OutboxRequeue::NotFound);
        };
        if state != OutboxState::Dead {
            return Ok(OutboxRequeue::NotDead(state));
        }
        let requeue = Stmt::new(REQUEUE_OUTBOX).bind(message_id).bind(now_ms);
        D::execute(On::Conn(&mut **tx), requeue)
            .await
            .map_err(D::map_err)?;
        Ok(OutboxRequeue::Requeued)
    }

    async fn inbox_entry(
        &self,
        subscriber: &str,
        message_id: &str,
    ) -> Result<Option<InboxEntry>, StoreError> {
        let d = &self.0;
        let s = Stmt::new(INBOX_ENTRY).bind(subscriber).bind(message_id);
        read_row(d, s, decode::inbox_entry).await
    }

    async fn list_inbox(&self, f: &InboxFilter) -> Result<Vec<InboxEntry>, StoreError> {
        let d = &self.0;
        let (at, sub, msg) = match &f.before {
            Some((at, s, m)) => (Some(*at), Some(s.as_str()), Some(m.as_str())),
            None => (None, None, None),
        };
        let s = Stmt::new(texts::<D>().list_inbox)
            .bind(f.subscriber.as_deref())
            .bind(at)
            .bind(sub)
            .bind(msg)
            .bind(page(f.limit));
        read_rows(d, s, decode::inbox_entry).await
    }

    async fn list_receipts_page(&self, f: &ReceiptFilter) -> Result<Vec<Receipt>, StoreError> {
        let d = &self.0;
        let s = Stmt::new(texts::<D>().list_receipts.as_str())
            .bind(f.endpoint.as_deref())
            .bind(f.state.map(ReceiptState::as_str))
            .bind(f.before_id)
            .bind(page(f.limit));
        read_rows(d, s, decode::receipt).await
    }

    /// In the caller's transaction.
    async fn replay_receipt_in<'a>(
        tx: &'a mut D::Tx,
        endpoint: &'a str,
        delivery_id: &'a str,
        now_ms: i64,
    ) -> Result<Requeue, StoreError> {
        let read = Stmt::new(texts::<D>().receipt_state)
            .bind(endpoint)
            .bind(delivery_id);
        let Some(state) = state_in::<D, _>(tx, read, ReceiptState::parse, "receipt").await? else {
            return Ok(Requeue::NotFound);
        };
        match state {
            ReceiptState::Received => Ok(Requeue::AlreadyQueued),
            ReceiptState::Processed | ReceiptState::Stale => Ok(Requeue::AlreadyFinished(state)),
            ReceiptState::Failed | ReceiptState::Dead => {
                let replay = Stmt::new(REPLAY_RECEIPT)
                    .bind(endpoint)
                    .bind(delivery_id)
                    .bind(now_ms);
                D::execute(On::Conn(&mut **tx), replay)
                    .await
                    .map_err(D::map_err)?;
                Ok(Requeue::Requeued)
            }
        }
    }

    async fn list_runs_page(&self, f: &RunPageFilter) -> Result<Vec<RunRecord>, StoreError> {
        let d = &self.0;
        let (at, id) = match &f.before {
            Some((at, id)) => (Some(*at), Some(id.as_str())),
            None => (None, None),
        };
        let s = Stmt::new(texts::<D>().list_runs.as_str())
            .bind(f.state.map(RunState::as_str))
            .bind(f.operation.as_ref().map(|o| o.as_str()))
            .bind(at)
            .bind(id)
            .bind(page(f.limit));
        read_rows(d, s, decode::run).await
    }

    /// In the caller's transaction.
    async fn end_run_lease<'a>(
        tx: &'a mut D::Tx,
        id: &'a RunId,
        now_ms: i64,
    ) -> Result<LeaseEnd, StoreError> {
        let read = Stmt::new(texts::<D>().run_state).bind(id.as_str());
        let Some(state) = state_in::<D, _>(tx, read, RunState::parse, "run").await? else {
            return Ok(LeaseEnd::NotFound);
        };
        if state == RunState::NeedsAttention {
            return Ok(LeaseEnd::NeedsAttention);
        }
        if !state.is_live() {
            return Ok(LeaseEnd::Final(state));
        }
        let end = Stmt::new(texts::<D>().end_run_lease)
            .bind(id.as_str())
            .bind(now_ms);
        D::execute(On::Conn(&mut **tx), end)
            .await
            .map_err(D::map_err)?;
        Ok(LeaseEnd::Ended)
    }

    /// In the caller's transaction: the entry's id.
    async fn insert_audit<'a>(tx: &'a mut D::Tx, e: &'a NewAudit<'a>) -> Result<i64, StoreError> {
        let s = Stmt::new(INSERT_AUDIT)
            .bind(e.at_ms)
            .bind(e.actor)
            .bind(e.action)
            .bind(e.target)
            .bind(e.detail)
            .bind(e.idempotency_key);
        let row = fetch_one::<D>(On::Conn(&mut **tx), s)
            .await
            .map_err(D::map_err)?;
        row::get_at(&row, 0)
    }

    async fn list_audit(&self, f: &AuditFilter) -> Result<Vec<AuditEntry>, StoreError> {
        let d = &self.0;
        let s = Stmt::new(texts::<D>().list_audit)
            .bind(f.action.as_deref())
            .bind(f.before_id)
            .bind(page(f.limit));
        read_rows(d, s, decode::audit_entry).await
    }
}
