//! Keys claimed with a lease on PostgreSQL: [`LeasedKeyStore`] for
//! [`PgStore`]. Each call is autocommit statements, each conditional: an
//! insert, a takeover of an abandoned record (`locked_until_ms` passed,
//! same request) that only one of two racing claimers can win under the
//! row lock, or a read; every later write is conditional on the token.

use idem_core::leased::{LeaseToken, LeasedClaim, LeasedKeyStore, OnAbandoned, Resolution};
use idem_core::{Completion, Fingerprint, Policy, Scope, StoreError};

use crate::{PgStore, decode, map_err};

const INSERT_LEASED: &str = "\
INSERT INTO idem_keys (tenant_id, operation, idempotency_key, request_hash, state,
                       locked_until_ms, lock_token, created_at_ms, updated_at_ms, expires_at_ms)
VALUES ($1, $2, $3, $4, 'pending', $5, $6, $7, $7, $8)
ON CONFLICT (tenant_id, operation, idempotency_key) DO UPDATE SET
    request_hash = excluded.request_hash, state = 'pending', status_code = NULL,
    response_headers = NULL, response_body = NULL, resource_type = NULL,
    resource_id = NULL, recovery_point = NULL, locked_until_ms = excluded.locked_until_ms,
    lock_token = excluded.lock_token, created_at_ms = excluded.created_at_ms,
    updated_at_ms = excluded.updated_at_ms, expires_at_ms = excluded.expires_at_ms
WHERE idem_keys.expires_at_ms <= excluded.created_at_ms
RETURNING 1";

const TAKE_OVER: &str = "\
UPDATE idem_keys SET locked_until_ms = $5, lock_token = $6, updated_at_ms = $7
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3 AND request_hash = $4
  AND state = 'pending' AND locked_until_ms IS NOT NULL AND locked_until_ms <= $7
  AND expires_at_ms > $7
RETURNING 1";

const SELECT_RECORD: &str = "\
SELECT request_hash, state, status_code, response_headers, response_body, resource_type,
       resource_id, locked_until_ms, created_at_ms, expires_at_ms
FROM idem_keys WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3";

const RENEW: &str = "\
UPDATE idem_keys SET locked_until_ms = $5, updated_at_ms = $6
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3 AND lock_token = $4
  AND state = 'pending' AND expires_at_ms > $6";

const COMPLETE: &str = "\
UPDATE idem_keys SET state = $5, status_code = $6, response_headers = $7, response_body = $8,
       resource_type = $9, resource_id = $10, locked_until_ms = NULL, lock_token = NULL,
       updated_at_ms = $11
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3 AND lock_token = $4
  AND state = 'pending' AND expires_at_ms > $11";

const RELEASE: &str = "\
DELETE FROM idem_keys
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3 AND lock_token = $4
  AND state = 'pending'";

const RESOLVE_RELEASE: &str = "\
DELETE FROM idem_keys
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3 AND state = 'pending'
  AND locked_until_ms IS NOT NULL AND locked_until_ms <= $4 AND expires_at_ms > $4";

const RESOLVE_ANSWER: &str = "\
UPDATE idem_keys SET state = $5, status_code = $6, response_headers = $7, response_body = $8,
       resource_type = $9, resource_id = $10, locked_until_ms = NULL, lock_token = NULL,
       updated_at_ms = $4
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3 AND state = 'pending'
  AND locked_until_ms IS NOT NULL AND locked_until_ms <= $4 AND expires_at_ms > $4";

fn resource(c: &Completion) -> (Option<&str>, Option<&str>) {
    c.resource
        .as_ref()
        .map(|r| (Some(r.kind.as_str()), Some(r.id.as_str())))
        .unwrap_or((None, None))
}

