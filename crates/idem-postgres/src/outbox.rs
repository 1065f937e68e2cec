//! The outbox on PostgreSQL: [`enqueue`] in the caller's transaction, and the
//! dispatcher's side as [`OutboxStore`] for [`PgStore`].
//!
//! Several dispatchers may share one database: claims take rows with
//! `FOR UPDATE SKIP LOCKED` and lease them; a message is never claimed while an
//! earlier message with the same key is pending, so a key's messages are
//! published in write order whichever dispatcher holds them. Each enqueue
//! sends `NOTIFY idem_outbox` (delivered at commit) as a wake-up hint.

use std::time::Duration;

use idem_core::StoreError;
use idem_core::headers;
use idem_core::outbox::{OutboxColumns, OutboxMessage, OutboxRecord, OutboxStats, OutboxStore};
use sqlx::PgConnection;
use sqlx::postgres::PgListener;

use crate::column;
use crate::{PgStore, map_err};

/// The notification channel enqueues signal.
pub const CHANNEL: &str = "idem_outbox";

/// Writes `message` to the outbox on `conn`, normally the open transaction of
/// the business write it belongs to (a [`PgTx`](crate::PgTx) derefs to one).
/// It is published only if that transaction commits. One round trip, the
/// wake-up notification included. Returns the message's outbox id.
pub async fn enqueue(
    conn: &mut PgConnection,
    message: &OutboxMessage,
    now_ms: i64,
) -> Result<i64, StoreError> {
    sqlx::query_scalar(
        "WITH ins AS (
             INSERT INTO idem_outbox (message_id, topic, message_key, payload, headers,
                                      created_at_ms, available_at_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id)
         SELECT id, pg_notify('idem_outbox', '')::text FROM ins",
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

/// Wakes a dispatcher when messages are written (a hint: notifications can be
/// missed across reconnects, so the dispatcher also polls).
pub struct OutboxListener(Option<PgListener>);

impl std::fmt::Debug for OutboxListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("OutboxListener").finish_non_exhaustive()
    }
}

impl idem_core::outbox::Wake for OutboxListener {
    /// Waits for a notification, at most `max`.
    ///
    /// # Cancel safety
    /// Cancel safe: a notification not yet received stays queued.
    async fn wait(&mut self, max: Duration) {
        let Some(listener) = self.0.as_mut() else {
            tokio::time::sleep(max).await;
            return;
        };
        match tokio::time::timeout(max, listener.recv()).await {
            Ok(Ok(_)) | Err(_) => {}
            Ok(Err(e)) => {
                // The connection broke; sqlx reconnects on the next call.
                // Until then this is plain polling.
                tracing::debug!(
                    error = &e as &dyn std::error::Error,
                    "outbox listener lost its connection"
                );
                tokio::time::sleep(max).await;
            }
        }
    }
}

impl PgStore {
    /// A listener on [`CHANNEL`]. When it cannot connect, it degrades to
    /// sleeping (the dispatcher polls either way).
    pub async fn outbox_listener(&self) -> OutboxListener {
        let listener = async {
            let mut l = PgListener::connect_with(self.pool()).await?;
            l.listen(CHANNEL).await?;
            Ok::<_, sqlx::Error>(l)
        }
        .await;
        match listener {
            Ok(l) => OutboxListener(Some(l)),
            Err(e) => {
                tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "outbox listener unavailable; polling only"
                );
                OutboxListener(None)
            }
        }
    }
}

/// The write side for `idem_outbox::Outbox`: [`enqueue`] on the
/// transaction.
impl idem_core::outbox::OutboxWriter for PgStore {
    async fn enqueue(
        &self,
        tx: &mut crate::PgTx,
        message: &OutboxMessage,
        now_ms: i64,
    ) -> Result<i64, StoreError> {
        enqueue(tx, message, now_ms).await
    }
}

