//! The key record's statements shared by the engine's store and the
//! operator's release (`$1`..`$3` always the scope: tenant, operation, key).

use idem_core::StoreError;

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

/// The scope and outcome binders of a driver: `binders!(Database, int)`
/// defines `scoped(sql, scope)` (the scope bound as `$1`..`$3`) and
/// `outcome(query, completion)` (the outcome's six columns, the status as
/// `int`, the width of the driver's `INTEGER`) and `completed(sql, scope,
/// request, completion)` (the twelve values of [`INSERT_COMPLETED`]).
#[macro_export]
macro_rules! binders {
    ($db:ty, $int:ty) => {
        /// `sql` with the scope bound as `$1`, `$2`, `$3`.
        pub(crate) fn scoped<'q>(
            sql: &'q str,
            scope: &'q idem_core::Scope,
        ) -> sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments<'q>> {
            sqlx::query(sql)
                .bind(scope.tenant.as_str())
                .bind(scope.operation.as_str())
                .bind(scope.key.as_str())
        }

        /// The outcome's columns after the parameters before them.
        pub(crate) fn outcome<'q>(
            q: sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments<'q>>,
            c: &'q idem_core::Completion,
        ) -> sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments<'q>> {
            let (kind, id) = c.resource_columns();
            q.bind(c.state.as_str())
                .bind(<$int>::from(c.response.status))
                .bind(c.response.headers_json())
                .bind(&c.response.body[..])
                .bind(kind)
                .bind(id)
        }

        /// `sql` ([`INSERT_COMPLETED`](idem_sql::keys::INSERT_COMPLETED)'s
        /// parameters) with the optimistic record's twelve values bound.
        pub(crate) fn completed<'q>(
            sql: &'q str,
            scope: &'q idem_core::Scope,
            r: idem_sql::keys::ClaimRequest<'q>,
            c: &'q idem_core::Completion,
        ) -> sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments<'q>> {
            outcome(scoped(sql, scope).bind(&r.fingerprint.as_bytes()[..]), c)
                .bind(r.now_ms)
                .bind(r.policy.expires_at_ms(r.now_ms))
        }
    };
}

/// What a claim asks for besides the scope: the parameters of
/// [`KeyStore::claim`](idem_core::KeyStore::claim) as a backend's own
/// `claim_here` and `insert_completed_message` take them.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// The request's fingerprint.
    pub fingerprint: &'a idem_core::Fingerprint,
    /// The operation's policy.
    pub policy: &'a idem_core::Policy,
    /// Now.
    pub now_ms: i64,
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

/// Why a message that ends in `COMMIT` did not commit: what a backend's
/// `complete_message` and `insert_completed_message` answer, which
/// [`key_store!`] turns into the key store's answer.
pub enum Refused<T> {
    /// Its guarded write matched no row, so the message failed before its
    /// `COMMIT`. `T` is what is left of the transaction: still open on
    /// SQLite's writer (the conflicting record is read in it), nothing on
    /// PostgreSQL (the server rolled it back).
    Guard(T),
    /// Anything else, as the store reports it; the transaction ended.
    Store(StoreError),
}

impl<T> From<StoreError> for Refused<T> {
    fn from(e: StoreError) -> Self {
        Refused::Store(e)
    }
}

impl<T> Refused<T> {
    /// For a message without a guarded write (a bare `COMMIT`): the store's
    /// error. A guard refusal cannot come from such a message; if one did,
    /// the store answered something it should not have, and says so.
    pub fn unguarded(self) -> StoreError {
        match self {
            Refused::Store(e) => e,
            Refused::Guard(_) => StoreError::Corrupt {
                detail: "a COMMIT without a guarded write was refused as guarded".into(),
            },
        }
    }
}

/// The claimed record could not be completed: another process took it over
/// or collected it. Nothing of the operation committed.
pub fn no_longer_pending() -> StoreError {
    StoreError::Corrupt {
        detail: "the claimed record is no longer pending".into(),
    }
}

