//! Keys claimed with a lease on SQLite: [`LeasedKeyStore`](idem_core::leased::LeasedKeyStore)
//! for [`SqliteStore`], with the statements of [`idem_sql::leased`]. A
//! record that stays as it is (a replay, a live lease, another request) is
//! read without the write lock; a claim is one `BEGIN IMMEDIATE`
//! transaction (insert, or reclaim or take over what it found), so two
//! claimers never both win; every later write is one statement conditional
//! on the token.

use idem_core::leased::{LeasedClaim, NextStep, claim_expires_at_ms, next_step};
use idem_core::{KeyStore, Scope, StoreError};
use idem_sql::decode::record;
use idem_sql::leased::{self as sql, LeaseClaim};

use crate::SqliteStore;
use crate::keys::{outcome, scoped};

idem_sql::leased_store!(SqliteStore);

impl SqliteStore {
    /// The claim: one `BEGIN IMMEDIATE` transaction after a read.
    async fn claim_leased_here(
        &self,
        scope: &Scope,
        c: LeaseClaim<'_>,
        now_ms: i64,
    ) -> Result<LeasedClaim, StoreError> {
        let LeaseClaim {
            fingerprint,
            policy,
            token,
            locked_until_ms,
            on_unknown,
        } = c;
        // Replays and live leases: a read, without the write lock.
        if let Some(record) = self.fetch(scope).await?
            && next_step(&record, fingerprint, on_unknown, now_ms) == NextStep::Keep
        {
            return Ok(LeasedClaim::Existing(record));
        }
        // `$4`..`$7`; the statements that (re)create the record add `$8`.
        let claim = |sql: &'static str| {
            scoped(sql, scope)
                .bind(&fingerprint.as_bytes()[..])
                .bind(locked_until_ms)
                .bind(token.as_str())
                .bind(now_ms)
        };
        let expiry = claim_expires_at_ms(policy, on_unknown, now_ms);
        let mut tx = self.begin_immediate().await?;
        let inserted = claim(sql::INSERT)
            .bind(expiry)
            .bind(on_unknown.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| self.map(e))?;
        let claim = if inserted.is_some() {
            LeasedClaim::Claimed
        } else {
            let row = scoped(sql::SELECT, scope)
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| self.map(e))?;
            let Some(row) = row else {
                return Err(StoreError::Corrupt {
                    detail: "conflicting key record vanished inside a write transaction".into(),
                });
            };
            let record = record(&row)?;
            // The write lock is ours: what was read is what is written over.
            let (statement, claim) = match next_step(&record, fingerprint, on_unknown, now_ms) {
                NextStep::Reclaim => (
                    claim(sql::RECLAIM_EXPIRED)
                        .bind(expiry)
                        .bind(on_unknown.as_str()),
                    LeasedClaim::Claimed,
                ),
                NextStep::TakeOver => {
                    let ended = record.locked_until_ms.unwrap_or(now_ms);
                    (
                        claim(sql::TAKE_OVER)
                            .bind(ended)
                            .bind(on_unknown.as_str())
                            .bind(expiry),
                        LeasedClaim::TakenOver {
                            lease_ended_at_ms: ended,
                        },
                    )
                }
                NextStep::Keep => {
                    let _ = tx.rollback().await;
                    return Ok(LeasedClaim::Existing(record));
                }
            };
            statement.execute(&mut *tx).await.map_err(|e| self.map(e))?;
            claim
        };
        self.commit_tx(tx).await?;
        Ok(claim)
    }
}
