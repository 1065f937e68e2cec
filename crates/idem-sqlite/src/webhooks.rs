//! Webhook receipts on SQLite: [`WebhookStore`](idem_core::webhooks::WebhookStore)
//! for [`SqliteStore`], from [`idem_sql::webhooks`]. A receipt and its
//! inbox record are written in one `BEGIN IMMEDIATE` transaction.

use idem_core::webhooks::{Accepted, NewReceipt};
use idem_core::{KeyStore, StoreError};
use idem_sql::webhooks::sqlite::ACCEPT_INBOX;
use sqlx::Sqlite;

use crate::SqliteStore;

idem_sql::webhook_store!(SqliteStore, Sqlite, sqlite);

impl SqliteStore {
    /// The receipt, then its inbox record, in one transaction.
    async fn accept_here(&self, r: &NewReceipt, at: (i64, i64)) -> Result<Accepted, StoreError> {
        let (now_ms, expires_at_ms) = at;
        let mut tx = self.begin().await?;
        let id = receipt_insert(r, now_ms, expires_at_ms)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| self.map(e))?;
        if id.is_none() {
            self.rollback(tx).await?;
            return Ok(Accepted::Duplicate);
        }
        sqlx::query(ACCEPT_INBOX)
            .bind(&r.endpoint)
            .bind(&r.delivery_id)
            .bind(now_ms)
            .bind(expires_at_ms)
            .execute(&mut *tx)
            .await
            .map_err(|e| self.map(e))?;
        self.commit(tx).await?;
        Ok(Accepted::New)
    }
}
