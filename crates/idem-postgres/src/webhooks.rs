//! Webhook receipts on PostgreSQL: [`WebhookStore`] for [`PgStore`]. Several
//! workers may share one database: claims use `FOR UPDATE SKIP LOCKED`.

use std::time::Duration;

use idem_core::headers;
use idem_core::webhooks::{
    Accepted, Finish, NewReceipt, Receipt, ReceiptColumns, ReceiptState, Requeue, WebhookStore,
};
use idem_core::{KeyStore, StoreError};
use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::column;
use crate::{PgStore, map_err};

pub(crate) const COLUMNS: &str = "id, endpoint, delivery_id, event_type, headers, body, entity_id, \
    entity_version, content_sha256, state, attempts, last_error, received_at_ms, finished_at_ms";

pub(crate) fn decode(row: &PgRow) -> Result<Receipt, StoreError> {
    ReceiptColumns {
        id: column(row, "id")?,
        endpoint: column(row, "endpoint")?,
        delivery_id: column(row, "delivery_id")?,
        event_type: column(row, "event_type")?,
        headers: column(row, "headers")?,
        body: column(row, "body")?,
        entity_id: column(row, "entity_id")?,
        entity_version: column(row, "entity_version")?,
        content_sha256: column(row, "content_sha256")?,
        state: column(row, "state")?,
        attempts: i64::from(column::<i32>(row, "attempts")?),
        last_error: column(row, "last_error")?,
        received_at_ms: column(row, "received_at_ms")?,
        finished_at_ms: column(row, "finished_at_ms")?,
    }
    .decode()
}

