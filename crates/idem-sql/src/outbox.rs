//! The outbox: the statements of the write side and of the dispatcher
//! ([`OutboxStore`](idem_core::outbox::OutboxStore)), and
//! [`outbox_store!`](crate::outbox_store). The claim (PostgreSQL skips
//! rows another dispatcher holds), the id lists (a JSON array on SQLite, an
//! array on PostgreSQL), the statistics and the enqueue (PostgreSQL's
//! notifies) differ by dialect.

/// A failed attempt: `$1` id, `$2` error, `$3` next attempt, `$4` dead.
pub const MARK_FAILED: &str = "\
UPDATE idem_outbox SET attempts = attempts + 1, last_error = $2,
    available_at_ms = $3, locked_until_ms = NULL,
    state = CASE WHEN $4 THEN 'dead' ELSE 'pending' END
WHERE id = $1 AND state = 'pending'";

/// The columns a claim returns, as the decoder reads them.
macro_rules! claimed {
    () => {
        "RETURNING id, message_id, topic, message_key, payload, headers, attempts, created_at_ms"
    };
}

/// SQLite's texts.
pub mod sqlite {
    /// `$1`..`$7`: message id, topic, key, payload, headers, now, due.
    pub const ENQUEUE: &str = "\
INSERT INTO idem_outbox (message_id, topic, message_key, payload, headers,
                         created_at_ms, available_at_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id";

    /// Leases the due messages (`$1` now, `$2` lease, `$3` limit) whose key
    /// has no earlier pending message.
    pub const CLAIM: &str = concat!(
        "UPDATE idem_outbox SET locked_until_ms = $1 + $2
         WHERE id IN (
             SELECT o.id FROM idem_outbox o
             WHERE o.state = 'pending' AND o.available_at_ms <= $1
               AND (o.locked_until_ms IS NULL OR o.locked_until_ms <= $1)
               AND NOT EXISTS (SELECT 1 FROM idem_outbox e
                               WHERE e.state = 'pending' AND e.message_key = o.message_key
                                 AND e.id < o.id)
             ORDER BY o.id LIMIT $3)
         ",
        claimed!()
    );

    /// `$1` the ids (a JSON array), `$2` now.
    pub const MARK_SENT: &str = "\
UPDATE idem_outbox SET state = 'sent', sent_at_ms = $2, locked_until_ms = NULL
WHERE state = 'pending' AND id IN (SELECT value FROM json_each($1))";

    /// `$1` the ids (a JSON array), `$2` next attempt.
    pub const RELEASE: &str = "\
UPDATE idem_outbox SET locked_until_ms = NULL, available_at_ms = $2
WHERE state = 'pending' AND id IN (SELECT value FROM json_each($1))";

    /// Pending, oldest pending, dead.
    pub const STATS: &str = "\
SELECT coalesce(sum(state = 'pending'), 0),
       min(CASE WHEN state = 'pending' THEN created_at_ms END),
       coalesce(sum(state = 'dead'), 0)
FROM idem_outbox WHERE state <> 'sent'";
}

/// PostgreSQL's texts.
pub mod postgres {
    /// `$1`..`$7` as SQLite's; one round trip, the wake-up notification
    /// (delivered at commit) included.
    pub const ENQUEUE: &str = "\
WITH ins AS (
    INSERT INTO idem_outbox (message_id, topic, message_key, payload, headers,
                             created_at_ms, available_at_ms)
    VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id)
SELECT id, pg_notify('idem_outbox', '')::text FROM ins";

    /// As SQLite's, skipping rows another dispatcher holds.
    pub const CLAIM: &str = concat!(
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
         ",
        claimed!()
    );

    /// `$1` the ids (an array), `$2` now.
    pub const MARK_SENT: &str = "\
UPDATE idem_outbox SET state = 'sent', sent_at_ms = $2, locked_until_ms = NULL
WHERE state = 'pending' AND id = ANY($1)";

    /// `$1` the ids (an array), `$2` next attempt.
    pub const RELEASE: &str = "\
UPDATE idem_outbox SET locked_until_ms = NULL, available_at_ms = $2
WHERE state = 'pending' AND id = ANY($1)";

    /// Pending, oldest pending, dead.
    pub const STATS: &str = "\
SELECT count(*) FILTER (WHERE state = 'pending'),
       min(created_at_ms) FILTER (WHERE state = 'pending'),
       count(*) FILTER (WHERE state = 'dead')
FROM idem_outbox WHERE state <> 'sent'";
}

