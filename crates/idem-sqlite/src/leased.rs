//! Keys claimed with a lease on SQLite: [`LeasedKeyStore`](idem_core::leased::LeasedKeyStore)
//! for [`SqliteStore`], with the statements of [`idem_sql::leased`]. A
//! record that stays as it is (a replay, a live lease, another request) is
//! read without the write lock; a claim is one `BEGIN IMMEDIATE`
//! transaction (insert, or reclaim or take over what it found), so two
//! claimers never both win; every later write is one statement conditional
//! on the token.

use idem_core::leased::{LeasedClaim, NextStep, next_step};
use idem_core::{KeyStore, Scope, StoreError};
use idem_sql::decode::record;
use idem_sql::leased::{LeaseClaim, SELECT};
use sqlx::Sqlite;

use crate::SqliteStore;
use crate::keys::{outcome, scoped};

idem_sql::leased_store!(SqliteStore, Sqlite);

impl SqliteStore {
    /// The claim: one `BEGIN IMMEDIATE` transaction after a read.
    async fn claim_leased_here(
        &self,
        scope: &Scope,
        c: LeaseClaim<'_>,
        now_ms: i64,
    ) -> Result<LeasedClaim, StoreError> {
        // Replays and live leases: a read, without the write lock.
        if let Some(found) = self.fetch(scope).await?
            && next_step(&found, c.fingerprint, c.on_unknown, now_ms) == NextStep::Keep
        {
            return Ok(LeasedClaim::Existing(found));
        }
        let mut tx = self.begin_immediate().await?;
        let fresh = claim_insert(scope, &c, now_ms)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| self.map(e))?;
        let won = if fresh.is_some() {
            LeasedClaim::Claimed
        } else {
            let Some(row) = scoped(SELECT, scope)
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| self.map(e))?
            else {
                return Err(StoreError::Corrupt {
                    detail: "conflicting key record vanished inside a write transaction".into(),
                });
            };
            let found = record(&row)?;
            // The write lock is ours: what was read is what is written over.
            let Some((statement, won)) = claim_over(&found, scope, &c, now_ms) else {
                let _ = tx.rollback().await;
                return Ok(LeasedClaim::Existing(found));
            };
            statement.execute(&mut *tx).await.map_err(|e| self.map(e))?;
            won
        };
        self.commit_tx(tx).await?;
        Ok(won)
    }
}
