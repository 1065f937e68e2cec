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
