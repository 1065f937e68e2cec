//! The decoders both backends run: one per row shape, generic over any
//! [`sqlx::Row`] (see [`crate::row`]). Each reads the columns its
//! `idem-core` `*Columns` type holds, by name, and lets that type check
//! the values; the lists in [`crate::columns`] select them.

use idem_core::admin::{
    AuditEntry, InboxEntry, KeyColumns, KeyDetail, OutboxEntry, OutboxEntryColumns,
};
use idem_core::keys::RecordColumns;
use idem_core::outbox::{OutboxColumns, OutboxRecord};
use idem_core::steps::{
    MessageColumns, RunColumns, RunRecord, SentMessage, StepColumns, StepRecord,
};
use idem_core::tasks::{PollerRecord, TaskColumns, TaskEvent, TaskRecord, TaskState};
use idem_core::webhooks::{Receipt, ReceiptColumns};
use idem_core::{StoreError, StoredRecord};

use crate::row::{Columns, get, int, opt_int};

/// A key record's columns (the part every statement that returns a record
/// selects: [`crate::keys::SELECT_RECORD`]).
pub fn record_columns<R: Columns>(row: &R) -> Result<RecordColumns, StoreError> {
    Ok(RecordColumns {
        request_hash: get(row, "request_hash")?,
        state: get(row, "state")?,
        status_code: opt_int(row, "status_code")?,
        response_headers: get(row, "response_headers")?,
        response_body: get(row, "response_body")?,
        resource_type: get(row, "resource_type")?,
        resource_id: get(row, "resource_id")?,
        locked_until_ms: get(row, "locked_until_ms")?,
        created_at_ms: get(row, "created_at_ms")?,
        expires_at_ms: get(row, "expires_at_ms")?,
        on_unknown: get(row, "on_unknown")?,
    })
}

/// A key record.
pub fn record<R: Columns>(row: &R) -> Result<StoredRecord, StoreError> {
    record_columns(row)?.decode()
}

/// A key as the operator sees it ([`crate::columns::KEY_COLUMNS`]).
pub fn key_detail<R: Columns>(row: &R) -> Result<KeyDetail, StoreError> {
    KeyColumns {
        tenant: get(row, "tenant_id")?,
        operation: get(row, "operation")?,
        key: get(row, "idempotency_key")?,
        record: record_columns(row)?,
        recovery_point: get(row, "recovery_point")?,
        leased: get(row, "leased")?,
        updated_at_ms: get(row, "updated_at_ms")?,
    }
    .decode()
}

/// An outbox message as the operator sees it
/// ([`crate::columns::OUTBOX_ENTRY_COLUMNS`]).
pub fn outbox_entry<R: Columns>(row: &R) -> Result<OutboxEntry, StoreError> {
    OutboxEntryColumns {
        id: get(row, "id")?,
        message_id: get(row, "message_id")?,
        topic: get(row, "topic")?,
        message_key: get(row, "message_key")?,
        state: get(row, "state")?,
        attempts: int(row, "attempts")?,
        last_error: get(row, "last_error")?,
        created_at_ms: get(row, "created_at_ms")?,
        available_at_ms: get(row, "available_at_ms")?,
        sent_at_ms: get(row, "sent_at_ms")?,
        payload: get(row, "payload")?,
        headers: get(row, "headers")?,
    }
    .decode()
}

/// An outbox message as the dispatcher claims it.
pub fn outbox_record<R: Columns>(row: &R) -> Result<OutboxRecord, StoreError> {
    OutboxColumns {
        id: get(row, "id")?,
        message_id: get(row, "message_id")?,
        topic: get(row, "topic")?,
        message_key: get(row, "message_key")?,
        payload: get(row, "payload")?,
        headers: get(row, "headers")?,
        attempts: int(row, "attempts")?,
        created_at_ms: get(row, "created_at_ms")?,
    }
    .decode()
}

/// An inbox record.
pub fn inbox_entry<R: Columns>(row: &R) -> Result<InboxEntry, StoreError> {
    Ok(InboxEntry {
        subscriber: get(row, "subscriber_id")?,
        message_id: get(row, "message_id")?,
        processed_at_ms: get(row, "processed_at_ms")?,
        expires_at_ms: get(row, "expires_at_ms")?,
    })
}

/// An entry of the operators' audit log.
pub fn audit_entry<R: Columns>(row: &R) -> Result<AuditEntry, StoreError> {
    Ok(AuditEntry {
        id: get(row, "id")?,
        at_ms: get(row, "at_ms")?,
        actor: get(row, "actor")?,
        action: get(row, "action")?,
        target: get(row, "target")?,
        detail: get(row, "detail")?,
        idempotency_key: get(row, "idempotency_key")?,
    })
}

/// A run, without its steps ([`crate::columns::RUN_COLUMNS`]).
pub fn run<R: Columns>(row: &R) -> Result<RunRecord, StoreError> {
    RunColumns {
        id: get(row, "id")?,
        tenant_id: get(row, "tenant_id")?,
        operation: get(row, "operation")?,
        idempotency_key: get(row, "idempotency_key")?,
        state: get(row, "state")?,
        input: get(row, "input")?,
        recovery_point: get(row, "recovery_point")?,
        failure: get(row, "failure")?,
        blocked_step: get(row, "blocked_step")?,
        attention: get(row, "attention")?,
        no_return: get(row, "no_return")?,
        holder: get(row, "holder")?,
        locked_until_ms: get(row, "locked_until_ms")?,
        fence: get(row, "fence")?,
        takeovers: get(row, "takeovers")?,
        deadline_ms: get(row, "deadline_ms")?,
        ttl_ms: get(row, "ttl_ms")?,
        created_at_ms: get(row, "created_at_ms")?,
        updated_at_ms: get(row, "updated_at_ms")?,
        finished_at_ms: get(row, "finished_at_ms")?,
    }
    .decode()
}

