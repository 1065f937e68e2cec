//! Webhook receipts ([`WebhookStore`]):
//! the statements, and the store's methods, written once. The
//! acceptance (PostgreSQL writes the receipt and its inbox record in one
//! statement), the claim (PostgreSQL skips rows another worker holds) and
//! the typed NULLs and `GREATEST` of PostgreSQL differ by dialect.

use std::sync::LazyLock;

use idem_core::webhooks::NewReceipt;

use crate::columns::RECEIPT_COLUMNS;
use crate::dialect::{Dialect, On, Stmt, read_row, read_rows};
use crate::purge::purge;
use crate::row::{self, get};
use crate::store::SqlStore;
use idem_core::StoreError;
use idem_core::webhooks::{Accepted, Finish, Receipt, ReceiptState, Requeue, WebhookStore};
use std::time::Duration;

/// The newest version of `$2` (entity) seen at `$1` (endpoint).
pub const NEWEST_VERSION: &str =
    "SELECT version FROM idem_webhook_entities WHERE endpoint = $1 AND entity_id = $2";

/// Counts per endpoint and state.
pub const COUNT: &str = "\
SELECT endpoint, state, COUNT(*) FROM idem_webhook_receipts
GROUP BY endpoint, state ORDER BY endpoint, state";

/// One receipt: `$1` endpoint, `$2` delivery.
pub static GET: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {RECEIPT_COLUMNS} FROM idem_webhook_receipts \
         WHERE endpoint = $1 AND delivery_id = $2"
    )
});

/// A failed or dead receipt queued again (`$1` endpoint, `$2` delivery,
/// `$3` now); answers its id.
pub const REPLAY: &str = "\
UPDATE idem_webhook_receipts SET state = 'received', attempts = 0,
    available_at_ms = $3, locked_until_ms = NULL, finished_at_ms = NULL
WHERE endpoint = $1 AND delivery_id = $2 AND state IN ('failed', 'dead')
RETURNING id";

/// The receipt's columns after `$1` endpoint .. `$7` entity version, `$8`
/// now, `$9` expiry, `$10` content hash.
macro_rules! insert_receipt {
    () => {
        "INSERT INTO idem_webhook_receipts (endpoint, delivery_id, event_type, headers, body,
             entity_id, entity_version, received_at_ms, available_at_ms, expires_at_ms,
             content_sha256)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8, $9, $10)
         ON CONFLICT DO NOTHING RETURNING id"
    };
}

/// The due receipts of `$4` (endpoint) whose entity has no earlier open
/// receipt, leased (`$1` now, `$2` lease, `$3` limit); `{}` is where a
/// dialect closes the subquery.
macro_rules! claim_receipts {
    ($open:literal, $close:literal) => {
        concat!(
            "UPDATE idem_webhook_receipts SET locked_until_ms = $1 + $2
             WHERE id ",
            $open,
            "
                 SELECT r.id FROM idem_webhook_receipts r
                 WHERE r.endpoint = $4 AND r.state IN ('received', 'failed')
                   AND r.available_at_ms <= $1
                   AND (r.locked_until_ms IS NULL OR r.locked_until_ms <= $1)
                   AND NOT EXISTS (SELECT 1 FROM idem_webhook_receipts e
                                   WHERE e.state IN ('received', 'failed')
                                     AND e.endpoint = r.endpoint AND e.entity_id = r.entity_id
                                     AND e.id < r.id)
                 ORDER BY r.id LIMIT $3",
            $close,
            "
             RETURNING "
        )
    };
}

/// SQLite's texts.
pub mod sqlite {
    use super::*;

    /// The receipt (`$1`..`$10`).
    pub const ACCEPT: &str = insert_receipt!();
    /// Its inbox record: `$1` endpoint, `$2` delivery, `$3` now, `$4` expiry.
    pub const ACCEPT_INBOX: &str = "\
INSERT INTO idem_inbox (subscriber_id, message_id, processed_at_ms, expires_at_ms)
VALUES ('webhook:' || $1, $2, $3, $4) ON CONFLICT DO NOTHING";

    /// The claim.
    pub static CLAIM: LazyLock<String> =
        LazyLock::new(|| format!("{}{RECEIPT_COLUMNS}", claim_receipts!("IN (", ")")));

    /// A processed or stale receipt: `$1` id, `$2` `processed` or `stale`,
    /// `$3` now (a stale receipt was not handed to the handler: no attempt).
    pub const FINISH_DONE: &str = "\
UPDATE idem_webhook_receipts SET state = $2, finished_at_ms = $3,
    attempts = attempts + CASE WHEN $2 = 'processed' THEN 1 ELSE 0 END,
    locked_until_ms = NULL, last_error = NULL
WHERE id = $1 AND state IN ('received', 'failed')
RETURNING endpoint, entity_id, entity_version, expires_at_ms";

