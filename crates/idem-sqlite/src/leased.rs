//! Keys claimed with a lease on SQLite: [`LeasedKeyStore`](idem_core::leased::LeasedKeyStore)
//! for [`SqliteStore`] (this backend's part of what idem-sql writes once), with the statements of [`idem_sql::leased`]. A
//! record that stays as it is (a replay, a live lease, another request) is
//! read without the write lock; a claim is one `BEGIN IMMEDIATE`
//! transaction (insert, or reclaim or take over what it found), so two
//! claimers never both win; every later write is one statement conditional
//! on the token.

use idem_core::leased::{LeasedClaim, NextStep, next_step};
use idem_core::{Scope, StoreError};
use idem_sql::decode::record;
use idem_sql::dialect::{Dialect, On};
use idem_sql::keys::scoped;
use idem_sql::leased::{LeaseClaim, SELECT, claim_insert, claim_over};

use crate::SqliteDialect;

/// The claim: one `BEGIN IMMEDIATE` transaction after a read.
pub(crate) async fn claim(
    store: &SqliteDialect,
    scope: &Scope,
    c: LeaseClaim<'_>,
    now_ms: i64,
) -> Result<LeasedClaim, StoreError> {
    // Replays and live leases: a read, without the write lock.
    if let Some(found) = store.bounded(store.read_first(scope)).await?
        && next_step(&found, c.fingerprint, c.on_unknown, now_ms) == NextStep::Keep
    {
        return Ok(LeasedClaim::Existing(found));
    }
    let map = |e| store.map(e);
    let mut tx = store.begin_immediate().await?;
    let fresh = SqliteDialect::fetch_optional(On::Conn(&mut *tx), claim_insert(scope, &c, now_ms))
        .await
        .map_err(map)?;
    let won = if fresh.is_some() {
        LeasedClaim::Claimed
    } else {
        let Some(row) = SqliteDialect::fetch_optional(On::Conn(&mut *tx), scoped(SELECT, scope))
            .await
            .map_err(map)?
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
        SqliteDialect::execute(On::Conn(&mut *tx), statement)
            .await
            .map_err(map)?;
        won
    };
    store.commit_tx(tx).await?;
    Ok(won)
}
