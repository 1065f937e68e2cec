//! Keys claimed with a lease on PostgreSQL: [`LeasedKeyStore`] for
//! [`PgStore`], with the statements of [`idem_sql::leased`], each an
//! autocommit statement. A claim inserts with `ON CONFLICT DO NOTHING` (no
//! row lock: a replay is an insert that does nothing and a read, and
//! commits nothing), then reclaims an expired record or takes over an
//! abandoned lease with a conditional `UPDATE` that only one of two racing
//! claimers can win under the row lock; every later write is conditional
//! on the token.

use idem_core::leased::{
    LeaseToken, LeasedClaim, LeasedKeyStore, NextStep, OnUnknown, Resolution,
    UNRESOLVED_EXPIRES_AT_MS, claim_expires_at_ms, next_step,
};
use idem_core::{Completion, Fingerprint, KeyStore, Policy, Scope, StoreError};
use idem_sql::leased as sql;
use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;

use crate::PgStore;

/// `sql` with the scope bound as `$1`, `$2`, `$3`.
pub(crate) fn scoped<'q>(sql: &'q str, scope: &'q Scope) -> Query<'q, Postgres, PgArguments> {
    sqlx::query(sql)
        .bind(scope.tenant.as_str())
        .bind(scope.operation.as_str())
        .bind(scope.key.as_str())
}

/// The outcome's columns after the parameters before them.
pub(crate) fn outcome<'q>(
    q: Query<'q, Postgres, PgArguments>,
    c: &'q Completion,
) -> Query<'q, Postgres, PgArguments> {
    let (kind, id) = c.resource_columns();
    q.bind(c.state.as_str())
        .bind(i32::from(c.response.status))
        .bind(c.response.headers_json())
        .bind(&c.response.body[..])
        .bind(kind)
        .bind(id)
}

impl LeasedKeyStore for PgStore {
    async fn claim_leased(
        &self,
        scope: &Scope,
        fingerprint: &Fingerprint,
        policy: &Policy,
        token: &LeaseToken,
        locked_until_ms: i64,
        on_unknown: OnUnknown,
        now_ms: i64,
    ) -> Result<LeasedClaim, StoreError> {
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

    async fn renew_leased(
        &self,
        scope: &Scope,
        token: &LeaseToken,
        locked_until_ms: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let q = scoped(sql::RENEW, scope)
            .bind(token.as_str())
            .bind(locked_until_ms)
            .bind(now_ms);
        let done = self.bounded_write(q.execute(self.pool())).await?;
        Ok(done.rows_affected() == 1)
    }

    async fn abandon_leased(
        &self,
        scope: &Scope,
        token: &LeaseToken,
        until_ms: i64,
        reason: Option<&str>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let q = scoped(sql::ABANDON, scope)
            .bind(token.as_str())
            .bind(until_ms.min(now_ms))
            .bind(reason)
            .bind(now_ms)
            .bind(UNRESOLVED_EXPIRES_AT_MS);
        let done = self.bounded_write(q.execute(self.pool())).await?;
        Ok(done.rows_affected() == 1)
    }

    async fn complete_leased(
        &self,
        scope: &Scope,
        token: &LeaseToken,
        completion: &Completion,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<bool, StoreError> {
        let q = outcome(
            scoped(sql::COMPLETE, scope).bind(token.as_str()),
            completion,
        )
        .bind(now_ms)
        .bind(expires_at_ms);
        let done = self.bounded_write(q.execute(self.pool())).await?;
        Ok(done.rows_affected() == 1)
    }

    async fn release_leased(&self, scope: &Scope, token: &LeaseToken) -> Result<bool, StoreError> {
        let q = scoped(sql::RELEASE, scope).bind(token.as_str());
        let done = self.bounded_write(q.execute(self.pool())).await?;
        Ok(done.rows_affected() == 1)
    }

    async fn resolve_abandoned(
        &self,
        scope: &Scope,
        resolution: &Resolution,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let q = match resolution {
            Resolution::Release => scoped(sql::RESOLVE_RELEASE, scope).bind(now_ms),
            Resolution::Answer(c) => outcome(scoped(sql::RESOLVE_ANSWER, scope).bind(now_ms), c)
                .bind(Policy::default().expires_at_ms(now_ms)),
        };
        let done = self.bounded_write(q.execute(self.pool())).await?;
        Ok(done.rows_affected() == 1)
    }
}