impl OutboxStore for PgStore {
    async fn claim_batch(
        &self,
        now_ms: i64,
        lease: Duration,
        limit: u32,
    ) -> Result<Vec<OutboxRecord>, StoreError> {
        self.bounded(async {
            let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
            let rows = sqlx::query(
                "UPDATE idem_outbox SET locked_until_ms = $1 + $2
                 WHERE id = ANY(ARRAY(
                     SELECT o.id FROM idem_outbox o
                     WHERE o.state = 'pending' AND o.available_at_ms <= $1
                       AND (o.locked_until_ms IS NULL OR o.locked_until_ms <= $1)
                       AND NOT EXISTS (SELECT 1 FROM idem_outbox e
                                       WHERE e.state = 'pending' AND e.message_key = o.message_key
                                         AND e.id < o.id)
                     ORDER BY o.id LIMIT $3
                     FOR UPDATE SKIP LOCKED))
                 RETURNING id, message_id, topic, message_key, payload, headers, attempts, created_at_ms",
            )
            .bind(now_ms)
            .bind(lease_ms)
            .bind(i64::from(limit))
            .fetch_all(self.pool())
            .await
            .map_err(map_err)?;
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
                        attempts: i64::from(column::<i32>(row, "attempts")?),
                        created_at_ms: column(row, "created_at_ms")?,
                    }
                    .decode()
                })
                .collect::<Result<Vec<_>, _>>()?;
            records.sort_by_key(|r| r.id);
            Ok(records)
        })
        .await
    }

    async fn mark_sent(&self, ids: &[i64], now_ms: i64) -> Result<u64, StoreError> {
        self.bounded(async {
            let done = sqlx::query(
                "UPDATE idem_outbox SET state = 'sent', sent_at_ms = $2, locked_until_ms = NULL
                 WHERE state = 'pending' AND id = ANY($1)",
            )
            .bind(ids)
            .bind(now_ms)
            .execute(self.pool())
            .await
            .map_err(map_err)?;
            Ok(done.rows_affected())
        })
        .await
    }

    async fn mark_failed(
        &self,
        id: i64,
        error: &str,
        retry_at_ms: i64,
        dead: bool,
    ) -> Result<(), StoreError> {
        self.bounded(async {
            sqlx::query(
                "UPDATE idem_outbox SET attempts = attempts + 1, last_error = $2,
                     available_at_ms = $3, locked_until_ms = NULL,
                     state = CASE WHEN $4 THEN 'dead' ELSE 'pending' END
                 WHERE id = $1 AND state = 'pending'",
            )
            .bind(id)
            .bind(error)
            .bind(retry_at_ms)
            .bind(dead)
            .execute(self.pool())
            .await
            .map_err(map_err)?;
            Ok(())
        })
        .await
    }

    async fn release(&self, ids: &[i64], retry_at_ms: i64) -> Result<(), StoreError> {
        self.bounded(async {
            sqlx::query(
                "UPDATE idem_outbox SET locked_until_ms = NULL, available_at_ms = $2
                 WHERE state = 'pending' AND id = ANY($1)",
            )
            .bind(ids)
            .bind(retry_at_ms)
            .execute(self.pool())
            .await
            .map_err(map_err)?;
            Ok(())
        })
        .await
    }

    async fn purge_sent(&self, before_ms: i64, limit: u32) -> Result<u64, StoreError> {
        self.bounded(async {
            let done = sqlx::query(
                "DELETE FROM idem_outbox WHERE id = ANY(ARRAY(
                     SELECT id FROM idem_outbox WHERE state = 'sent' AND sent_at_ms <= $1
                     LIMIT $2 FOR UPDATE SKIP LOCKED))",
            )
            .bind(before_ms)
            .bind(i64::from(limit))
            .execute(self.pool())
            .await
            .map_err(map_err)?;
            Ok(done.rows_affected())
        })
        .await
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        self.bounded(async {
            let (pending, oldest, dead): (i64, Option<i64>, i64) = sqlx::query_as(
                "SELECT count(*) FILTER (WHERE state = 'pending'),
                        min(created_at_ms) FILTER (WHERE state = 'pending'),
                        count(*) FILTER (WHERE state = 'dead')
                 FROM idem_outbox WHERE state <> 'sent'",
            )
            .fetch_one(self.pool())
            .await
            .map_err(map_err)?;
            Ok(OutboxStats {
                pending: pending.max(0) as u64,
                oldest_pending_ms: oldest,
                dead: dead.max(0) as u64,
            })
        })
        .await
    }
}
