//! Keys claimed with a lease on PostgreSQL: [`LeasedKeyStore`](idem_core::leased::LeasedKeyStore)
//! for [`PgStore`] (this backend's part of what idem-sql writes once), with the statements of [`idem_sql::leased`], each an
//! autocommit statement. A claim inserts with `ON CONFLICT DO NOTHING` (no
//! row lock: a replay is an insert that does nothing and a read, and
//! commits nothing), then reclaims an expired record or takes over an
//! abandoned lease with a conditional `UPDATE` that only one of two racing
//! claimers can win under the row lock; every later write is conditional
//! on the token.

use idem_core::leased::LeasedClaim;
use idem_core::{Scope, StoreError};
use idem_sql::dialect::{Dialect, On};
use idem_sql::leased::{LeaseClaim, claim_insert, claim_over};

use crate::PgDialect;

/// The claim: autocommit statements, each seeing the newest committed
/// state.
pub(crate) async fn claim(
    store: &PgDialect,
    scope: &Scope,
    c: LeaseClaim<'_>,
    now_ms: i64,
) -> Result<LeasedClaim, StoreError> {
    // Between two statements the record can be released, collected or
    // taken by another claimer; each turn sees a newer committed state, so
    // a few turns settle it.
    for _ in 0..3 {
        let fresh =
            PgDialect::fetch_optional(On::Pool(store.pool()), claim_insert(scope, &c, now_ms));
        if store.bounded_write(fresh).await?.is_some() {
            return Ok(LeasedClaim::Claimed);
        }
        let Some(found) = store.bounded(store.read_first(scope)).await? else {
            continue;
        };
        let Some((statement, won)) = claim_over(&found, scope, &c, now_ms) else {
            return Ok(LeasedClaim::Existing(found));
        };
        let taken = PgDialect::fetch_optional(On::Pool(store.pool()), statement);
        if store.bounded_write(taken).await?.is_some() {
            return Ok(won);
        }
    }
    Err(StoreError::Busy {
        waited: c.policy.wait,
    })
}
