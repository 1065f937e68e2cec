//! The statements of `idem_core::leased::LeasedKeyStore`, one text for both backends
//! (`$n` placeholders; `$1`, `$2`, `$3` are always the tenant, the
//! operation and the key). Every write after the claim is conditional on
//! the token, or on the lease having run out.

use idem_core::leased::{
    LeasedClaim, NextStep, UNRESOLVED_EXPIRES_AT_MS, claim_expires_at_ms, next_step,
};
use idem_core::{Scope, StoreError, StoredRecord};

pub use crate::calls::LeaseClaim;
use crate::dialect::{Dialect, On, Stmt};
use crate::keys::{outcome, scoped};
use crate::store::KEEP_AFTER_MESSAGE_BYTES;
use crate::store::SqlStore;
use idem_core::leased::{LeaseToken, OnUnknown, Resolution};
use idem_core::{Completion, Fingerprint, Policy};

/// A fresh claim: `$4` request hash, `$5` lease deadline, `$6` token,
/// `$7` now, `$8` expiry, `$9` the record's [`OnUnknown`].
/// Nothing on a conflict (no row lock: a replay writes nothing).
pub const INSERT: &str = "\
INSERT INTO idem_keys (tenant_id, operation, idempotency_key, request_hash, state,
                   locked_until_ms, lock_token, created_at_ms, updated_at_ms, expires_at_ms,
                   on_unknown)
VALUES ($1, $2, $3, $4, 'pending', $5, $6, $7, $7, $8, $9)
ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING
RETURNING 1";

/// A claim of an expired record not collected yet (parameters of
/// [`INSERT`]).
pub const RECLAIM_EXPIRED: &str = "\
UPDATE idem_keys SET
request_hash = $4, state = 'pending', status_code = NULL, response_headers = NULL,
response_body = NULL, resource_type = NULL, resource_id = NULL, recovery_point = NULL,
locked_until_ms = $5, lock_token = $6, created_at_ms = $7, updated_at_ms = $7,
expires_at_ms = $8, on_unknown = $9
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3 AND expires_at_ms <= $7
RETURNING 1";

/// A takeover of an abandoned lease of the same request: `$4` request
/// hash, `$5` new deadline, `$6` new token, `$7` now, `$8` the lease end
/// the claimer read (so the end it reports is the one it took over),
/// `$9` the claimer's [`OnUnknown`] (never less strict
/// than the record's: [`next_step`]), `$10` its claim expiry
/// ([`claim_expires_at_ms`]). A record taken over by a stricter
/// claimer is held as that claimer's would be.
pub const TAKE_OVER: &str = "\
UPDATE idem_keys SET locked_until_ms = $5, lock_token = $6, updated_at_ms = $7,
   on_unknown = $9,
   expires_at_ms = CASE WHEN $9 = 'reforward' THEN expires_at_ms ELSE $10 END
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3 AND request_hash = $4
  AND state = 'pending' AND locked_until_ms = $8 AND locked_until_ms <= $7
  AND expires_at_ms > $7
RETURNING 1";

/// The record ([`crate::keys::SELECT_RECORD`]).
pub const SELECT: &str = crate::keys::SELECT_RECORD;

/// `$4` token, `$5` new deadline, `$6` now.
pub const RENEW: &str = "\
UPDATE idem_keys SET locked_until_ms = $5, updated_at_ms = $6
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3 AND lock_token = $4
  AND state = 'pending' AND expires_at_ms > $6";

/// `$4` token, `$5` the lease's new end (at most now: the work's
/// outcome is unknown from then on), `$6` a reason for operators (kept
/// when NULL), `$7` now, `$8` [`UNRESOLVED_EXPIRES_AT_MS`]. The
/// record stays pending: a retry finds it abandoned. Unless its work may
/// be repeated harmlessly (`reforward`), it no longer expires: an
/// unknown outcome is held until it is verified or resolved, never
/// claimed afresh or collected.
pub const ABANDON: &str = "\
UPDATE idem_keys SET locked_until_ms = $5, recovery_point = COALESCE($6, recovery_point),
   updated_at_ms = $7,
   expires_at_ms = CASE WHEN on_unknown = 'reforward' THEN expires_at_ms ELSE $8 END
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3 AND lock_token = $4
  AND state = 'pending' AND expires_at_ms > $7";

/// `$4` token, `$5`..`$10` the outcome's columns, `$11` now, `$12`
/// the latest expiry (a record held while its outcome was unknown
/// expires then).
pub const COMPLETE: &str = "\
UPDATE idem_keys SET state = $5, status_code = $6, response_headers = $7, response_body = $8,
   resource_type = $9, resource_id = $10, locked_until_ms = NULL, lock_token = NULL,
   updated_at_ms = $11,
   expires_at_ms = CASE WHEN expires_at_ms > $12 THEN $12 ELSE expires_at_ms END
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3 AND lock_token = $4
  AND state = 'pending' AND expires_at_ms > $11";

/// `$4` token.
pub const RELEASE: &str = "\
DELETE FROM idem_keys
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3 AND lock_token = $4
  AND state = 'pending'";

/// `$4` now.
pub const RESOLVE_RELEASE: &str = "\
DELETE FROM idem_keys
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3 AND state = 'pending'
  AND locked_until_ms IS NOT NULL AND locked_until_ms <= $4 AND expires_at_ms > $4";

