//! The key record's statements shared by the engine's store and the
//! operator's release (`$1`..`$3` always the scope: tenant, operation, key).

use std::borrow::Cow;

use idem_core::keys::{Claim, Settled, answered_by_read};
use idem_core::{Completion, Scope, StoreError};

pub use crate::calls::{ClaimRequest, Refused};
use crate::dialect::Dialect;
use crate::dialect::Stmt;
use crate::store::SqlStore;

/// The key record's columns every decoder of `idem_core::keys::RecordColumns` reads, and
/// the statement that selects them (`$1`..`$3` the scope), for every
/// backend.
pub const SELECT_RECORD: &str = "\
SELECT request_hash, state, status_code, response_headers, response_body, resource_type,
       resource_id, locked_until_ms, created_at_ms, expires_at_ms, on_unknown
FROM idem_keys WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3";

/// The statement that reads `idem_core::admin::ReleaseColumns` (`$1`..`$3` the scope; the
/// backend appends its row lock).
pub const RELEASE_SELECT: &str = "SELECT state, lock_token, locked_until_ms, on_unknown \
    FROM idem_keys WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3";

/// The statement that releases: `$4` the token read.
pub const RELEASE_DELETE: &str = "DELETE FROM idem_keys WHERE tenant_id = $1 AND operation = $2 \
    AND idempotency_key = $3 AND state = 'pending' AND lock_token = $4";

/// Optimistic claims: the completed record, inserted at the end of the
/// operation's transaction (`$4` request hash, `$5`..`$10` the outcome's
/// columns, `$11` now, `$12` expiry). A record that expired is replaced in
/// the same statement; a live one is left alone (on PostgreSQL, locked, so
/// the read that follows sees it as committed).
pub const INSERT_COMPLETED: &str = "\
INSERT INTO idem_keys (tenant_id, operation, idempotency_key, request_hash, state,
                       status_code, response_headers, response_body, resource_type,
                       resource_id, locked_until_ms, created_at_ms, updated_at_ms, expires_at_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULL, $11, $11, $12)
ON CONFLICT (tenant_id, operation, idempotency_key) DO UPDATE SET
    request_hash = excluded.request_hash, state = excluded.state,
    status_code = excluded.status_code, response_headers = excluded.response_headers,
    response_body = excluded.response_body, resource_type = excluded.resource_type,
    resource_id = excluded.resource_id, recovery_point = NULL, locked_until_ms = NULL,
    lock_token = NULL, created_at_ms = excluded.created_at_ms,
    updated_at_ms = excluded.updated_at_ms, expires_at_ms = excluded.expires_at_ms
WHERE idem_keys.expires_at_ms <= excluded.created_at_ms
RETURNING 1";

/// A claimed record completed: `$4`..`$9` the outcome's columns, `$10` now.
pub const UPDATE_COMPLETE: &str = "\
UPDATE idem_keys SET state = $4, status_code = $5, response_headers = $6, response_body = $7,
       resource_type = $8, resource_id = $9, locked_until_ms = NULL, updated_at_ms = $10
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3 AND state = 'pending'";

/// `sql` with the scope bound as `$1`, `$2`, `$3`.
pub fn scoped<'a>(sql: impl Into<Cow<'a, str>>, scope: &'a Scope) -> Stmt<'a> {
    Stmt::new(sql)
        .bind(scope.tenant.as_str())
        .bind(scope.operation.as_str())
        .bind(scope.key.as_str())
}

/// The outcome's six columns after the parameters before them (the status
/// an `INTEGER`).
pub fn outcome<'a>(s: Stmt<'a>, c: &'a Completion) -> Stmt<'a> {
    let (kind, id) = c.resource_columns();
    s.bind(c.state.as_str())
        .int(c.response.status)
        .bind(c.response.headers_json())
        .bind(&c.response.body[..])
        .bind(kind)
        .bind(id)
}

/// `sql` ([`INSERT_COMPLETED`]'s parameters) with the optimistic record's
/// twelve values bound.
pub fn completed<'a>(
    sql: impl Into<Cow<'a, str>>,
    scope: &'a Scope,
    r: ClaimRequest<'a>,
    c: &'a Completion,
) -> Stmt<'a> {
    outcome(scoped(sql, scope).bind(&r.fingerprint.as_bytes()[..]), c)
        .bind(r.now_ms)
        .bind(r.policy.expires_at_ms(r.now_ms))
}

/// SQLite's claim: under the write lock, a fresh claim or the claim of a
/// record that expired (replaced in the same statement); a live record is
/// left alone. `$4` request hash, `$5` now, `$6` expiry.
pub mod sqlite {
    /// The claim.
    pub const INSERT_CLAIM: &str = "\
INSERT INTO idem_keys (tenant_id, operation, idempotency_key, request_hash, state,
                       locked_until_ms, created_at_ms, updated_at_ms, expires_at_ms)
VALUES ($1, $2, $3, $4, 'pending', NULL, $5, $5, $6)
ON CONFLICT (tenant_id, operation, idempotency_key) DO UPDATE SET
    request_hash = excluded.request_hash, state = 'pending', status_code = NULL,
    response_headers = NULL, response_body = NULL, resource_type = NULL,
    resource_id = NULL, recovery_point = NULL, locked_until_ms = NULL, lock_token = NULL,
    created_at_ms = excluded.created_at_ms, updated_at_ms = excluded.updated_at_ms,
    expires_at_ms = excluded.expires_at_ms
