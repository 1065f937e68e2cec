//! The column lists every backend selects, in the order `idem-core`'s
//! decoders (`KeyColumns`, `OutboxEntryColumns`, `RunColumns`,
//! `StepColumns`, `MessageColumns`) read them.

/// The key record columns both backends select for the admin views
/// (`leased` is `lock_token IS NOT NULL`; the list selects `NULL` for the
/// response columns).
pub const KEY_COLUMNS: &str = "tenant_id, operation, idempotency_key, request_hash, state, \
    status_code, response_headers, response_body, resource_type, resource_id, recovery_point, \
    locked_until_ms, lock_token IS NOT NULL AS leased, created_at_ms, updated_at_ms, expires_at_ms, \
    on_unknown";

/// [`KEY_COLUMNS`] without the stored response (listings).
pub const KEY_LIST_COLUMNS: &str = "tenant_id, operation, idempotency_key, request_hash, state, \
    status_code, NULL AS response_headers, NULL AS response_body, resource_type, resource_id, \
    recovery_point, locked_until_ms, lock_token IS NOT NULL AS leased, created_at_ms, \
    updated_at_ms, expires_at_ms, on_unknown";

/// The outbox columns [`OutboxEntryColumns`](idem_core::admin::OutboxEntryColumns) holds, as both backends select them.
pub const OUTBOX_ENTRY_COLUMNS: &str = "id, message_id, topic, message_key, state, attempts, \
    last_error, created_at_ms, available_at_ms, sent_at_ms, payload, headers";

/// The columns of `idem_runs`, in the order every backend selects them.
pub const RUN_COLUMNS: &str = "id, tenant_id, operation, idempotency_key, state, input, \
    recovery_point, failure, blocked_step, attention, no_return, holder, locked_until_ms, fence, \
    takeovers, deadline_ms, ttl_ms, created_at_ms, updated_at_ms, finished_at_ms";

/// The columns of `idem_run_steps`, in the order every backend selects them.
pub const STEP_COLUMNS: &str = "run_id, name, seq, kind, state, attempts, failures, step_key, \
    fence, result, error, started_at_ms, finished_at_ms, updated_at_ms";

/// The columns of `idem_send_once`, in the order every backend selects them.
pub const MESSAGE_COLUMNS: &str =
    "message_id, run_id, step, state, attempts, created_at_ms, sent_at_ms";

/// The columns of `idem_webhook_receipts` [`ReceiptColumns`](idem_core::webhooks::ReceiptColumns)
/// holds, as every backend selects them.
pub const RECEIPT_COLUMNS: &str = "id, endpoint, delivery_id, event_type, headers, body, \
    entity_id, entity_version, content_sha256, state, attempts, last_error, received_at_ms, \
    finished_at_ms";