/// `$4` now, `$5`..`$10` the outcome's columns, `$11` the latest
/// expiry.
pub const RESOLVE_ANSWER: &str = "\
UPDATE idem_keys SET state = $5, status_code = $6, response_headers = $7, response_body = $8,
   resource_type = $9, resource_id = $10, locked_until_ms = NULL, lock_token = NULL,
   updated_at_ms = $4,
   expires_at_ms = CASE WHEN expires_at_ms > $11 THEN $11 ELSE expires_at_ms END
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3 AND state = 'pending'
  AND locked_until_ms IS NOT NULL AND locked_until_ms <= $4 AND expires_at_ms > $4";

/// A claim's statement `sql` with `$1`..`$7` bound: the scope, request
/// hash, lease end, token, now.
fn claim_query<'a>(sql: &'a str, scope: &'a Scope, c: &LeaseClaim<'a>, now_ms: i64) -> Stmt<'a> {
    scoped(sql, scope)
        .bind(&c.fingerprint.as_bytes()[..])
        .bind(c.locked_until_ms)
        .bind(c.token.as_str())
        .bind(now_ms)
}

/// The fresh claim ([`INSERT`]).
pub fn claim_insert<'a>(scope: &'a Scope, c: &LeaseClaim<'a>, now_ms: i64) -> Stmt<'a> {
    let expiry = claim_expires_at_ms(c.policy, c.on_unknown, now_ms);
    claim_query(INSERT, scope, c, now_ms)
        .bind(expiry)
        .bind(c.on_unknown.as_str())
}

/// What a claim writes over `record`, which it found in its way: the
/// reclaim of an expired record or the takeover of an abandoned lease, with
/// what winning it answers; `None` when the record stays as it is (a
/// replay, a live lease, another request).
pub fn claim_over<'a>(
    record: &StoredRecord,
    scope: &'a Scope,
    c: &LeaseClaim<'a>,
    now_ms: i64,
) -> Option<(Stmt<'a>, LeasedClaim)> {
    let expiry = claim_expires_at_ms(c.policy, c.on_unknown, now_ms);
    match next_step(record, c.fingerprint, c.on_unknown, now_ms) {
        NextStep::Keep => None,
        NextStep::Reclaim => Some((
            claim_query(RECLAIM_EXPIRED, scope, c, now_ms)
                .bind(expiry)
                .bind(c.on_unknown.as_str()),
            LeasedClaim::Claimed,
        )),
        NextStep::TakeOver => {
            let ended = record.locked_until_ms.unwrap_or(now_ms);
            Some((
                claim_query(TAKE_OVER, scope, c, now_ms)
                    .bind(ended)
                    .bind(c.on_unknown.as_str())
                    .bind(expiry),
                LeasedClaim::TakenOver {
                    lease_ended_at_ms: ended,
                },
            ))
        }
    }
}

/// One autocommit write on the pool: whether it changed one row.
async fn write_one<D: Dialect>(d: &D, s: Stmt<'_>) -> Result<bool, StoreError> {
    let done = d.bounded_write(D::execute(On::Pool(d.pool()), s)).await?;
    Ok(done == 1)
}

impl<D: Dialect> idem_core::leased::LeasedKeyStore for SqlStore<D> {
    #[allow(clippy::too_many_arguments)]
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
        let claim = LeaseClaim {
            fingerprint,
            policy,
            token,
            locked_until_ms,
            on_unknown,
        };
        self.0.claim_leased_here(scope, claim, now_ms).await
    }

    async fn renew_leased(
        &self,
        scope: &Scope,
        token: &LeaseToken,
        locked_until_ms: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let d = &self.0;
        let s = scoped(RENEW, scope)
            .bind(token.as_str())
            .bind(locked_until_ms)
            .bind(now_ms);
        write_one(d, s).await
    }

    async fn abandon_leased(
        &self,
        scope: &Scope,
        token: &LeaseToken,
        until_ms: i64,
        reason: Option<&str>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let d = &self.0;
        let s = scoped(ABANDON, scope)
            .bind(token.as_str())
            .bind(until_ms.min(now_ms))
            .bind(reason)
            .bind(now_ms)
            .bind(UNRESOLVED_EXPIRES_AT_MS);
        write_one(d, s).await
    }

    async fn complete_leased(
        &self,
        scope: &Scope,
        token: &LeaseToken,
        completion: &Completion,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<bool, StoreError> {
        let d = &self.0;
        let s = outcome(scoped(COMPLETE, scope).bind(token.as_str()), completion)
            .bind(now_ms)
            .bind(expires_at_ms);
        if completion.response.body.len() <= KEEP_AFTER_MESSAGE_BYTES {
            return write_one(d, s).await;
        }
        // The driver keeps a connection's buffers as large as its largest
        // message: the connection that stored a large answer is closed, not
        // kept in the pool.
        let done = d
            .bounded_write(async {
                let mut conn = d.pool().acquire().await?;
                let done = D::execute(On::Conn(&mut *conn), s).await?;
                drop(conn.detach());
                Ok(done)
            })
            .await?;
        Ok(done == 1)
    }

    async fn release_leased(&self, scope: &Scope, token: &LeaseToken) -> Result<bool, StoreError> {
        let d = &self.0;
        write_one(d, scoped(RELEASE, scope).bind(token.as_str())).await
    }

    async fn resolve_abandoned(
        &self,
        scope: &Scope,
        resolution: &Resolution,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let d = &self.0;
        let s = match resolution {
            Resolution::Release => scoped(RESOLVE_RELEASE, scope).bind(now_ms),
            Resolution::Answer(c) => outcome(scoped(RESOLVE_ANSWER, scope).bind(now_ms), c)
                .bind(Policy::default().expires_at_ms(now_ms)),
        };
        write_one(d, s).await
    }
}
