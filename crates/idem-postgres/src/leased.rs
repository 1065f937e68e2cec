//! Keys claimed with a lease on PostgreSQL: [`LeasedKeyStore`](idem_core::leased::LeasedKeyStore)
//! for [`PgStore`], with the statements of [`idem_sql::leased`], each an
//! autocommit statement. A claim inserts with `ON CONFLICT DO NOTHING` (no
//! row lock: a replay is an insert that does nothing and a read, and
//! commits nothing), then reclaims an expired record or takes over an
//! abandoned lease with a conditional `UPDATE` that only one of two racing
//! claimers can win under the row lock; every later write is conditional
//! on the token.

use idem_core::leased::{LeasedClaim, NextStep, claim_expires_at_ms, next_step};
use idem_core::{KeyStore, Scope, StoreError};
use idem_sql::leased::{self as sql, LeaseClaim};

use crate::PgStore;
use crate::keys::{outcome, scoped};

idem_sql::leased_store!(PgStore);

impl PgStore {
    /// The claim: autocommit statements, each seeing the newest committed
    /// state.
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
        // `$4`..`$7`; the statements that (re)create the record add `$8`.
        let claim = |sql: &'static str| {
            scoped(sql, scope)
                .bind(&fingerprint.as_bytes()[..])
                .bind(locked_until_ms)
                .bind(token.as_str())
                .bind(now_ms)
        };
        let expiry = claim_expires_at_ms(policy, on_unknown, now_ms);
        // Between two statements the record can be released, collected or
        // taken by another claimer; each turn sees a newer committed state,
        // so a few turns settle it.
        for _ in 0..3 {
            let inserted = self
                .bounded_write(
                    claim(sql::INSERT)
                        .bind(expiry)
                        .bind(on_unknown.as_str())
                        .fetch_optional(self.pool()),
                )
                .await?;
            if inserted.is_some() {
                return Ok(LeasedClaim::Claimed);
            }
            let Some(record) = self.fetch(scope).await? else {
                continue;
            };
            let (statement, won) = match next_step(&record, fingerprint, on_unknown, now_ms) {
                NextStep::Keep => return Ok(LeasedClaim::Existing(record)),
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
            };
            if self
                .bounded_write(statement.fetch_optional(self.pool()))
                .await?
                .is_some()
            {
                return Ok(won);
            }
        }
        Err(StoreError::Busy {
            waited: policy.wait,
        })
    }
}