impl WebhookStore for PgStore {
    async fn accept(
        &self,
        r: &NewReceipt,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<Accepted, StoreError> {
        {
            // One statement, hence one transaction and one round trip: the receipt
            // and its inbox record commit together or not at all.
            let id: Option<i64> = self.bounded_write(sqlx::query_scalar(
                "WITH r AS (
                     INSERT INTO idem_webhook_receipts (endpoint, delivery_id, event_type, headers, body,
                         entity_id, entity_version, received_at_ms, available_at_ms, expires_at_ms,
                         content_sha256)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8, $9, $10)
                     ON CONFLICT DO NOTHING RETURNING id),
                 i AS (
                     INSERT INTO idem_inbox (subscriber_id, message_id, processed_at_ms, expires_at_ms)
                     SELECT 'webhook:' || $1::text, $2, $8, $9 FROM r ON CONFLICT DO NOTHING)
                 SELECT id FROM r",
            )
            .bind(&r.endpoint)
            .bind(&r.delivery_id)
            .bind(&r.event_type)
            .bind(headers::to_json(&r.headers))
            .bind(&r.body[..])
            .bind(&r.entity_id)
            .bind(r.entity_version)
            .bind(now_ms)
            .bind(expires_at_ms)
            .bind(r.content_sha256.as_ref().map(|h| &h[..]))
            .fetch_optional(self.pool()))
            .await?;
            Ok(if id.is_some() {
                Accepted::New
            } else {
                Accepted::Duplicate
            })
        }
    }

    async fn claim_receipts(
        &self,
        endpoint: &str,
        now_ms: i64,
        lease: Duration,
        limit: u32,
    ) -> Result<Vec<Receipt>, StoreError> {
        self.bounded(async {
            let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
            let rows = sqlx::query(&format!(
                "UPDATE idem_webhook_receipts SET locked_until_ms = $1 + $2
                 WHERE id = ANY(ARRAY(
                     SELECT r.id FROM idem_webhook_receipts r
                     WHERE r.endpoint = $4 AND r.state IN ('received', 'failed')
                       AND r.available_at_ms <= $1
                       AND (r.locked_until_ms IS NULL OR r.locked_until_ms <= $1)
                       AND NOT EXISTS (SELECT 1 FROM idem_webhook_receipts e
                                       WHERE e.state IN ('received', 'failed')
                                         AND e.endpoint = r.endpoint AND e.entity_id = r.entity_id
                                         AND e.id < r.id)
                     ORDER BY r.id LIMIT $3
                     FOR UPDATE SKIP LOCKED))
                 RETURNING {COLUMNS}"
            ))
            .bind(now_ms)
            .bind(lease_ms)
            .bind(i64::from(limit))
            .bind(endpoint)
            .fetch_all(self.pool())
            .await
            .map_err(map_err)?;
            let mut receipts = rows.iter().map(decode).collect::<Result<Vec<_>, _>>()?;
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
        self.bounded(async {
            sqlx::query_scalar(
                "SELECT version FROM idem_webhook_entities WHERE endpoint = $1 AND entity_id = $2",
            )
            .bind(endpoint)
            .bind(entity_id)
            .fetch_optional(self.pool())
            .await
            .map_err(map_err)
        })
        .await
    }

    async fn finish(&self, id: i64, outcome: &Finish, now_ms: i64) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        // The statements under the deadline; the commit under its own rule.
        self.bounded(async {
        let q = match outcome {
            // A stale receipt was not handed to the handler: no attempt.
            Finish::Processed | Finish::Stale => sqlx::query(
                "UPDATE idem_webhook_receipts SET state = $2, finished_at_ms = $3,
                     attempts = attempts + CASE WHEN $2::text = 'processed' THEN 1 ELSE 0 END,
                     locked_until_ms = NULL, last_error = NULL
                 WHERE id = $1 AND state IN ('received', 'failed')
                 RETURNING endpoint, entity_id, entity_version, expires_at_ms",
            )
            .bind(id)
            .bind(if *outcome == Finish::Processed { "processed" } else { "stale" })
            .bind(now_ms),
            Finish::Retry { error, at_ms } => sqlx::query(
                "UPDATE idem_webhook_receipts SET state = 'failed', attempts = attempts + 1,
                     last_error = $2, available_at_ms = $3, locked_until_ms = NULL
                 WHERE id = $1 AND state IN ('received', 'failed')
                 RETURNING endpoint, NULL::text AS entity_id, NULL::bigint AS entity_version, expires_at_ms",
            )
            .bind(id)
            .bind(error)
            .bind(at_ms),
            Finish::Dead { error } => sqlx::query(
                "UPDATE idem_webhook_receipts SET state = 'dead', attempts = attempts + 1,
                     last_error = $2, locked_until_ms = NULL, finished_at_ms = $3
                 WHERE id = $1 AND state IN ('received', 'failed')
                 RETURNING endpoint, NULL::text AS entity_id, NULL::bigint AS entity_version, expires_at_ms",
            )
            .bind(id)
            .bind(error)
            .bind(now_ms),
        };
        let row = q.fetch_optional(&mut *tx).await.map_err(map_err)?;
        if let (Finish::Processed, Some(row)) = (outcome, row) {
            let entity: Option<String> = row.try_get("entity_id").map_err(map_err)?;
            let version: Option<i64> = row.try_get("entity_version").map_err(map_err)?;
            if let (Some(entity), Some(version)) = (entity, version) {
                let endpoint: String = row.try_get("endpoint").map_err(map_err)?;
                let expires: i64 = row.try_get("expires_at_ms").map_err(map_err)?;
                sqlx::query(
                    "INSERT INTO idem_webhook_entities (endpoint, entity_id, version, expires_at_ms)
                     VALUES ($1, $2, $3, $4)
                     ON CONFLICT (endpoint, entity_id) DO UPDATE SET
                         version = GREATEST(idem_webhook_entities.version, excluded.version),
                         expires_at_ms = GREATEST(idem_webhook_entities.expires_at_ms, excluded.expires_at_ms)",
                )
                .bind(endpoint)
                .bind(entity)
                .bind(version)
                .bind(expires)
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
            }
        }
        Ok(())
        })
        .await?;
        self.commit(tx).await
    }

    async fn count_receipts(&self) -> Result<Vec<(String, ReceiptState, u64)>, StoreError> {
        self.bounded(async {
            let rows: Vec<(String, String, i64)> = sqlx::query_as(
                "SELECT endpoint, state, COUNT(*) FROM idem_webhook_receipts
                 GROUP BY endpoint, state ORDER BY endpoint, state",
            )
            .fetch_all(self.pool())
            .await
            .map_err(map_err)?;
            Ok(rows
                .into_iter()
                .filter_map(|(e, s, n)| Some((e, ReceiptState::parse(&s)?, u64::try_from(n).ok()?)))
                .collect())
        })
        .await
    }

    async fn list_receipts(
        &self,
        endpoint: Option<&str>,
        state: Option<ReceiptState>,
        limit: u32,
    ) -> Result<Vec<Receipt>, StoreError> {
        self.bounded(async {
            let rows = sqlx::query(&format!(
                "SELECT {COLUMNS} FROM idem_webhook_receipts
                 WHERE ($1::text IS NULL OR endpoint = $1) AND ($2::text IS NULL OR state = $2)
                 ORDER BY id DESC LIMIT $3"
            ))
            .bind(endpoint)
            .bind(state.map(ReceiptState::as_str))
            .bind(i64::from(limit))
            .fetch_all(self.pool())
            .await
            .map_err(map_err)?;
            rows.iter().map(decode).collect()
        })
        .await
    }

    async fn get_receipt(
        &self,
        endpoint: &str,
        delivery_id: &str,
    ) -> Result<Option<Receipt>, StoreError> {
        self.bounded(async {
            let row = sqlx::query(&format!(
                "SELECT {COLUMNS} FROM idem_webhook_receipts WHERE endpoint = $1 AND delivery_id = $2"
            ))
            .bind(endpoint)
            .bind(delivery_id)
            .fetch_optional(self.pool())
            .await
            .map_err(map_err)?;
            row.as_ref().map(decode).transpose()
        })
        .await
    }

    async fn replay_receipt(
        &self,
        endpoint: &str,
        delivery_id: &str,
        now_ms: i64,
    ) -> Result<Requeue, StoreError> {
        let requeued: Option<i64> = self
            .bounded_write(
                sqlx::query_scalar(
                    "UPDATE idem_webhook_receipts SET state = 'received', attempts = 0,
                         available_at_ms = $3, locked_until_ms = NULL, finished_at_ms = NULL
                     WHERE endpoint = $1 AND delivery_id = $2 AND state IN ('failed', 'dead')
                     RETURNING id",
                )
                .bind(endpoint)
                .bind(delivery_id)
                .bind(now_ms)
                .fetch_optional(self.pool()),
            )
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

    async fn purge_expired_receipts(&self, now_ms: i64, limit: u32) -> Result<u64, StoreError> {
        self.bounded(async {
            let done = sqlx::query(
                "DELETE FROM idem_webhook_receipts WHERE id = ANY(ARRAY(
                     SELECT id FROM idem_webhook_receipts WHERE expires_at_ms <= $1
                     LIMIT $2 FOR UPDATE SKIP LOCKED))",
            )
            .bind(now_ms)
            .bind(i64::from(limit))
            .execute(self.pool())
            .await
            .map_err(map_err)?;
            for sql in [
                "DELETE FROM idem_webhook_entities WHERE ctid = ANY(ARRAY(
                     SELECT ctid FROM idem_webhook_entities WHERE expires_at_ms <= $1
                     LIMIT $2 FOR UPDATE SKIP LOCKED))",
                "DELETE FROM idem_inbox WHERE ctid = ANY(ARRAY(
                     SELECT ctid FROM idem_inbox WHERE subscriber_id LIKE 'webhook:%'
                       AND expires_at_ms <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED))",
            ] {
                sqlx::query(sql)
                    .bind(now_ms)
                    .bind(i64::from(limit))
                    .execute(self.pool())
                    .await
                    .map_err(map_err)?;
            }
            Ok(done.rows_affected())
        })
        .await
    }
}
