//! The operator's queries and actions on SQLite: [`AdminStore`] for
//! [`SqliteStore`]. Actions run in the caller's `BEGIN IMMEDIATE`
//! transaction, so nothing changes between their read and their write.

use idem_core::admin::{
    AdminStore, AuditEntry, AuditFilter, InboxEntry, InboxFilter, KeyColumns, KeyDetail, KeyFilter,
    KeyRelease, KeySummary, LeaseEnd, NewAudit, OutboxEntry, OutboxEntryColumns, OutboxFilter,
    OutboxRequeue, OutboxState, ReceiptFilter, ReleaseColumns, ReleaseRequest, ReleaseRow,
    RunPageFilter, StateCounts, like_prefix, page, release_decision,
};
use idem_core::steps::{RunId, RunRecord, RunState};
use idem_core::webhooks::{Receipt, ReceiptState, Requeue};
use idem_core::{RecordState, Scope, StoreError};
use idem_sql::columns::{KEY_COLUMNS, KEY_LIST_COLUMNS, OUTBOX_ENTRY_COLUMNS, RUN_COLUMNS};
use idem_sql::keys::{RELEASE_DELETE, RELEASE_SELECT};
use sqlx::sqlite::SqliteRow;

use crate::{SqliteStore, SqliteTx, column, map_err};

fn decode_key(row: &SqliteRow) -> Result<KeyDetail, StoreError> {
    KeyColumns {
        tenant: column(row, "tenant_id")?,
        operation: column(row, "operation")?,
        key: column(row, "idempotency_key")?,
        record: crate::record_columns(row)?,
        recovery_point: column(row, "recovery_point")?,
        leased: column(row, "leased")?,
        updated_at_ms: column(row, "updated_at_ms")?,
    }
    .decode()
}

fn decode_outbox(row: &SqliteRow) -> Result<OutboxEntry, StoreError> {
    OutboxEntryColumns {
        id: column(row, "id")?,
        message_id: column(row, "message_id")?,
        topic: column(row, "topic")?,
        message_key: column(row, "message_key")?,
        state: column(row, "state")?,
        attempts: column(row, "attempts")?,
        last_error: column(row, "last_error")?,
        created_at_ms: column(row, "created_at_ms")?,
        available_at_ms: column(row, "available_at_ms")?,
        sent_at_ms: column(row, "sent_at_ms")?,
        payload: column(row, "payload")?,
        headers: column(row, "headers")?,
    }
    .decode()
}

fn decode_inbox(row: &SqliteRow) -> Result<InboxEntry, StoreError> {
    Ok(InboxEntry {
        subscriber: column(row, "subscriber_id")?,
        message_id: column(row, "message_id")?,
        processed_at_ms: column(row, "processed_at_ms")?,
        expires_at_ms: column(row, "expires_at_ms")?,
    })
}

fn decode_audit(row: &SqliteRow) -> Result<AuditEntry, StoreError> {
    Ok(AuditEntry {
        id: column(row, "id")?,
        at_ms: column(row, "at_ms")?,
        actor: column(row, "actor")?,
        action: column(row, "action")?,
        target: column(row, "target")?,
        detail: column(row, "detail")?,
        idempotency_key: column(row, "idempotency_key")?,
    })
}

fn counts(rows: Vec<(String, i64)>) -> Vec<(String, u64)> {
    rows.into_iter()
        .map(|(s, n)| (s, u64::try_from(n).unwrap_or(0)))
        .collect()
}

