//! Webhook receipts on PostgreSQL: [`WebhookStore`](idem_core::webhooks::WebhookStore)
//! for [`PgStore`], from [`idem_sql::webhooks`]. Several workers may share
//! one database: claims use `FOR UPDATE SKIP LOCKED`.

use idem_core::StoreError;
use idem_core::webhooks::{Accepted, NewReceipt};
use sqlx::Postgres;

use crate::PgStore;

idem_sql::webhook_store!(PgStore, Postgres, postgres);

impl PgStore {
    /// One statement, hence one transaction and one round trip: the
    /// receipt and its inbox record commit together or not at all.
    async fn accept_here(&self, r: &NewReceipt, at: (i64, i64)) -> Result<Accepted, StoreError> {
        let (now_ms, expires_at_ms) = at;
        let insert = receipt_insert(r, now_ms, expires_at_ms).fetch_optional(self.pool());
        Ok(match self.bounded_write(insert).await? {
            Some(_) => Accepted::New,
            None => Accepted::Duplicate,
        })
    }
}
