//! The inbox on SQLite: [`InboxStore`] for [`SqliteStore`].

use idem_core::StoreError;
use idem_core::inbox::{InboxStore, MessageId, Subscriber};

use crate::{SqliteStore, SqliteTx};

impl InboxStore for SqliteStore {
    async fn record(
        &self,
        tx: &mut SqliteTx,
        subscriber: &Subscriber,
        message_id: &MessageId,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<bool, StoreError> {
        let inserted: Option<i64> = sqlx::query_scalar(
            "INSERT INTO idem_inbox (subscriber_id, message_id, processed_at_ms, expires_at_ms)
             VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING RETURNING 1",
        )
        .bind(subscriber.as_str())
        .bind(message_id.as_str())
        .bind(now_ms)
        .bind(expires_at_ms)
        .fetch_optional(&mut **tx)
        .await
        .map_err(|e| self.map(e))?;
        Ok(inserted.is_some())
    }

    async fn seen(
        &self,
        subscriber: &Subscriber,
        message_id: &MessageId,
    ) -> Result<bool, StoreError> {
        let found: Option<i64> = sqlx::query_scalar(
            "SELECT 1 FROM idem_inbox WHERE subscriber_id = ?1 AND message_id = ?2",
        )
        .bind(subscriber.as_str())
        .bind(message_id.as_str())
        .fetch_optional(self.pool())
        .await
        .map_err(|e| self.map(e))?;
        Ok(found.is_some())
    }

    async fn purge_expired_inbox(&self, now_ms: i64, limit: u32) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM idem_inbox WHERE rowid IN
             (SELECT rowid FROM idem_inbox WHERE expires_at_ms <= ?1 LIMIT ?2)",
        )
        .bind(now_ms)
        .bind(i64::from(limit))
        .execute(self.pool())
        .await
        .map_err(|e| self.map(e))?;
        Ok(done.rows_affected())
    }
}
