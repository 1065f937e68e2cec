//! The key record's statements shared by the engine's store and the
//! operator's release (`$1`..`$3` always the scope: tenant, operation, key).

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
/// `int`, the width of the driver's `INTEGER`).
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
    };
}
