//! The outbox: the statements of the write side and of the dispatcher
//! ([`OutboxStore`]), written once. The claim (PostgreSQL skips
//! rows another dispatcher holds), the id lists (a JSON array on SQLite, an
//! array on PostgreSQL), the statistics and the enqueue (PostgreSQL's
//! notifies) differ by dialect ([`Texts`]).

use idem_core::StoreError;
use idem_core::outbox::OutboxMessage;

use crate::dialect::{Dialect, On, Stmt, fetch_one};
use crate::row;
use crate::store::SqlStore;
use idem_core::outbox::{OutboxRecord, OutboxStats, OutboxStore};
use std::time::Duration;

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

    /// All of them.
    pub const TEXTS: super::Texts = super::Texts {
        enqueue: ENQUEUE,
        claim: CLAIM,
        mark_sent: MARK_SENT,
        release: RELEASE,
        stats: STATS,
    };
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

    /// All of them.
    pub const TEXTS: super::Texts = super::Texts {
        enqueue: ENQUEUE,
        claim: CLAIM,
        mark_sent: MARK_SENT,
        release: RELEASE,
        stats: STATS,
    };
}

/// One dialect's outbox texts.
#[derive(Debug)]
pub struct Texts {
    /// `$1`..`$7`: message id, topic, key, payload, headers, now, due; the
    /// id first in the row.
    pub enqueue: &'static str,
    /// `$1` now, `$2` lease, `$3` limit.
    pub claim: &'static str,
    /// `$1` the ids (a list), `$2` now.
    pub mark_sent: &'static str,
    /// `$1` the ids (a list), `$2` next attempt.
    pub release: &'static str,
    /// Pending, oldest pending, dead.
    pub stats: &'static str,
}

/// This capability's text in `D`'s SQL family.
pub(crate) fn texts<D: Dialect>() -> &'static Texts {
    D::FAMILY.pick(&sqlite::TEXTS, &postgres::TEXTS)
}

/// Writes `message` to the outbox on `conn`, normally the open transaction
/// of the business write it belongs to; its outbox id. Each backend's
/// `outbox::enqueue` is this with its dialect.
pub async fn enqueue<D: Dialect>(
    conn: &mut <D::Db as sqlx::Database>::Connection,
    message: &OutboxMessage,
    now_ms: i64,
) -> Result<i64, StoreError> {
    let s = Stmt::new(texts::<D>().enqueue)
        .bind(message.message_id.as_str())
        .bind(message.topic.as_str())
        .bind(&message.key)
        .bind(&message.payload[..])
        .bind(idem_core::headers::to_json(&message.headers))
        .bind(now_ms)
        .bind(message.available_at_ms.unwrap_or(now_ms));
    let row = fetch_one::<D>(On::Conn(conn), s)
        .await
        .map_err(D::map_err)?;
    row::get_at(&row, 0)
}

/// One statement on the pool under the deadline; the rows it changed.
async fn execute<D: Dialect>(d: &D, s: Stmt<'_>) -> Result<u64, StoreError> {
    d.bounded(async {
        D::execute(On::Pool(d.pool()), s)
            .await
            .map_err(|e| d.map(e))
    })
    .await
}

/// The write side for `idem_outbox::Outbox`: `enqueue` on the
/// transaction.
impl<D: Dialect> idem_core::outbox::OutboxWriter for SqlStore<D> {
    async fn enqueue(
        &self,
        tx: &mut D::Tx,
        message: &OutboxMessage,
        now_ms: i64,
    ) -> Result<i64, StoreError> {
        enqueue::<D>(&mut **tx, message, now_ms).await
    }
}

impl<D: Dialect> OutboxStore for SqlStore<D> {
    async fn claim_batch(
        &self,
        now_ms: i64,
        lease: Duration,
        limit: u32,
    ) -> Result<Vec<OutboxRecord>, StoreError> {
        let d = &self.0;
        d.bounded(async {
            let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
            let s = Stmt::new(texts::<D>().claim)
                .bind(now_ms)
                .bind(lease_ms)
                .bind(i64::from(limit));
            let rows = D::fetch_all(On::Pool(d.pool()), s)
                .await
                .map_err(|e| d.map(e))?;
            let mut records = rows
                .iter()
                .map(crate::decode::outbox_record)
                .collect::<Result<Vec<_>, _>>()?;
            // RETURNING does not keep the subquery's order.
            records.sort_by_key(|r| r.id);
            Ok(records)
        })
        .await
    }

    async fn mark_sent(&self, ids: &[i64], now_ms: i64) -> Result<u64, StoreError> {
        let d = &self.0;
        execute(d, Stmt::new(texts::<D>().mark_sent).ids(ids).bind(now_ms)).await
    }

    async fn mark_failed(
        &self,
        id: i64,
        error: &str,
        retry_at_ms: i64,
        dead: bool,
    ) -> Result<(), StoreError> {
        let d = &self.0;
        let s = Stmt::new(MARK_FAILED)
            .bind(id)
            .bind(error)
            .bind(retry_at_ms)
            .bind(dead);
        execute(d, s).await.map(|_| ())
    }

    async fn release(&self, ids: &[i64], retry_at_ms: i64) -> Result<(), StoreError> {
        let d = &self.0;
        let s = Stmt::new(texts::<D>().release).ids(ids).bind(retry_at_ms);
        execute(d, s).await.map(|_| ())
    }

    async fn purge_sent(&self, before_ms: i64, limit: u32) -> Result<u64, StoreError> {
        let d = &self.0;
        crate::purge::purge(
            d,
            crate::purge::batches::<D>().outbox_sent,
            before_ms,
            limit,
        )
        .await
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        let d = &self.0;
        d.bounded(async {
            let row = fetch_one::<D>(On::Pool(d.pool()), Stmt::new(texts::<D>().stats))
                .await
                .map_err(|e| d.map(e))?;
            let pending: i64 = row::get_at(&row, 0)?;
            let oldest: Option<i64> = row::get_at(&row, 1)?;
            let dead: i64 = row::get_at(&row, 2)?;
            Ok(OutboxStats {
                pending: pending.max(0) as u64,
                oldest_pending_ms: oldest,
                dead: dead.max(0) as u64,
            })
        })
        .await
    }
}
