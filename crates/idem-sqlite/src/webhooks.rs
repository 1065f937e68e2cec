//! Webhook receipts on SQLite: [`WebhookStore`](idem_core::webhooks::WebhookStore)
//! for [`SqliteStore`] (this backend's part of what idem-sql writes once), from [`idem_sql::webhooks`]. A receipt and its
//! inbox record are written in one `BEGIN IMMEDIATE` transaction.

use idem_core::StoreError;
use idem_core::webhooks::{Accepted, NewReceipt};
use idem_sql::dialect::{Dialect, On, Stmt};
use idem_sql::webhooks::receipt_insert;
use idem_sql::webhooks::sqlite::ACCEPT_INBOX;

use crate::SqliteDialect;

/// The receipt, then its inbox record, in one transaction.
pub(crate) async fn accept(
    store: &SqliteDialect,
    r: &NewReceipt,
    (now_ms, expires_at_ms): (i64, i64),
) -> Result<Accepted, StoreError> {
    let mut tx = store.begin_here().await?;
    let insert = receipt_insert::<SqliteDialect>(r, now_ms, expires_at_ms);
    let id = SqliteDialect::fetch_optional(On::Conn(&mut *tx), insert)
        .await
        .map_err(|e| store.map(e))?;
    if id.is_none() {
        store.rollback_here(tx).await?;
        return Ok(Accepted::Duplicate);
    }
    let inbox = Stmt::new(ACCEPT_INBOX)
        .bind(&r.endpoint)
        .bind(&r.delivery_id)
        .bind(now_ms)
        .bind(expires_at_ms);
    SqliteDialect::execute(On::Conn(&mut *tx), inbox)
        .await
        .map_err(|e| store.map(e))?;
    store.commit_here(tx).await?;
    Ok(Accepted::New)
}