WHERE idem_keys.expires_at_ms <= excluded.created_at_ms
RETURNING 1";
}

/// PostgreSQL's claim, in two statements (`$4` request hash, `$5` now, `$6`
/// expiry).
pub mod postgres {
    /// Inserts a pending record unless the key has one. `DO NOTHING` takes
    /// no row lock on a committed conflicting record, so concurrent replays
    /// of one hot key do not queue behind each other; it still waits
    /// (bounded by `lock_timeout`) for a conflicting claim that has not
    /// committed yet.
    pub const INSERT_CLAIM: &str = "\
INSERT INTO idem_keys (tenant_id, operation, idempotency_key, request_hash, state,
                       locked_until_ms, created_at_ms, updated_at_ms, expires_at_ms)
VALUES ($1, $2, $3, $4, 'pending', NULL, $5, $5, $6)
ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING
RETURNING 1";

    /// Takes over a record that expired but was not collected yet. A
    /// concurrent takeover holds the row lock; under READ COMMITTED this
    /// statement then re-checks the condition against the winner's row and
    /// updates nothing.
    pub const TAKE_OVER_EXPIRED: &str = "\
UPDATE idem_keys SET
    request_hash = $4, state = 'pending', status_code = NULL, response_headers = NULL,
    response_body = NULL, resource_type = NULL, resource_id = NULL, recovery_point = NULL,
    locked_until_ms = NULL, lock_token = NULL, created_at_ms = $5, updated_at_ms = $5,
    expires_at_ms = $6
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3 AND expires_at_ms <= $5
RETURNING 1";
}

/// The claimed record could not be completed: another process took it over
/// or collected it. Nothing of the operation committed.
pub fn no_longer_pending() -> StoreError {
    StoreError::Corrupt {
        detail: "the claimed record is no longer pending".into(),
    }
}

impl<D: Dialect> idem_core::KeyStore for SqlStore<D> {
    type Tx = D::Tx;

    /// The read first, then the dialect's claim, under one deadline.
    async fn claim(
        &self,
        scope: &idem_core::Scope,
        fingerprint: &idem_core::Fingerprint,
        policy: &idem_core::Policy,
        now_ms: i64,
    ) -> Result<idem_core::keys::Claim<Self::Tx>, idem_core::StoreError> {
        let d = &self.0;
        let request = ClaimRequest {
            fingerprint,
            policy,
            now_ms,
        };
        // One deadline for the read and the claim.
        d.bounded_claim(policy.wait, async {
            // Read first: a replay, a conflict or a request in flight is
            // answered by the committed record, without a write.
            if let Some(record) = d.read_first(scope).await?
                && answered_by_read(&record, fingerprint, policy, now_ms)
            {
                return Ok(Claim::Existing(record));
            }
            d.claim_here(scope, request).await
        })
        .await
    }

    /// The dialect's message; a guard refusal is [`no_longer_pending`].
    async fn complete(
        &self,
        tx: Self::Tx,
        scope: &idem_core::Scope,
        completion: &idem_core::Completion,
        now_ms: i64,
    ) -> Result<(), idem_core::StoreError> {
        let d = &self.0;
        match d.complete_message(tx, scope, completion, now_ms).await {
            Ok(()) => Ok(()),
            Err(Refused::Guard(())) => Err(no_longer_pending()),
            Err(Refused::Store(e)) => Err(e),
        }
    }

    /// The dialect's message; a guard refusal answers the live record.
    async fn insert_completed(
        &self,
        tx: Self::Tx,
        scope: &idem_core::Scope,
        fingerprint: &idem_core::Fingerprint,
        completion: &idem_core::Completion,
        policy: &idem_core::Policy,
        now_ms: i64,
    ) -> Result<idem_core::keys::Settled, idem_core::StoreError> {
        let d = &self.0;
        let request = ClaimRequest {
            fingerprint,
            policy,
            now_ms,
        };
        match d
            .insert_completed_message(tx, scope, request, completion)
            .await
        {
            Ok(()) => Ok(Settled::Committed),
            Err(Refused::Guard(left)) => d.live_record(left, scope).await.map(Settled::Existing),
            Err(Refused::Store(e)) => Err(e),
        }
    }

    async fn begin(&self) -> Result<Self::Tx, idem_core::StoreError> {
        crate::dialect::Dialect::begin_here(&self.0).await
    }

    async fn commit(&self, tx: Self::Tx) -> Result<(), idem_core::StoreError> {
        crate::dialect::Dialect::commit_here(&self.0, tx).await
    }

    async fn rollback(&self, tx: Self::Tx) -> Result<(), idem_core::StoreError> {
        crate::dialect::Dialect::rollback_here(&self.0, tx).await
    }

    /// The read first, under the deadline.
    async fn fetch(
        &self,
        scope: &idem_core::Scope,
    ) -> Result<Option<idem_core::StoredRecord>, idem_core::StoreError> {
        let d = &self.0;
        d.bounded(d.read_first(scope)).await
    }

    async fn purge_expired(&self, now_ms: i64, limit: u32) -> Result<u64, idem_core::StoreError> {
        let d = &self.0;
        crate::purge::purge(d, crate::purge::batches::<D>().keys, now_ms, limit).await
    }

    fn clock(&self) -> idem_core::SharedClock {
        crate::dialect::Dialect::clock(&self.0)
    }
}
