//! Keys claimed with a lease on SQLite: [`LeasedKeyStore`] for
//! [`SqliteStore`], with the statements of [`idem_sql::leased`]. A
//! record that stays as it is (a replay, a live lease, another request) is
//! read without the write lock; a claim is one `BEGIN IMMEDIATE`
//! transaction (insert, or reclaim or take over what it found), so two
//! claimers never both win; every later write is one statement conditional
//! on the token.

use idem_core::leased::{
    LeaseToken, LeasedClaim, LeasedKeyStore, NextStep, OnUnknown, Resolution,
    UNRESOLVED_EXPIRES_AT_MS, claim_expires_at_ms, next_step,
};
use idem_core::{Completion, Fingerprint, KeyStore, Policy, Scope, StoreError};
use idem_sql::leased as sql;
use sqlx::Sqlite;
use sqlx::query::Query;
use sqlx::sqlite::SqliteArguments;

use crate::{SqliteStore, decode};

/// `sql` with the scope bound as `$1`, `$2`, `$3`.
pub(crate) fn scoped<'q>(sql: &'q str, scope: &'q Scope) -> Query<'q, Sqlite, SqliteArguments<'q>> {
    sqlx::query(sql)
        .bind(scope.tenant.as_str())
        .bind(scope.operation.as_str())
        .bind(scope.key.as_str())
}

/// The outcome's columns after the parameters before them.
pub(crate) fn outcome<'q>(
    q: Query<'q, Sqlite, SqliteArguments<'q>>,
    c: &'q Completion,
) -> Query<'q, Sqlite, SqliteArguments<'q>> {
    let (kind, id) = c.resource_columns();
    q.bind(c.state.as_str())
        .bind(i64::from(c.response.status))
        .bind(c.response.headers_json())
        .bind(&c.response.body[..])
        .bind(kind)
        .bind(id)
}

impl LeasedKeyStore for SqliteStore {
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
            let record = decode(&row)?;
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

    async fn renew_leased(
        &self,
        scope: &Scope,
        token: &LeaseToken,
        locked_until_ms: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let done = scoped(sql::RENEW, scope)
            .bind(token.as_str())
            .bind(locked_until_ms)
            .bind(now_ms)
            .execute(self.pool())
            .await
            .map_err(|e| self.map(e))?;
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
        let done = scoped(sql::ABANDON, scope)
            .bind(token.as_str())
            .bind(until_ms.min(now_ms))
            .bind(reason)
            .bind(now_ms)
            .bind(UNRESOLVED_EXPIRES_AT_MS)
            .execute(self.pool())
            .await
            .map_err(|e| self.map(e))?;
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
        let q = scoped(sql::COMPLETE, scope).bind(token.as_str());
        let done = outcome(q, completion)
            .bind(now_ms)
            .bind(expires_at_ms)
            .execute(self.pool())
            .await
            .map_err(|e| self.map(e))?;
        Ok(done.rows_affected() == 1)
    }

    async fn release_leased(&self, scope: &Scope, token: &LeaseToken) -> Result<bool, StoreError> {
        let done = scoped(sql::RELEASE, scope)
            .bind(token.as_str())
            .execute(self.pool())
            .await
            .map_err(|e| self.map(e))?;
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
        let done = q.execute(self.pool()).await.map_err(|e| self.map(e))?;
        Ok(done.rows_affected() == 1)
    }
}