    /// A failed attempt to retry: `$1` id, `$2` error, `$3` next attempt.
    pub const FINISH_RETRY: &str = "\
UPDATE idem_webhook_receipts SET state = 'failed', attempts = attempts + 1,
    last_error = $2, available_at_ms = $3, locked_until_ms = NULL
WHERE id = $1 AND state IN ('received', 'failed')
RETURNING endpoint, NULL AS entity_id, NULL AS entity_version, expires_at_ms";

    /// A dead receipt: `$1` id, `$2` error, `$3` now.
    pub const FINISH_DEAD: &str = "\
UPDATE idem_webhook_receipts SET state = 'dead', attempts = attempts + 1,
    last_error = $2, locked_until_ms = NULL, finished_at_ms = $3
WHERE id = $1 AND state IN ('received', 'failed')
RETURNING endpoint, NULL AS entity_id, NULL AS entity_version, expires_at_ms";

    /// The newest version of an entity: `$1` endpoint, `$2` entity, `$3`
    /// version, `$4` expiry.
    pub const ENTITY: &str = "\
INSERT INTO idem_webhook_entities (endpoint, entity_id, version, expires_at_ms)
VALUES ($1, $2, $3, $4)
ON CONFLICT (endpoint, entity_id) DO UPDATE SET
    version = max(idem_webhook_entities.version, excluded.version),
    expires_at_ms = max(idem_webhook_entities.expires_at_ms, excluded.expires_at_ms)";

    /// A listing: `$1` endpoint, `$2` state, `$3` limit.
    pub static LIST: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {RECEIPT_COLUMNS} FROM idem_webhook_receipts
             WHERE ($1 IS NULL OR endpoint = $1) AND ($2 IS NULL OR state = $2)
             ORDER BY id DESC LIMIT $3"
        )
    });
    /// What the shared code reads.
    pub const TEXTS: Texts = Texts {
        accept: ACCEPT,
        claim: &CLAIM,
        finish_done: FINISH_DONE,
        finish_retry: FINISH_RETRY,
        finish_dead: FINISH_DEAD,
        entity: ENTITY,
        list: &LIST,
    };
}

/// PostgreSQL's texts.
pub mod postgres {
    use super::*;

    /// The receipt and its inbox record in one statement, hence one
    /// transaction and one round trip: they commit together or not at all
    /// (`$1`..`$10`).
    pub const ACCEPT: &str = concat!(
        "WITH r AS (",
        insert_receipt!(),
        "),
         i AS (
             INSERT INTO idem_inbox (subscriber_id, message_id, processed_at_ms, expires_at_ms)
             SELECT 'webhook:' || $1::text, $2, $8, $9 FROM r ON CONFLICT DO NOTHING)
         SELECT id FROM r"
    );

    /// The claim, skipping rows another worker holds.
    pub static CLAIM: LazyLock<String> = LazyLock::new(|| {
        format!(
            "{}{RECEIPT_COLUMNS}",
            claim_receipts!(
                "= ANY(ARRAY(",
                "\n                 FOR UPDATE SKIP LOCKED))"
            )
        )
    });

    /// A processed or stale receipt: `$1` id, `$2` `processed` or `stale`,
    /// `$3` now (a stale receipt was not handed to the handler: no attempt).
    pub const FINISH_DONE: &str = "\
UPDATE idem_webhook_receipts SET state = $2, finished_at_ms = $3,
    attempts = attempts + CASE WHEN $2::text = 'processed' THEN 1 ELSE 0 END,
    locked_until_ms = NULL, last_error = NULL
WHERE id = $1 AND state IN ('received', 'failed')
RETURNING endpoint, entity_id, entity_version, expires_at_ms";

    /// A failed attempt to retry: `$1` id, `$2` error, `$3` next attempt.
    pub const FINISH_RETRY: &str = "\
UPDATE idem_webhook_receipts SET state = 'failed', attempts = attempts + 1,
    last_error = $2, available_at_ms = $3, locked_until_ms = NULL
WHERE id = $1 AND state IN ('received', 'failed')
RETURNING endpoint, NULL::text AS entity_id, NULL::bigint AS entity_version, expires_at_ms";

