//! The inbox ([`InboxStore`](idem_core::inbox::InboxStore)): one text per
//! statement for both dialects, and [`inbox_store!`](crate::inbox_store).

/// Records `$2` (message) for `$1` (subscriber), processed at `$3`,
/// expiring at `$4`; answers a row when it was not recorded before. On
/// PostgreSQL a concurrent, uncommitted insert of the same message makes
/// this one wait (bounded by `lock_timeout`) and then see its committed row.
pub const RECORD: &str = "\
INSERT INTO idem_inbox (subscriber_id, message_id, processed_at_ms, expires_at_ms)
VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING 1";

/// A row when `$1` (subscriber) recorded `$2` (message).
pub const SEEN: &str = "SELECT 1 FROM idem_inbox WHERE subscriber_id = $1 AND message_id = $2";

/// Implements [`InboxStore`](idem_core::inbox::InboxStore) for a backend's
/// store: `inbox_store!(Store, Tx, dialect)`.
#[macro_export]
macro_rules! inbox_store {
    ($store:ty, $tx:ty, $d:ident) => {
        const _: () = {
            use idem_core::StoreError;
            use idem_core::inbox::{InboxStore, MessageId, Subscriber};

            impl InboxStore for $store {
                async fn record(
                    &self,
                    tx: &mut $tx,
                    subscriber: &Subscriber,
                    message_id: &MessageId,
                    now_ms: i64,
                    expires_at_ms: i64,
                ) -> Result<bool, StoreError> {
                    self.bounded(async {
                        let inserted = sqlx::query($crate::inbox::RECORD)
                            .bind(subscriber.as_str())
                            .bind(message_id.as_str())
                            .bind(now_ms)
                            .bind(expires_at_ms)
                            .fetch_optional(&mut **tx)
                            .await
                            .map_err(|e| self.map(e))?;
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
                        let found = sqlx::query($crate::inbox::SEEN)
                            .bind(subscriber.as_str())
                            .bind(message_id.as_str())
                            .fetch_optional(self.pool())
                            .await
                            .map_err(|e| self.map(e))?;
                        Ok(found.is_some())
                    })
                    .await
                }

                async fn purge_expired_inbox(
                    &self,
                    now_ms: i64,
                    limit: u32,
                ) -> Result<u64, StoreError> {
                    self.purge($crate::purge::$d::INBOX, now_ms, limit).await
                }
            }
        };
    };
}
