//! The inbox on PostgreSQL: [`InboxStore`] for [`PgStore`].

use idem_core::StoreError;
use idem_core::inbox::{InboxStore, MessageId, Subscriber};

use crate::{PgStore, PgTx, map_err};

impl InboxStore for PgStore {
    async fn record(
        &self,
        tx: &mut PgTx,
        subscriber: &Subscriber,
        message_id: &MessageId,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<bool, StoreError> {
        self.bounded(async {
            // A concurrent, uncommitted insert of the same message makes this one
            // wait (bounded by lock_timeout) and then see its committed row.
            let inserted: Option<i32> = sqlx::query_scalar(
                "INSERT INTO idem_inbox (subscriber_id, message_id, processed_at_ms, expires_at_ms)
                 VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING 1",
            )
            .bind(subscriber.as_str())
            .bind(message_id.as_str())
            .bind(now_ms)
            .bind(expires_at_ms)
            .fetch_optional(&mut **tx)
            .await
            .map_err(map_err)?;
            Ok(inserted.is_some())
        })
        .await
    }

    async fn seen(
        &self,
        subscriber: &Subscriber,
        message_id: &MessageId,
    ) -> Result<bool, StoreError> {
        self.bounded(async {
            let found: Option<i32> = sqlx::query_scalar(
                "SELECT 1 FROM idem_inbox WHERE subscriber_id = $1 AND message_id = $2",
            )
            .bind(subscriber.as_str())
            .bind(message_id.as_str())
            .fetch_optional(self.pool())
            .await
            .map_err(map_err)?;
            Ok(found.is_some())
        })
        .await
    }

    async fn purge_expired_inbox(&self, now_ms: i64, limit: u32) -> Result<u64, StoreError> {
        self.bounded(async {
            let done = sqlx::query(
                "DELETE FROM idem_inbox WHERE ctid = ANY(ARRAY(
                     SELECT ctid FROM idem_inbox WHERE expires_at_ms <= $1
                     LIMIT $2 FOR UPDATE SKIP LOCKED))",
            )
            .bind(now_ms)
            .bind(i64::from(limit))
            .execute(self.pool())
            .await
            .map_err(map_err)?;
            Ok(done.rows_affected())
        })
        .await
    }
}