    /// A dead receipt: `$1` id, `$2` error, `$3` now.
    pub const FINISH_DEAD: &str = "\
UPDATE idem_webhook_receipts SET state = 'dead', attempts = attempts + 1,
    last_error = $2, locked_until_ms = NULL, finished_at_ms = $3
WHERE id = $1 AND state IN ('received', 'failed')
RETURNING endpoint, NULL::text AS entity_id, NULL::bigint AS entity_version, expires_at_ms";

    /// The newest version of an entity: `$1` endpoint, `$2` entity, `$3`
    /// version, `$4` expiry.
    pub const ENTITY: &str = "\
INSERT INTO idem_webhook_entities (endpoint, entity_id, version, expires_at_ms)
VALUES ($1, $2, $3, $4)
ON CONFLICT (endpoint, entity_id) DO UPDATE SET
    version = GREATEST(idem_webhook_entities.version, excluded.version),
    expires_at_ms = GREATEST(idem_webhook_entities.expires_at_ms, excluded.expires_at_ms)";

    /// A listing: `$1` endpoint, `$2` state, `$3` limit.
    pub static LIST: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {RECEIPT_COLUMNS} FROM idem_webhook_receipts
             WHERE ($1::text IS NULL OR endpoint = $1) AND ($2::text IS NULL OR state = $2)
             ORDER BY id DESC LIMIT $3"
        )
    });
    /// What the shared code reads.
    pub const TEXTS: Texts = Texts {
        accept: ACCEPT,
        claim: &CLAIM,
        finish_done: FINISH_DONE,
        finish_retry: FINISH_RETRY,
        finish_dead: FINISH_DEAD,
        entity: ENTITY,
        list: &LIST,
    };
}

/// One dialect's webhook texts.
#[derive(Debug)]
pub struct Texts {
    /// The receipt's insert (`$1`..`$10`), answering its id unless a
    /// duplicate; on PostgreSQL with its inbox record.
    pub accept: &'static str,
    /// The claim.
    pub claim: &'static LazyLock<String>,
    /// A processed or stale receipt.
    pub finish_done: &'static str,
    /// A failed attempt to retry.
    pub finish_retry: &'static str,
    /// A dead receipt.
    pub finish_dead: &'static str,
    /// The newest version of an entity.
    pub entity: &'static str,
    /// A listing.
    pub list: &'static LazyLock<String>,
}

/// This capability's text in `D`'s SQL family.
pub(crate) fn texts<D: Dialect>() -> &'static Texts {
    D::FAMILY.pick(&sqlite::TEXTS, &postgres::TEXTS)
}

/// The receipt's insert (`$1`..`$10` of the dialect's `ACCEPT`), answering
/// its id unless it was a duplicate.
pub fn receipt_insert<'a, D: Dialect>(
    r: &'a NewReceipt,
    now_ms: i64,
    expires_at_ms: i64,
) -> Stmt<'a> {
    Stmt::new(texts::<D>().accept)
        .bind(&r.endpoint)
        .bind(&r.delivery_id)
        .bind(&r.event_type)
        .bind(idem_core::headers::to_json(&r.headers))
        .bind(&r.body[..])
        .bind(&r.entity_id)
        .bind(r.entity_version)
        .bind(now_ms)
        .bind(expires_at_ms)
        .bind(r.content_sha256.as_ref().map(|h| &h[..]))
}

