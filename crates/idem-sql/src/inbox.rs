//! The inbox ([`InboxStore`]): one text per
//! statement for both dialects, and the store's methods, written once.

use idem_core::StoreError;
use idem_core::inbox::{MessageId, Subscriber};

use crate::dialect::{Dialect, On, Stmt, read_row};
use crate::store::SqlStore;
use idem_core::inbox::InboxStore;

/// Records `$2` (message) for `$1` (subscriber), processed at `$3`,
/// expiring at `$4`; answers a row when it was not recorded before. On
/// PostgreSQL a concurrent, uncommitted insert of the same message makes
/// this one wait (bounded by `lock_timeout`) and then see its committed row.
pub const RECORD: &str = "\
INSERT INTO idem_inbox (subscriber_id, message_id, processed_at_ms, expires_at_ms)
VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING 1";

/// A row when `$1` (subscriber) recorded `$2` (message).
pub const SEEN: &str = "SELECT 1 FROM idem_inbox WHERE subscriber_id = $1 AND message_id = $2";

impl<D: Dialect> InboxStore for SqlStore<D> {
    async fn record(
        &self,
        tx: &mut D::Tx,
        subscriber: &Subscriber,
        message_id: &MessageId,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<bool, StoreError> {
        let d = &self.0;
        d.bounded(async {
            let s = Stmt::new(RECORD)
                .bind(subscriber.as_str())
                .bind(message_id.as_str())
                .bind(now_ms)
                .bind(expires_at_ms);
            let inserted = D::fetch_optional(On::Conn(&mut **tx), s)
                .await
                .map_err(|e| d.map(e))?;
            Ok(inserted.is_some())
        })
        .await
    }

    async fn seen(
        &self,
        subscriber: &Subscriber,
        message_id: &MessageId,
    ) -> Result<bool, StoreError> {
        let d = &self.0;
        let s = Stmt::new(SEEN)
            .bind(subscriber.as_str())
            .bind(message_id.as_str());
        Ok(read_row(d, s, |_| Ok(())).await?.is_some())
    }

    async fn purge_expired_inbox(&self, now_ms: i64, limit: u32) -> Result<u64, StoreError> {
        let d = &self.0;
        crate::purge::purge(d, crate::purge::batches::<D>().inbox, now_ms, limit).await
    }
}