/// Defines the backend's `enqueue(conn, message, now_ms)` (documented at the
/// call site) and implements `OutboxWriter` and
/// [`OutboxStore`](idem_core::outbox::OutboxStore) for its store:
/// `outbox_store!(Store, Tx, Connection, dialect)`. The crate provides
/// `id_list(&[i64])`, the ids as its dialect binds a list.
#[macro_export]
macro_rules! outbox_store {
    ($(#[$doc:meta])* $store:ty, $tx:ty, $conn:ty, $d:ident) => {
        $(#[$doc])*
        pub async fn enqueue(
            conn: &mut $conn,
            message: &idem_core::outbox::OutboxMessage,
            now_ms: i64,
        ) -> Result<i64, idem_core::StoreError> {
            sqlx::query_scalar($crate::outbox::$d::ENQUEUE)
                .bind(message.message_id.as_str())
                .bind(message.topic.as_str())
                .bind(&message.key)
                .bind(&message.payload[..])
                .bind(idem_core::headers::to_json(&message.headers))
                .bind(now_ms)
                .bind(message.available_at_ms.unwrap_or(now_ms))
                .fetch_one(conn)
                .await
                .map_err(map_err)
        }

        const _: () = {
            use std::time::Duration;

            use idem_core::StoreError;
            use idem_core::outbox::{OutboxMessage, OutboxRecord, OutboxStats, OutboxStore};
            use $crate::outbox::$d as sql;

            /// The write side for `idem_outbox::Outbox`: [`enqueue`] on the
            /// transaction.
            impl idem_core::outbox::OutboxWriter for $store {
                async fn enqueue(
                    &self,
                    tx: &mut $tx,
                    message: &OutboxMessage,
                    now_ms: i64,
                ) -> Result<i64, StoreError> {
                    enqueue(tx, message, now_ms).await
                }
            }

            impl OutboxStore for $store {
                async fn claim_batch(
                    &self,
                    now_ms: i64,
                    lease: Duration,
                    limit: u32,
                ) -> Result<Vec<OutboxRecord>, StoreError> {
                    self.bounded(async {
                        let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
                        let rows = sqlx::query(sql::CLAIM)
                            .bind(now_ms)
                            .bind(lease_ms)
                            .bind(i64::from(limit))
                            .fetch_all(self.pool())
                            .await
                            .map_err(|e| self.map(e))?;
                        let mut records = rows
                            .iter()
                            .map($crate::decode::outbox_record)
                            .collect::<Result<Vec<_>, _>>()?;
                        // RETURNING does not keep the subquery's order.
                        records.sort_by_key(|r| r.id);
                        Ok(records)
                    })
                    .await
                }

                async fn mark_sent(&self, ids: &[i64], now_ms: i64) -> Result<u64, StoreError> {
                    self.bounded(async {
                        let done = sqlx::query(sql::MARK_SENT)
                            .bind(id_list(ids))
                            .bind(now_ms)
                            .execute(self.pool())
                            .await
                            .map_err(|e| self.map(e))?;
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
                        sqlx::query($crate::outbox::MARK_FAILED)
                            .bind(id)
                            .bind(error)
                            .bind(retry_at_ms)
                            .bind(dead)
                            .execute(self.pool())
                            .await
                            .map_err(|e| self.map(e))?;
                        Ok(())
                    })
                    .await
                }

                async fn release(&self, ids: &[i64], retry_at_ms: i64) -> Result<(), StoreError> {
                    self.bounded(async {
                        sqlx::query(sql::RELEASE)
                            .bind(id_list(ids))
                            .bind(retry_at_ms)
                            .execute(self.pool())
                            .await
                            .map_err(|e| self.map(e))?;
                        Ok(())
                    })
                    .await
                }

                async fn purge_sent(&self, before_ms: i64, limit: u32) -> Result<u64, StoreError> {
                    self.purge($crate::purge::$d::OUTBOX_SENT, before_ms, limit)
                        .await
                }

                async fn stats(&self) -> Result<OutboxStats, StoreError> {
                    self.bounded(async {
                        let (pending, oldest, dead): (i64, Option<i64>, i64) =
                            sqlx::query_as(sql::STATS)
                                .fetch_one(self.pool())
                                .await
                                .map_err(|e| self.map(e))?;
                        Ok(OutboxStats {
                            pending: pending.max(0) as u64,
                            oldest_pending_ms: oldest,
                            dead: dead.max(0) as u64,
                        })
                    })
                    .await
                }
            }
        };
    };
}