impl AdminStore for SqliteStore {
    async fn list_keys(&self, f: &KeyFilter) -> Result<Vec<KeySummary>, StoreError> {
        let (after_t, after_o, after_k) = match &f.after {
            Some((t, o, k)) => (Some(t.as_str()), Some(o.as_str()), Some(k.as_str())),
            None => (None, None, None),
        };
        // LIKE is case-insensitive on SQLite: the substr comparison makes
        // the prefix exact, LIKE narrows the scan.
        let rows = sqlx::query(&format!(
            "SELECT {KEY_LIST_COLUMNS} FROM idem_keys
             WHERE (?1 IS NULL OR tenant_id = ?1) AND (?2 IS NULL OR operation = ?2)
               AND (?3 IS NULL OR (idempotency_key LIKE ?3 ESCAPE '\\'
                    AND substr(idempotency_key, 1, length(?4)) = ?4))
               AND (?5 IS NULL OR state = ?5)
               AND (?6 IS NULL OR (tenant_id, operation, idempotency_key) > (?6, ?7, ?8))
             ORDER BY tenant_id, operation, idempotency_key LIMIT ?9"
        ))
        .bind(f.tenant.as_ref().map(|t| t.as_str()))
        .bind(f.operation.as_ref().map(|o| o.as_str()))
        .bind(f.prefix.as_deref().map(like_prefix))
        .bind(f.prefix.as_deref())
        .bind(f.state.map(RecordState::as_str))
        .bind(after_t)
        .bind(after_o)
        .bind(after_k)
        .bind(page(f.limit))
        .fetch_all(self.pool())
        .await
        .map_err(|e| self.map(e))?;
        rows.iter()
            .map(|r| decode_key(r).map(|d| d.summary))
            .collect()
    }