impl LeasedKeyStore for PgStore {
    async fn claim_leased(
        &self,
        scope: &Scope,
        fingerprint: &Fingerprint,
        policy: &Policy,
        token: &LeaseToken,
        locked_until_ms: i64,
        on_abandoned: OnAbandoned,
        now_ms: i64,
    ) -> Result<LeasedClaim, StoreError> {
        // Between two statements the record can be released or collected;
        // each turn sees a newer committed state, so a few turns settle it.
        for _ in 0..3 {
            let inserted = self
                .bounded_write(
                    sqlx::query(INSERT_LEASED)
                        .bind(scope.tenant.as_str())
                        .bind(scope.operation.as_str())
                        .bind(scope.key.as_str())
                        .bind(&fingerprint.as_bytes()[..])
                        .bind(locked_until_ms)
                        .bind(token.as_str())
                        .bind(now_ms)
                        .bind(policy.expires_at_ms(now_ms))
                        .fetch_optional(self.pool()),
                )
                .await?;
            if inserted.is_some() {
                return Ok(LeasedClaim::Claimed);
            }
            if on_abandoned == OnAbandoned::TakeOver {
                let taken = self
                    .bounded_write(
                        sqlx::query(TAKE_OVER)
                            .bind(scope.tenant.as_str())
                            .bind(scope.operation.as_str())
                            .bind(scope.key.as_str())
                            .bind(&fingerprint.as_bytes()[..])
                            .bind(locked_until_ms)
                            .bind(token.as_str())
                            .bind(now_ms)
                            .fetch_optional(self.pool()),
                    )
                    .await?;
                if taken.is_some() {
                    return Ok(LeasedClaim::TakenOver);
                }
            }
            let row = self
                .bounded(async {
                    sqlx::query(SELECT_RECORD)
                        .bind(scope.tenant.as_str())
                        .bind(scope.operation.as_str())
                        .bind(scope.key.as_str())
                        .fetch_optional(self.pool())
                        .await
                        .map_err(map_err)
                })
                .await?;
            if let Some(row) = row {
                return Ok(LeasedClaim::Existing(decode(&row)?));
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
        let done = self
            .bounded_write(
                sqlx::query(RENEW)
                    .bind(scope.tenant.as_str())
                    .bind(scope.operation.as_str())
                    .bind(scope.key.as_str())
                    .bind(token.as_str())
                    .bind(locked_until_ms)
                    .bind(now_ms)
                    .execute(self.pool()),
            )
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn complete_leased(
        &self,
        scope: &Scope,
        token: &LeaseToken,
        completion: &Completion,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let (kind, id) = resource(completion);
        let done = self
            .bounded_write(
                sqlx::query(COMPLETE)
                    .bind(scope.tenant.as_str())
                    .bind(scope.operation.as_str())
                    .bind(scope.key.as_str())
                    .bind(token.as_str())
                    .bind(completion.state.as_str())
                    .bind(i32::from(completion.response.status))
                    .bind(completion.response.headers_json())
                    .bind(&completion.response.body[..])
                    .bind(kind)
                    .bind(id)
                    .bind(now_ms)
                    .execute(self.pool()),
            )
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn release_leased(&self, scope: &Scope, token: &LeaseToken) -> Result<bool, StoreError> {
        let done = self
            .bounded_write(
                sqlx::query(RELEASE)
                    .bind(scope.tenant.as_str())
                    .bind(scope.operation.as_str())
                    .bind(scope.key.as_str())
                    .bind(token.as_str())
                    .execute(self.pool()),
            )
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn resolve_abandoned(
        &self,
        scope: &Scope,
        resolution: &Resolution,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let q = match resolution {
            Resolution::Release => sqlx::query(RESOLVE_RELEASE)
                .bind(scope.tenant.as_str())
                .bind(scope.operation.as_str())
                .bind(scope.key.as_str())
                .bind(now_ms),
            Resolution::Answer(c) => {
                let (kind, id) = resource(c);
                sqlx::query(RESOLVE_ANSWER)
                    .bind(scope.tenant.as_str())
                    .bind(scope.operation.as_str())
                    .bind(scope.key.as_str())
                    .bind(now_ms)
                    .bind(c.state.as_str())
                    .bind(i32::from(c.response.status))
                    .bind(c.response.headers_json())
                    .bind(c.response.body.clone())
                    .bind(kind)
                    .bind(id)
            }
        };
        let done = self.bounded_write(q.execute(self.pool())).await?;
        Ok(done.rows_affected() == 1)
    }
}
