//! The inbox ([`InboxStore`](idem_core::inbox::InboxStore)): one text per
//! statement for both dialects, and the store's methods, written once.

use idem_core::StoreError;
use idem_core::inbox::{MessageId, Subscriber};

use crate::dialect::{Dialect, On, Stmt, read_row};

/// Records `$2` (message) for `$1` (subscriber), processed at `$3`,
/// expiring at `$4`; answers a row when it was not recorded before. On
/// PostgreSQL a concurrent, uncommitted insert of the same message makes
/// this one wait (bounded by `lock_timeout`) and then see its committed row.
pub const RECORD: &str = "\
INSERT INTO idem_inbox (subscriber_id, message_id, processed_at_ms, expires_at_ms)
VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING 1";

/// A row when `$1` (subscriber) recorded `$2` (message).
pub const SEEN: &str = "SELECT 1 FROM idem_inbox WHERE subscriber_id = $1 AND message_id = $2";

/// [`InboxStore::record`](idem_core::inbox::InboxStore::record), on the
/// transaction's connection.
pub async fn record<D: Dialect>(
    d: &D,
    conn: &mut <D::Db as sqlx::Database>::Connection,
    subscriber: &Subscriber,
    message_id: &MessageId,
    now_ms: i64,
    expires_at_ms: i64,
) -> Result<bool, StoreError> {
    d.bounded(async {
        let s = Stmt::new(RECORD)
            .bind(subscriber.as_str())
            .bind(message_id.as_str())
            .bind(now_ms)
            .bind(expires_at_ms);
        let inserted = D::fetch_optional(On::Conn(conn), s)
            .await
            .map_err(|e| d.map(e))?;
        Ok(inserted.is_some())
    })
    .await
}

/// [`InboxStore::seen`](idem_core::inbox::InboxStore::seen).
pub async fn seen<D: Dialect>(
    d: &D,
    subscriber: &Subscriber,
    message_id: &MessageId,
) -> Result<bool, StoreError> {
    let s = Stmt::new(SEEN)
        .bind(subscriber.as_str())
        .bind(message_id.as_str());
    Ok(read_row(d, s, |_| Ok(())).await?.is_some())
}

/// [`InboxStore::purge_expired_inbox`](idem_core::inbox::InboxStore::purge_expired_inbox).
pub async fn purge_expired_inbox<D: Dialect>(
    d: &D,
    now_ms: i64,
    limit: u32,
) -> Result<u64, StoreError> {
    crate::purge::purge(d, crate::purge::batches::<D>().inbox, now_ms, limit).await
}

/// [`InboxStore`](idem_core::inbox::InboxStore) for [`SqlStore`](crate::SqlStore):
/// each method is this module's function of the same name (or the
/// `Dialect` method it names).
mod sql_store {
    use crate::dialect::Dialect;
    use crate::store::SqlStore;

    use idem_core::StoreError;
    use idem_core::inbox::{InboxStore, MessageId, Subscriber};

    impl<D: Dialect> InboxStore for SqlStore<D> {
        async fn record(
            &self,
            tx: &mut D::Tx,
            subscriber: &Subscriber,
            message_id: &MessageId,
            now_ms: i64,
            expires_at_ms: i64,
        ) -> Result<bool, StoreError> {
            let conn = &mut **tx;
            crate::inbox::record(&self.0, conn, subscriber, message_id, now_ms, expires_at_ms).await
        }

        async fn seen(
            &self,
            subscriber: &Subscriber,
            message_id: &MessageId,
        ) -> Result<bool, StoreError> {
            crate::inbox::seen(&self.0, subscriber, message_id).await
        }

        async fn purge_expired_inbox(&self, now_ms: i64, limit: u32) -> Result<u64, StoreError> {
            crate::inbox::purge_expired_inbox(&self.0, now_ms, limit).await
        }
    }
}