    async fn key_detail(&self, scope: &Scope) -> Result<Option<KeyDetail>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {KEY_COLUMNS} FROM idem_keys
             WHERE tenant_id = ?1 AND operation = ?2 AND idempotency_key = ?3"
        ))
        .bind(scope.tenant.as_str())
        .bind(scope.operation.as_str())
        .bind(scope.key.as_str())
        .fetch_optional(self.pool())
        .await
        .map_err(|e| self.map(e))?;
        row.as_ref().map(decode_key).transpose()
    }

    async fn release_key<'a>(
        tx: &'a mut SqliteTx,
        scope: &'a Scope,
        request: ReleaseRequest,
        now_ms: i64,
    ) -> Result<KeyRelease, StoreError> {
        let row: Option<ReleaseRow> = sqlx::query_as(RELEASE_SELECT)
            .bind(scope.tenant.as_str())
            .bind(scope.operation.as_str())
            .bind(scope.key.as_str())
            .fetch_optional(&mut **tx)
            .await
            .map_err(map_err)?;
        let Some(row) = row else {
            return Ok(KeyRelease::NotFound);
        };
        let cols = ReleaseColumns::from(row);
        let token = match release_decision(cols, request, now_ms)? {
            Ok(token) => token,
            Err(answer) => return Ok(answer),
        };
        let done = sqlx::query(RELEASE_DELETE)
            .bind(scope.tenant.as_str())
            .bind(scope.operation.as_str())
            .bind(scope.key.as_str())
            .bind(token)
            .execute(&mut **tx)
            .await
            .map_err(map_err)?;
        Ok(if done.rows_affected() == 1 {
            KeyRelease::Released
        } else {
            KeyRelease::NotFound
        })
    }

    async fn state_counts(&self) -> Result<StateCounts, StoreError> {
        let mut conn = self.pool().acquire().await.map_err(|e| self.map(e))?;
        let mut out = StateCounts::default();
        for (table, into) in [
            ("idem_keys", &mut out.keys),
            ("idem_runs", &mut out.runs),
            ("idem_webhook_receipts", &mut out.receipts),
        ] {
            let rows: Vec<(String, i64)> = sqlx::query_as(&format!(
                "SELECT state, count(*) FROM {table} GROUP BY state ORDER BY state"
            ))
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| self.map(e))?;
            *into = counts(rows);
        }
        Ok(out)
    }

    async fn list_outbox(&self, f: &OutboxFilter) -> Result<Vec<OutboxEntry>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {OUTBOX_ENTRY_COLUMNS} FROM idem_outbox
             WHERE (?1 IS NULL OR state = ?1) AND (?2 IS NULL OR topic = ?2)
               AND (?3 IS NULL OR id < ?3)
             ORDER BY id DESC LIMIT ?4"
        ))
        .bind(f.state.map(OutboxState::as_str))
        .bind(f.topic.as_deref())
        .bind(f.before_id)
        .bind(page(f.limit))
        .fetch_all(self.pool())
        .await
        .map_err(|e| self.map(e))?;
        rows.iter().map(decode_outbox).collect()
    }

    async fn requeue_outbox<'a>(
        tx: &'a mut SqliteTx,
        message_id: &'a str,
        now_ms: i64,
    ) -> Result<OutboxRequeue, StoreError> {
        let state: Option<String> =
            sqlx::query_scalar("SELECT state FROM idem_outbox WHERE message_id = ?1")
                .bind(message_id)
                .fetch_optional(&mut **tx)
                .await
                .map_err(map_err)?;
        let Some(state) = state else {
            return Ok(OutboxRequeue::NotFound);
        };
        let state = OutboxState::parse(&state).ok_or_else(|| StoreError::Corrupt {
            detail: format!("outbox state {state:?}"),
        })?;
        if state != OutboxState::Dead {
            return Ok(OutboxRequeue::NotDead(state));
        }
        sqlx::query(
            "UPDATE idem_outbox SET state = 'pending', attempts = 0, available_at_ms = ?2,
                 locked_until_ms = NULL
             WHERE message_id = ?1 AND state = 'dead'",
        )
        .bind(message_id)
        .bind(now_ms)
        .execute(&mut **tx)
        .await
        .map_err(map_err)?;
        Ok(OutboxRequeue::Requeued)
    }

    async fn inbox_entry(
        &self,
        subscriber: &str,
        message_id: &str,
    ) -> Result<Option<InboxEntry>, StoreError> {
        let row = sqlx::query(
            "SELECT subscriber_id, message_id, processed_at_ms, expires_at_ms FROM idem_inbox
             WHERE subscriber_id = ?1 AND message_id = ?2",
        )
        .bind(subscriber)
        .bind(message_id)
        .fetch_optional(self.pool())
        .await
        .map_err(|e| self.map(e))?;
        row.as_ref().map(decode_inbox).transpose()
    }

    async fn list_inbox(&self, f: &InboxFilter) -> Result<Vec<InboxEntry>, StoreError> {
        let (at, sub, msg) = match &f.before {
            Some((at, s, m)) => (Some(*at), Some(s.as_str()), Some(m.as_str())),
            None => (None, None, None),
        };
        let rows = sqlx::query(
            "SELECT subscriber_id, message_id, processed_at_ms, expires_at_ms FROM idem_inbox
             WHERE (?1 IS NULL OR subscriber_id = ?1)
               AND (?2 IS NULL OR (processed_at_ms, subscriber_id, message_id) < (?2, ?3, ?4))
             ORDER BY processed_at_ms DESC, subscriber_id DESC, message_id DESC LIMIT ?5",
        )
        .bind(f.subscriber.as_deref())
        .bind(at)
        .bind(sub)
        .bind(msg)
        .bind(page(f.limit))
        .fetch_all(self.pool())
        .await
        .map_err(|e| self.map(e))?;
        rows.iter().map(decode_inbox).collect()
    }

    async fn list_receipts_page(&self, f: &ReceiptFilter) -> Result<Vec<Receipt>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {} FROM idem_webhook_receipts
             WHERE (?1 IS NULL OR endpoint = ?1) AND (?2 IS NULL OR state = ?2)
               AND (?3 IS NULL OR id < ?3)
             ORDER BY id DESC LIMIT ?4",
            crate::webhooks::COLUMNS
        ))
        .bind(f.endpoint.as_deref())
        .bind(f.state.map(ReceiptState::as_str))
        .bind(f.before_id)
        .bind(page(f.limit))
        .fetch_all(self.pool())
        .await
        .map_err(|e| self.map(e))?;
        rows.iter().map(crate::webhooks::decode).collect()
    }

    async fn replay_receipt_in<'a>(
        tx: &'a mut SqliteTx,
        endpoint: &'a str,
        delivery_id: &'a str,
        now_ms: i64,
    ) -> Result<Requeue, StoreError> {
        let state: Option<String> = sqlx::query_scalar(
            "SELECT state FROM idem_webhook_receipts WHERE endpoint = ?1 AND delivery_id = ?2",
        )
        .bind(endpoint)
        .bind(delivery_id)
        .fetch_optional(&mut **tx)
        .await
        .map_err(map_err)?;
        let Some(state) = state else {
            return Ok(Requeue::NotFound);
        };
        let state = ReceiptState::parse(&state).ok_or_else(|| StoreError::Corrupt {
            detail: format!("receipt state {state:?}"),
        })?;
        match state {
            ReceiptState::Received => Ok(Requeue::AlreadyQueued),
            ReceiptState::Processed | ReceiptState::Stale => Ok(Requeue::AlreadyFinished(state)),
            ReceiptState::Failed | ReceiptState::Dead => {
                sqlx::query(
                    "UPDATE idem_webhook_receipts SET state = 'received', attempts = 0,
                         available_at_ms = ?3, locked_until_ms = NULL, finished_at_ms = NULL
                     WHERE endpoint = ?1 AND delivery_id = ?2",
                )
                .bind(endpoint)
                .bind(delivery_id)
                .bind(now_ms)
                .execute(&mut **tx)
                .await
                .map_err(map_err)?;
                Ok(Requeue::Requeued)
            }
        }
    }

    async fn list_runs_page(&self, f: &RunPageFilter) -> Result<Vec<RunRecord>, StoreError> {
        let (at, id) = match &f.before {
            Some((at, id)) => (Some(*at), Some(id.as_str())),
            None => (None, None),
        };
        let rows = sqlx::query(&format!(
            "SELECT {RUN_COLUMNS} FROM idem_runs
             WHERE (?1 IS NULL OR state = ?1) AND (?2 IS NULL OR operation = ?2)
               AND (?3 IS NULL OR (created_at_ms, id) < (?3, ?4))
             ORDER BY created_at_ms DESC, id DESC LIMIT ?5"
        ))
        .bind(f.state.map(RunState::as_str))
        .bind(f.operation.as_ref().map(|o| o.as_str()))
        .bind(at)
        .bind(id)
        .bind(page(f.limit))
        .fetch_all(self.pool())
        .await
        .map_err(|e| self.map(e))?;
        rows.iter().map(crate::runs::decode_run).collect()
    }

    async fn end_run_lease<'a>(
        tx: &'a mut SqliteTx,
        id: &'a RunId,
        now_ms: i64,
    ) -> Result<LeaseEnd, StoreError> {
        let state: Option<String> = sqlx::query_scalar("SELECT state FROM idem_runs WHERE id = ?1")
            .bind(id.as_str())
            .fetch_optional(&mut **tx)
            .await
            .map_err(map_err)?;
        let Some(state) = state else {
            return Ok(LeaseEnd::NotFound);
        };
        let state = RunState::parse(&state).ok_or_else(|| StoreError::Corrupt {
            detail: format!("run state {state:?}"),
        })?;
        if state == RunState::NeedsAttention {
            return Ok(LeaseEnd::NeedsAttention);
        }
        if !state.is_live() {
            return Ok(LeaseEnd::Final(state));
        }
        sqlx::query(
            "UPDATE idem_runs SET locked_until_ms = min(locked_until_ms, ?2), updated_at_ms = ?2
             WHERE id = ?1",
        )
        .bind(id.as_str())
        .bind(now_ms)
        .execute(&mut **tx)
        .await
        .map_err(map_err)?;
        Ok(LeaseEnd::Ended)
    }

    async fn insert_audit<'a>(
        tx: &'a mut SqliteTx,
        e: &'a NewAudit<'a>,
    ) -> Result<i64, StoreError> {
        sqlx::query_scalar(
            "INSERT INTO idem_admin_audit (at_ms, actor, action, target, detail, idempotency_key)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) RETURNING id",
        )
        .bind(e.at_ms)
        .bind(e.actor)
        .bind(e.action)
        .bind(e.target)
        .bind(e.detail)
        .bind(e.idempotency_key)
        .fetch_one(&mut **tx)
        .await
        .map_err(map_err)
    }

    async fn list_audit(&self, f: &AuditFilter) -> Result<Vec<AuditEntry>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, at_ms, actor, action, target, detail, idempotency_key
             FROM idem_admin_audit
             WHERE (?1 IS NULL OR action = ?1) AND (?2 IS NULL OR id < ?2)
             ORDER BY id DESC LIMIT ?3",
        )
        .bind(f.action.as_deref())
        .bind(f.before_id)
        .bind(page(f.limit))
        .fetch_all(self.pool())
        .await
        .map_err(|e| self.map(e))?;
        rows.iter().map(decode_audit).collect()
    }
}