impl<D: Dialect> WebhookStore for SqlStore<D> {
    async fn accept(
        &self,
        r: &NewReceipt,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<Accepted, StoreError> {
        self.0.accept_here(r, (now_ms, expires_at_ms)).await
    }

    async fn claim_receipts(
        &self,
        endpoint: &str,
        now_ms: i64,
        lease: Duration,
        limit: u32,
    ) -> Result<Vec<Receipt>, StoreError> {
        let d = &self.0;
        d.bounded(async {
            let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
            let s = Stmt::new(texts::<D>().claim.as_str())
                .bind(now_ms)
                .bind(lease_ms)
                .bind(i64::from(limit))
                .bind(endpoint);
            let rows = D::fetch_all(On::Pool(d.pool()), s)
                .await
                .map_err(|e| d.map(e))?;
            let mut receipts = rows
                .iter()
                .map(crate::decode::receipt)
                .collect::<Result<Vec<_>, _>>()?;
            receipts.sort_by_key(|r| r.id);
            Ok(receipts)
        })
        .await
    }

    async fn newest_version(
        &self,
        endpoint: &str,
        entity_id: &str,
    ) -> Result<Option<i64>, StoreError> {
        let d = &self.0;
        let s = Stmt::new(NEWEST_VERSION).bind(endpoint).bind(entity_id);
        read_row(d, s, |row| row::get_at(row, 0)).await
    }

    /// The receipt's outcome and, when processed, its entity's newest
    /// version, in a key-store transaction.
    async fn finish(&self, id: i64, outcome: &Finish, now_ms: i64) -> Result<(), StoreError> {
        let d = &self.0;
        let sql = texts::<D>();
        let mut tx = d.begin_here().await?;
        // The statements under the deadline; the commit under its own rule.
        d.bounded(async {
            let s = match outcome {
                Finish::Processed | Finish::Stale => {
                    let done = if *outcome == Finish::Processed {
                        "processed"
                    } else {
                        "stale"
                    };
                    Stmt::new(sql.finish_done).bind(id).bind(done).bind(now_ms)
                }
                Finish::Retry { error, at_ms } => Stmt::new(sql.finish_retry)
                    .bind(id)
                    .bind(error)
                    .bind(*at_ms),
                Finish::Dead { error } => {
                    Stmt::new(sql.finish_dead).bind(id).bind(error).bind(now_ms)
                }
            };
            let row = D::fetch_optional(On::Conn(&mut *tx), s)
                .await
                .map_err(|e| d.map(e))?;
            let Some(row) = row else { return Ok(()) };
            if *outcome != Finish::Processed {
                return Ok(());
            }
            let entity: Option<String> = get(&row, "entity_id")?;
            let version: Option<i64> = get(&row, "entity_version")?;
            if let (Some(entity), Some(version)) = (entity, version) {
                let endpoint: String = get(&row, "endpoint")?;
                let expires: i64 = get(&row, "expires_at_ms")?;
                let s = Stmt::new(sql.entity)
                    .bind(endpoint)
                    .bind(entity)
                    .bind(version)
                    .bind(expires);
                D::execute(On::Conn(&mut *tx), s)
                    .await
                    .map_err(|e| d.map(e))?;
            }
            Ok(())
        })
        .await?;
        d.commit_here(tx).await
    }

    async fn count_receipts(&self) -> Result<Vec<(String, ReceiptState, u64)>, StoreError> {
        let d = &self.0;
        let counts = read_rows(d, Stmt::new(COUNT), |row| {
            let endpoint: String = row::get_at(row, 0)?;
            let state: String = row::get_at(row, 1)?;
            let n: i64 = row::get_at(row, 2)?;
            Ok(ReceiptState::parse(&state)
                .zip(u64::try_from(n).ok())
                .map(|(state, n)| (endpoint, state, n)))
        })
        .await?;
        Ok(counts.into_iter().flatten().collect())
    }

    async fn list_receipts(
        &self,
        endpoint: Option<&str>,
        state: Option<ReceiptState>,
        limit: u32,
    ) -> Result<Vec<Receipt>, StoreError> {
        let d = &self.0;
        let s = Stmt::new(texts::<D>().list.as_str())
            .bind(endpoint)
            .bind(state.map(ReceiptState::as_str))
            .bind(i64::from(limit));
        read_rows(d, s, crate::decode::receipt).await
    }

    async fn get_receipt(
        &self,
        endpoint: &str,
        delivery_id: &str,
    ) -> Result<Option<Receipt>, StoreError> {
        let d = &self.0;
        let s = Stmt::new(GET.as_str()).bind(endpoint).bind(delivery_id);
        read_row(d, s, crate::decode::receipt).await
    }

    async fn replay_receipt(
        &self,
        endpoint: &str,
        delivery_id: &str,
        now_ms: i64,
    ) -> Result<Requeue, StoreError> {
        let d = &self.0;
        let s = Stmt::new(REPLAY)
            .bind(endpoint)
            .bind(delivery_id)
            .bind(now_ms);
        let requeued = d
            .bounded_write(D::fetch_optional(On::Pool(d.pool()), s))
            .await?;
        if requeued.is_some() {
            return Ok(Requeue::Requeued);
        }
        Ok(match self.get_receipt(endpoint, delivery_id).await? {
            None => Requeue::NotFound,
            Some(r) if r.state == ReceiptState::Received => Requeue::AlreadyQueued,
            Some(r) => Requeue::AlreadyFinished(r.state),
        })
    }

    /// Receipts, then entity versions and the deliveries' inbox records.
    async fn purge_expired_receipts(&self, now_ms: i64, limit: u32) -> Result<u64, StoreError> {
        let d = &self.0;
        let batches = crate::purge::batches::<D>();
        let done = purge(d, batches.receipts, now_ms, limit).await?;
        purge(d, batches.entities, now_ms, limit).await?;
        purge(d, batches.webhook_inbox, now_ms, limit).await?;
        Ok(done)
    }
}