/// A step, with the id of its run ([`crate::columns::STEP_COLUMNS`]).
pub fn step<R: Columns>(row: &R) -> Result<(String, StepRecord), StoreError> {
    StepColumns {
        run_id: get(row, "run_id")?,
        name: get(row, "name")?,
        seq: get(row, "seq")?,
        kind: get(row, "kind")?,
        state: get(row, "state")?,
        attempts: int(row, "attempts")?,
        failures: int(row, "failures")?,
        step_key: get(row, "step_key")?,
        fence: get(row, "fence")?,
        result: get(row, "result")?,
        error: get(row, "error")?,
        started_at_ms: get(row, "started_at_ms")?,
        finished_at_ms: get(row, "finished_at_ms")?,
        updated_at_ms: get(row, "updated_at_ms")?,
    }
    .decode()
}

/// An entry of the send-once ledger ([`crate::columns::MESSAGE_COLUMNS`]).
pub fn message<R: Columns>(row: &R) -> Result<SentMessage, StoreError> {
    MessageColumns {
        message_id: get(row, "message_id")?,
        run_id: get(row, "run_id")?,
        step: get(row, "step")?,
        state: get(row, "state")?,
        attempts: int(row, "attempts")?,
        created_at_ms: get(row, "created_at_ms")?,
        sent_at_ms: get(row, "sent_at_ms")?,
    }
    .decode()
}

/// A webhook receipt ([`crate::columns::RECEIPT_COLUMNS`]).
pub fn receipt<R: Columns>(row: &R) -> Result<Receipt, StoreError> {
    ReceiptColumns {
        id: get(row, "id")?,
        endpoint: get(row, "endpoint")?,
        delivery_id: get(row, "delivery_id")?,
        event_type: get(row, "event_type")?,
        headers: get(row, "headers")?,
        body: get(row, "body")?,
        entity_id: get(row, "entity_id")?,
        entity_version: get(row, "entity_version")?,
        content_sha256: get(row, "content_sha256")?,
        state: get(row, "state")?,
        attempts: int(row, "attempts")?,
        last_error: get(row, "last_error")?,
        received_at_ms: get(row, "received_at_ms")?,
        finished_at_ms: get(row, "finished_at_ms")?,
    }
    .decode()
}

/// A task ([`crate::tasks::TASK_COLUMNS`]).
pub fn task<R: Columns>(row: &R) -> Result<TaskRecord, StoreError> {
    TaskColumns {
        id: get(row, "id")?,
        tenant: get(row, "tenant_id")?,
        queue: get(row, "queue")?,
        key: get(row, "task_key")?,
        payload: get(row, "payload")?,
        payload_hash: get(row, "payload_hash")?,
        state: get(row, "state")?,
        priority: get(row, "priority")?,
        run_at_ms: get(row, "run_at_ms")?,
        attempt: get(row, "attempt")?,
        max_attempts: get(row, "max_attempts")?,
        fence: get(row, "fence")?,
        holder: get(row, "holder")?,
        lease_expires_at_ms: get(row, "lease_expires_at_ms")?,
        result: get(row, "result")?,
        result_hash: get(row, "result_hash")?,
        last_error: get(row, "last_error")?,
        created_at_ms: get(row, "created_at_ms")?,
        updated_at_ms: get(row, "updated_at_ms")?,
        finished_at_ms: get(row, "finished_at_ms")?,
        claim_kind: get(row, "claim_kind")?,
    }
    .decode()
}

/// One entry of a task's timeline ([`crate::tasks::EVENTS`]).
pub fn task_event<R: Columns>(row: &R) -> Result<TaskEvent, StoreError> {
    Ok(TaskEvent {
        seq: get(row, "seq")?,
        kind: get(row, "kind")?,
        actor: get(row, "actor")?,
        fence: get(row, "fence")?,
        at_ms: get(row, "at_ms")?,
        detail: get(row, "detail")?,
    })
}

/// A poller's cursor ([`crate::tasks::CURSOR`]).
pub fn poller<R: Columns>(row: &R) -> Result<PollerRecord, StoreError> {
    Ok(PollerRecord {
        tenant: get(row, "tenant_id")?,
        poller: get(row, "poller")?,
        cursor: get(row, "cursor")?,
        version: get(row, "version")?,
        updated_at_ms: get(row, "updated_at_ms")?,
    })
}

/// One queue's count of one state ([`crate::tasks::COUNT`]).
pub fn task_count<R: Columns>(row: &R) -> Result<(String, TaskState, u64), StoreError> {
    let state: String = get(row, "state")?;
    let n: i64 = get(row, "n")?;
    Ok((
        get(row, "queue")?,
        TaskState::parse(&state).ok_or_else(|| StoreError::Corrupt {
            detail: format!("task state {state:?}"),
        })?,
        u64::try_from(n).unwrap_or(0),
    ))
}
