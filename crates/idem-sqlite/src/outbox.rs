//! The outbox on SQLite: [`enqueue`] in the caller's transaction, and the
//! dispatcher's side as [`OutboxStore`] for [`SqliteStore`].
//!
//! One dispatcher per database file: SQLite has no `SKIP LOCKED`, and one
//! writer at a time anyway. Leases still protect against a dispatcher that
//! died with messages claimed.

use std::time::Duration;

use idem_core::StoreError;
use idem_core::headers;
use idem_core::outbox::{OutboxColumns, OutboxMessage, OutboxRecord, OutboxStats, OutboxStore};
use sqlx::SqliteConnection;

use crate::column;
use crate::{SqliteStore, map_err};

/// Writes `message` to the outbox on `conn`, normally the open transaction of
/// the business write it belongs to (a [`SqliteTx`](crate::SqliteTx) derefs to
/// one). It is published only if that transaction commits. Returns the
/// message's outbox id.
pub async fn enqueue(
    conn: &mut SqliteConnection,
    message: &OutboxMessage,
    now_ms: i64,
) -> Result<i64, StoreError> {
    sqlx::query_scalar(
        "INSERT INTO idem_outbox (message_id, topic, message_key, payload, headers,
                                  created_at_ms, available_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) RETURNING id",
    )
    .bind(message.message_id.as_str())
    .bind(message.topic.as_str())
    .bind(&message.key)
    .bind(&message.payload[..])
    .bind(headers::to_json(&message.headers))
    .bind(now_ms)
    .bind(message.available_at_ms.unwrap_or(now_ms))
    .fetch_one(conn)
    .await
    .map_err(map_err)
}

fn ids_json(ids: &[i64]) -> String {
    serde_json::Value::from(ids).to_string()
}

/// The write side for `idem_outbox::Outbox`: [`enqueue`] on the
/// transaction.
impl idem_core::outbox::OutboxWriter for SqliteStore {
    async fn enqueue(
        &self,
        tx: &mut crate::SqliteTx,
        message: &OutboxMessage,
        now_ms: i64,
    ) -> Result<i64, StoreError> {
        enqueue(tx, message, now_ms).await
    }
}

impl OutboxStore for SqliteStore {
    async fn claim_batch(
        &self,
        now_ms: i64,
        lease: Duration,
        limit: u32,
    ) -> Result<Vec<OutboxRecord>, StoreError> {
        let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
        let rows = sqlx::query(
            "UPDATE idem_outbox SET locked_until_ms = ?1 + ?2
             WHERE id IN (
                 SELECT o.id FROM idem_outbox o
                 WHERE o.state = 'pending' AND o.available_at_ms <= ?1
                   AND (o.locked_until_ms IS NULL OR o.locked_until_ms <= ?1)
                   AND NOT EXISTS (SELECT 1 FROM idem_outbox e
                                   WHERE e.state = 'pending' AND e.message_key = o.message_key
                                     AND e.id < o.id)
                 ORDER BY o.id LIMIT ?3)
             RETURNING id, message_id, topic, message_key, payload, headers, attempts, created_at_ms",
        )
        .bind(now_ms)
        .bind(lease_ms)
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await
        .map_err(|e| self.map(e))?;
        let mut records = rows
            .iter()
            .map(|row| {
                OutboxColumns {
                    id: column(row, "id")?,
                    message_id: column(row, "message_id")?,
                    topic: column(row, "topic")?,
                    message_key: column(row, "message_key")?,
                    payload: column(row, "payload")?,
                    headers: column(row, "headers")?,
                    attempts: column(row, "attempts")?,
                    created_at_ms: column(row, "created_at_ms")?,
                }
                .decode()
            })
            .collect::<Result<Vec<_>, _>>()?;
        // RETURNING does not keep the subquery's order.
        records.sort_by_key(|r| r.id);
        Ok(records)
    }

    async fn mark_sent(&self, ids: &[i64], now_ms: i64) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "UPDATE idem_outbox SET state = 'sent', sent_at_ms = ?2, locked_until_ms = NULL
             WHERE state = 'pending' AND id IN (SELECT value FROM json_each(?1))",
        )
        .bind(ids_json(ids))
        .bind(now_ms)
        .execute(self.pool())
        .await
        .map_err(|e| self.map(e))?;
        Ok(done.rows_affected())
    }

    async fn mark_failed(
        &self,
        id: i64,
        error: &str,
        retry_at_ms: i64,
        dead: bool,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE idem_outbox SET attempts = attempts + 1, last_error = ?2,
                 available_at_ms = ?3, locked_until_ms = NULL,
                 state = CASE WHEN ?4 THEN 'dead' ELSE 'pending' END
             WHERE id = ?1 AND state = 'pending'",
        )
        .bind(id)
        .bind(error)
        .bind(retry_at_ms)
        .bind(dead)
        .execute(self.pool())
        .await
        .map_err(|e| self.map(e))?;
        Ok(())
    }

    async fn release(&self, ids: &[i64], retry_at_ms: i64) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE idem_outbox SET locked_until_ms = NULL, available_at_ms = ?2
             WHERE state = 'pending' AND id IN (SELECT value FROM json_each(?1))",
        )
        .bind(ids_json(ids))
        .bind(retry_at_ms)
        .execute(self.pool())
        .await
        .map_err(|e| self.map(e))?;
        Ok(())
    }

    async fn purge_sent(&self, before_ms: i64, limit: u32) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM idem_outbox WHERE id IN
             (SELECT id FROM idem_outbox WHERE state = 'sent' AND sent_at_ms <= ?1 LIMIT ?2)",
        )
        .bind(before_ms)
        .bind(i64::from(limit))
        .execute(self.pool())
        .await
        .map_err(|e| self.map(e))?;
        Ok(done.rows_affected())
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        let (pending, oldest, dead): (i64, Option<i64>, i64) = sqlx::query_as(
            "SELECT coalesce(sum(state = 'pending'), 0),
                    min(CASE WHEN state = 'pending' THEN created_at_ms END),
                    coalesce(sum(state = 'dead'), 0)
             FROM idem_outbox WHERE state <> 'sent'",
        )
        .fetch_one(self.pool())
        .await
        .map_err(|e| self.map(e))?;
        Ok(OutboxStats {
            pending: pending.max(0) as u64,
            oldest_pending_ms: oldest,
            dead: dead.max(0) as u64,
        })
    }
}