/// Implements [`KeyStore`](idem_core::KeyStore) for a backend's store:
/// `key_store!(Store, Tx, dialect; extra trait items)`. The read, the purge
/// and what a refused message means are written here; the claim, `BEGIN`,
/// the record's messages, `COMMIT` and `ROLLBACK`, which each backend sends
/// its own way, are the store's own:
/// - `claim_here(scope, ClaimRequest)`: the claim after the read-first step
///   found no record that answers it, and `begin_here()`;
/// - `complete_message(tx, scope, completion, now_ms)`: the claimed
///   record's update, guarded, and `COMMIT`, answering
///   `Result<(), Refused<()>>` (the transaction ended either way);
/// - `insert_completed_message(tx, scope, ClaimRequest, completion)`: the
///   optimistic claim's record inserted, guarded, and `COMMIT`, answering
///   `Result<(), Refused<Left>>`, and `live_record(left, scope)`: the record
///   that refused it;
/// - `commit_here(tx)`, `rollback_here(tx)` and `read_first(scope)`.
#[macro_export]
macro_rules! key_store {
    ($store:ty, $tx:ty, $d:ident $(; $($extra:tt)*)?) => {
        const _: () = {
            use idem_core::keys::{Claim, Settled};
            use idem_core::{
                Completion, Fingerprint, KeyStore, Policy, Scope, StoreError, StoredRecord,
            };
            use $crate::keys::{ClaimRequest, Refused};

            impl KeyStore for $store {
                type Tx = $tx;

                async fn claim(
                    &self,
                    scope: &Scope,
                    fingerprint: &Fingerprint,
                    policy: &Policy,
                    now_ms: i64,
                ) -> Result<Claim<$tx>, StoreError> {
                    let request = ClaimRequest {
                        fingerprint,
                        policy,
                        now_ms,
                    };
                    // One deadline for the read and the claim.
                    self.bounded_claim(policy.wait, async {
                        // Read first: a replay, a conflict or a request in
                        // flight is answered by the committed record,
                        // without a write.
                        if let Some(record) = self.read_first(scope).await?
                            && idem_core::keys::answered_by_read(
                                &record,
                                fingerprint,
                                policy,
                                now_ms,
                            )
                        {
                            return Ok(Claim::Existing(record));
                        }
                        self.claim_here(scope, request).await
                    })
                    .await
                }

                async fn complete(
                    &self,
                    tx: $tx,
                    scope: &Scope,
                    completion: &Completion,
                    now_ms: i64,
                ) -> Result<(), StoreError> {
                    match self.complete_message(tx, scope, completion, now_ms).await {
                        Ok(()) => Ok(()),
                        Err(Refused::Guard(())) => Err($crate::keys::no_longer_pending()),
                        Err(Refused::Store(e)) => Err(e),
                    }
                }

                async fn insert_completed(
                    &self,
                    tx: $tx,
                    scope: &Scope,
                    fingerprint: &Fingerprint,
                    completion: &Completion,
                    policy: &Policy,
                    now_ms: i64,
                ) -> Result<Settled, StoreError> {
                    let request = ClaimRequest {
                        fingerprint,
                        policy,
                        now_ms,
                    };
                    match self
                        .insert_completed_message(tx, scope, request, completion)
                        .await
                    {
                        Ok(()) => Ok(Settled::Committed),
                        Err(Refused::Guard(left)) => {
                            self.live_record(left, scope).await.map(Settled::Existing)
                        }
                        Err(Refused::Store(e)) => Err(e),
                    }
                }

                async fn begin(&self) -> Result<$tx, StoreError> {
                    self.begin_here().await
                }

                async fn commit(&self, tx: $tx) -> Result<(), StoreError> {
                    self.commit_here(tx).await
                }

                async fn rollback(&self, tx: $tx) -> Result<(), StoreError> {
                    self.rollback_here(tx).await
                }

                async fn fetch(&self, scope: &Scope) -> Result<Option<StoredRecord>, StoreError> {
                    self.bounded(self.read_first(scope)).await
                }

                async fn purge_expired(&self, now_ms: i64, limit: u32) -> Result<u64, StoreError> {
                    self.purge($crate::purge::$d::KEYS, now_ms, limit).await
                }

                $($($extra)*)?
            }
        };
    };
}
