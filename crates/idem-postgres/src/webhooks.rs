//! Webhook receipts on PostgreSQL: [`WebhookStore`](idem_core::webhooks::WebhookStore)
//! for [`PgStore`] (this backend's part of what idem-sql writes once), from [`idem_sql::webhooks`]. Several workers may share
//! one database: claims use `FOR UPDATE SKIP LOCKED`.

use idem_core::StoreError;
use idem_core::webhooks::{Accepted, NewReceipt};
use idem_sql::dialect::{Dialect, On};
use idem_sql::webhooks::receipt_insert;

use crate::PgDialect;

/// One statement, hence one transaction and one round trip: the receipt
/// and its inbox record commit together or not at all.
pub(crate) async fn accept(
    store: &PgDialect,
    r: &NewReceipt,
    (now_ms, expires_at_ms): (i64, i64),
) -> Result<Accepted, StoreError> {
    let insert = receipt_insert::<PgDialect>(r, now_ms, expires_at_ms);
    let inserted = PgDialect::fetch_optional(On::Pool(store.pool()), insert);
    Ok(match store.bounded_write(inserted).await? {
        Some(_) => Accepted::New,
        None => Accepted::Duplicate,
    })
}
