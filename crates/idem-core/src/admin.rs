//! What an operator's console reads and does: pages of key records, outbox
//! messages, inbox records, receipts, runs and the audit log (keyset
//! cursors, never `OFFSET`), counts by state, and the actions (release a
//! stuck leased key, requeue a dead outbox message, replay a receipt, end a
//! run's lease) — the actions in the caller's transaction, so the audit row
//! written beside them commits with them. The [`AdminStore`] trait; pure
//! types, no I/O.

use std::fmt;
use std::future::Future;

use crate::error::StoreError;
use crate::fingerprint::Fingerprint;
use crate::keys::{KeyStore, RecordState, ResourceRef, StoredResponse};
use crate::leased::OnUnknown;
use crate::scope::{Operation, Scope, Tenant};
use crate::steps::{RunId, RunRecord, RunState};
use crate::webhooks::{Receipt, ReceiptState, Requeue};

/// The largest page any admin listing returns.
pub const MAX_PAGE: u32 = 200;

/// The `LIKE` pattern matching strings that start with `prefix`, with `\`
/// as the escape character (`LIKE ? ESCAPE '\'`): `%`, `_` and `\` in the
/// prefix match themselves only.
pub fn like_prefix(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('%');
    out
}

/// Which key records [`AdminStore::list_keys`] returns, ordered by
/// `(tenant, operation, key)`.
#[derive(Debug, Clone, Default)]
pub struct KeyFilter {
    /// Only this tenant.
    pub tenant: Option<Tenant>,
    /// Only this operation.
    pub operation: Option<Operation>,
    /// Only keys starting with this (matched literally, case-sensitively).
    pub prefix: Option<String>,
    /// Only records in this state.
    pub state: Option<RecordState>,
    /// Only records after this `(tenant, operation, key)` (the cursor).
    pub after: Option<(String, String, String)>,
    /// At most this many (1 to [`MAX_PAGE`]).
    pub limit: u32,
}

/// A key record as listed (no stored body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySummary {
    /// Tenant.
    pub tenant: String,
    /// Operation.
    pub operation: String,
    /// The idempotency key.
    pub key: String,
    /// Fingerprint of the request that claimed it.
    pub fingerprint: Fingerprint,
    /// State.
    pub state: RecordState,
    /// The stored status, once finished.
    pub status: Option<u16>,
    /// First claimed (unix ms).
    pub created_at_ms: i64,
    /// Last written (unix ms).
    pub updated_at_ms: i64,
    /// When it may be deleted (unix ms).
    pub expires_at_ms: i64,
    /// Until when a pending record's lease holds (unix ms).
    pub locked_until_ms: Option<i64>,
    /// Whether a lease token holds it (a gateway forward).
    pub leased: bool,
}

/// One key record with what it stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyDetail {
    /// The listed fields.
    pub summary: KeySummary,
    /// The stored response, once finished.
    pub response: Option<StoredResponse>,
    /// The resource the operation created.
    pub resource: Option<ResourceRef>,
    /// A multi-phase operation's recovery point; for a leased record whose
    /// work's outcome became unknown, why (`timeout`, `status 502`, …).
    pub recovery_point: Option<String>,
    /// A leased record's policy for an unknown outcome (what a retry does,
    /// and whether an operator may release it without checking upstream).
    pub on_unknown: Option<OnUnknown>,
}

/// A key record's admin columns as read from any backend, before validation.
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct KeyColumns {
    pub tenant: String,
    pub operation: String,
    pub key: String,
    pub record: crate::keys::RecordColumns,
    pub recovery_point: Option<String>,
    pub leased: bool,
    pub updated_at_ms: i64,
}

impl KeyColumns {
    /// Validates the columns (the response only when they hold one).
    pub fn decode(self) -> Result<KeyDetail, StoreError> {
        let status = self.record.status_code;
        let created_at_ms = self.record.created_at_ms;
        let record = self.record.decode()?;
        let on_unknown = record.on_unknown;
        Ok(KeyDetail {
            summary: KeySummary {
                tenant: self.tenant,
                operation: self.operation,
                key: self.key,
                fingerprint: record.fingerprint,
                state: record.state,
                status: status.and_then(|s| u16::try_from(s).ok()),
                created_at_ms,
                updated_at_ms: self.updated_at_ms,
                expires_at_ms: record.expires_at_ms,
                locked_until_ms: record.locked_until_ms,
                leased: self.leased,
            },
            response: record.response,
            resource: record.resource,
            recovery_point: self.recovery_point,
            on_unknown,
        })
    }
}

/// What [`AdminStore::release_key`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRelease {
    /// Deleted: the next retry claims afresh; the old holder's token writes
    /// nothing any more.
    Released,
    /// No such record.
    NotFound,
    /// Finished (completed or failed): nothing to release.
    NotPending(RecordState),
    /// Pending without a lease: held by an open transaction or a run.
    NotReleasable,
    /// Its lease still holds (until this unix ms) and `force` was not given.
    LeaseLive(i64),
    /// Its work's outcome may be unknown and repeating it is not harmless
    /// (this policy, or none recorded): the operator did not confirm that
    /// they checked the other system.
    UpstreamUnchecked(Option<OnUnknown>),
}

/// What an operator asks of [`AdminStore::release_key`]. Releasing deletes
/// the record, so the next retry does the work again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReleaseRequest {
    /// Release a live lease too. Its holder loses every later write (its
    /// token finds nothing), but the work it started — a forward already
    /// sent — keeps running in the other system and may still land there.
    pub force: bool,
    /// The operator checked the other system: the work did not land (and,
    /// with `force`, is not still running there). Required unless the
    /// record's policy is [`OnUnknown::Reforward`] (a system that
    /// deduplicates makes a repeat harmless).
    pub upstream_checked: bool,
}

/// The columns [`release_decision`] reads, in the action's transaction.
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct ReleaseColumns {
    pub state: String,
    pub lock_token: Option<String>,
    pub locked_until_ms: Option<i64>,
    pub on_unknown: Option<String>,
}

/// The row of the backends' release `SELECT` (`idem_sql::keys::RELEASE_SELECT`), as a driver decodes it.
pub type ReleaseRow = (String, Option<String>, Option<i64>, Option<String>);

impl From<ReleaseRow> for ReleaseColumns {
    fn from((state, lock_token, locked_until_ms, on_unknown): ReleaseRow) -> Self {
        Self {
            state,
            lock_token,
            locked_until_ms,
            on_unknown,
        }
    }
}

/// Whether a record may be released (pure logic, shared by every backend's
/// [`AdminStore::release_key`]): `Ok` with the lease token to delete with,
/// or the answer that releases nothing.
pub fn release_decision(
    cols: ReleaseColumns,
    request: ReleaseRequest,
    now_ms: i64,
) -> Result<Result<String, KeyRelease>, StoreError> {
    let state = RecordState::parse(&cols.state).ok_or_else(|| StoreError::Corrupt {
        detail: format!("key state {:?}", cols.state),
    })?;
    if state != RecordState::Pending {
        return Ok(Err(KeyRelease::NotPending(state)));
    }
    let Some(token) = cols.lock_token else {
        return Ok(Err(KeyRelease::NotReleasable));
    };
    if let Some(until) = cols.locked_until_ms.filter(|u| *u > now_ms)
        && !request.force
    {
        return Ok(Err(KeyRelease::LeaseLive(until)));
    }
    let policy = cols.on_unknown.as_deref().and_then(OnUnknown::parse);
    if !policy.is_some_and(OnUnknown::repeat_is_harmless) && !request.upstream_checked {
        return Ok(Err(KeyRelease::UpstreamUnchecked(policy)));
    }
    Ok(Ok(token))
}

/// The state of an outbox message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutboxState {
    /// Waiting to be published (or backing off).
    Pending,
    /// Published.
    Sent,
    /// Out of attempts.
    Dead,
}

impl OutboxState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Sent => "sent",
            Self::Dead => "dead",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pending" => Some(Self::Pending),
            "sent" => Some(Self::Sent),
            "dead" => Some(Self::Dead),
            _ => None,
        }
    }
}

impl fmt::Display for OutboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which outbox messages [`AdminStore::list_outbox`] returns, newest id first.
#[derive(Debug, Clone, Default)]
pub struct OutboxFilter {
    /// Only this state.
    pub state: Option<OutboxState>,
    /// Only this topic.
    pub topic: Option<String>,
    /// Only ids below this (the cursor).
    pub before_id: Option<i64>,
    /// At most this many (1 to [`MAX_PAGE`]).
    pub limit: u32,
}

/// An outbox message as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEntry {
    /// Row id.
    pub id: i64,
    /// Message id.
    pub message_id: String,
    /// Topic.
    pub topic: String,
    /// Ordering key.
    pub message_key: String,
    /// State.
    pub state: OutboxState,
    /// Failed attempts.
    pub attempts: u32,
    /// The last failure.
    pub last_error: Option<String>,
    /// Written (unix ms).
    pub created_at_ms: i64,
    /// Publishable from (unix ms).
    pub available_at_ms: i64,
    /// Published (unix ms).
    pub sent_at_ms: Option<i64>,
    /// Payload bytes.
    pub payload: Vec<u8>,
    /// Headers.
    pub headers: Vec<(String, String)>,
}

/// The raw columns of an outbox row, decoded by [`OutboxEntryColumns::decode`].
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct OutboxEntryColumns {
    pub id: i64,
    pub message_id: String,
    pub topic: String,
    pub message_key: String,
    pub state: String,
    pub attempts: i64,
    pub last_error: Option<String>,
    pub created_at_ms: i64,
    pub available_at_ms: i64,
    pub sent_at_ms: Option<i64>,
    pub payload: Vec<u8>,
    pub headers: String,
}

impl OutboxEntryColumns {
    /// Validates the columns.
    pub fn decode(self) -> Result<OutboxEntry, StoreError> {
        let corrupt = |what: &str| StoreError::Corrupt {
            detail: format!("outbox {}: {what}", self.id),
        };
        Ok(OutboxEntry {
            state: OutboxState::parse(&self.state).ok_or_else(|| corrupt("state"))?,
            attempts: u32::try_from(self.attempts).map_err(|_| corrupt("attempts"))?,
            headers: crate::headers::from_json(&self.headers)
                .ok_or_else(|| corrupt("headers are not a JSON list of pairs"))?,
            id: self.id,
            message_id: self.message_id,
            topic: self.topic,
            message_key: self.message_key,
            last_error: self.last_error,
            created_at_ms: self.created_at_ms,
            available_at_ms: self.available_at_ms,
            sent_at_ms: self.sent_at_ms,
            payload: self.payload,
        })
    }
}

/// What [`AdminStore::requeue_outbox`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboxRequeue {
    /// A dead message is pending again: attempts 0, available now.
    Requeued,
    /// Not dead: nothing changed.
    NotDead(OutboxState),
    /// No such message.
    NotFound,
}

/// An inbox record: a message a subscriber processed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxEntry {
    /// The subscriber.
    pub subscriber: String,
    /// The message id.
    pub message_id: String,
    /// When it was processed (unix ms).
    pub processed_at_ms: i64,
    /// When the record may be deleted (unix ms).
    pub expires_at_ms: i64,
}

/// Which inbox records [`AdminStore::list_inbox`] returns, newest first
/// (by `processed_at_ms`, then subscriber and message id, descending).
#[derive(Debug, Clone, Default)]
pub struct InboxFilter {
    /// Only this subscriber.
    pub subscriber: Option<String>,
    /// Only records before this `(processed_at_ms, subscriber, message_id)`.
    pub before: Option<(i64, String, String)>,
    /// At most this many (1 to [`MAX_PAGE`]).
    pub limit: u32,
}

/// Which receipts [`AdminStore::list_receipts_page`] returns, newest id first.
#[derive(Debug, Clone, Default)]
pub struct ReceiptFilter {
    /// Only this endpoint.
    pub endpoint: Option<String>,
    /// Only this state.
    pub state: Option<ReceiptState>,
    /// Only ids below this (the cursor).
    pub before_id: Option<i64>,
    /// At most this many (1 to [`MAX_PAGE`]).
    pub limit: u32,
}

/// Which runs [`AdminStore::list_runs_page`] returns, newest first (by
/// `created_at_ms`, then id, descending).
#[derive(Debug, Clone, Default)]
pub struct RunPageFilter {
    /// Only this state.
    pub state: Option<RunState>,
    /// Only this operation.
    pub operation: Option<Operation>,
    /// Only runs before this `(created_at_ms, id)` (the cursor).
    pub before: Option<(i64, String)>,
    /// At most this many (1 to [`MAX_PAGE`]).
    pub limit: u32,
}

/// What [`AdminStore::end_run_lease`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseEnd {
    /// The lease ends now: a recovery worker takes the run over (fence + 1).
    Ended,
    /// The run is final.
    Final(RunState),
    /// The run waits for an operator's resolution, not for an executor.
    NeedsAttention,
    /// No such run.
    NotFound,
}

/// Counts of rows by state (`state`, count), states without rows left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateCounts {
    /// Key records.
    pub keys: Vec<(String, u64)>,
    /// Runs.
    pub runs: Vec<(String, u64)>,
    /// Webhook receipts.
    pub receipts: Vec<(String, u64)>,
}

/// An audit row to write.
#[derive(Debug, Clone, Copy)]
pub struct NewAudit<'a> {
    /// When (unix ms).
    pub at_ms: i64,
    /// Who.
    pub actor: &'a str,
    /// What (`keys.release`).
    pub action: &'a str,
    /// On what (`tenant/operation/key`, a message id, a run id).
    pub target: &'a str,
    /// Details, a JSON object as text.
    pub detail: &'a str,
    /// The admin request's idempotency key.
    pub idempotency_key: Option<&'a str>,
}

/// A stored audit row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    /// Row id, increasing.
    pub id: i64,
    /// When (unix ms).
    pub at_ms: i64,
    /// Who.
    pub actor: String,
    /// What.
    pub action: String,
    /// On what.
    pub target: String,
    /// Details, a JSON object as text.
    pub detail: String,
    /// The admin request's idempotency key.
    pub idempotency_key: Option<String>,
}

/// Which audit rows [`AdminStore::list_audit`] returns, newest first.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    /// Only this action.
    pub action: Option<String>,
    /// Only ids below this (the cursor).
    pub before_id: Option<i64>,
    /// At most this many (1 to [`MAX_PAGE`]).
    pub limit: u32,
}

/// The page size actually used: `limit` clamped to 1..=[`MAX_PAGE`].
pub fn page(limit: u32) -> i64 {
    i64::from(limit.clamp(1, MAX_PAGE))
}

/// What an operator reads and does, over the tables of every capability.
///
/// Listings are keyset-paginated (the filter's cursor names the last row
/// seen; rows are never skipped or repeated while others are inserted) and
/// bounded by [`MAX_PAGE`]. Actions take the caller's transaction, so an
/// audit row ([`AdminStore::insert_audit`]) commits with the action or not
/// at all; each is decided in the transaction (row locked on PostgreSQL).
pub trait AdminStore: KeyStore {
    /// Key records, ordered by `(tenant, operation, key)`.
    fn list_keys(
        &self,
        filter: &KeyFilter,
    ) -> impl Future<Output = Result<Vec<KeySummary>, StoreError>> + Send;

    /// One key record with its stored response.
    fn key_detail(
        &self,
        scope: &Scope,
    ) -> impl Future<Output = Result<Option<KeyDetail>, StoreError>> + Send;

    /// In `tx`: deletes a pending *leased* record (the next claim starts
    /// afresh with a new token; the old token's writes find nothing), as
    /// [`release_decision`] allows: a live lease only with `force`, and a
    /// record whose repeat is not harmless only when the operator checked
    /// upstream.
    fn release_key<'a>(
        tx: &'a mut Self::Tx,
        scope: &'a Scope,
        request: ReleaseRequest,
        now_ms: i64,
    ) -> impl Future<Output = Result<KeyRelease, StoreError>> + Send + 'a;

    /// Counts of key records, runs and receipts by state.
    fn state_counts(&self) -> impl Future<Output = Result<StateCounts, StoreError>> + Send;

    /// Outbox messages, newest id first.
    fn list_outbox(
        &self,
        filter: &OutboxFilter,
    ) -> impl Future<Output = Result<Vec<OutboxEntry>, StoreError>> + Send;

    /// In `tx`: a dead message becomes pending (attempts 0, available at
    /// `now_ms`, no lease).
    fn requeue_outbox<'a>(
        tx: &'a mut Self::Tx,
        message_id: &'a str,
        now_ms: i64,
    ) -> impl Future<Output = Result<OutboxRequeue, StoreError>> + Send + 'a;

    /// One inbox record.
    fn inbox_entry(
        &self,
        subscriber: &str,
        message_id: &str,
    ) -> impl Future<Output = Result<Option<InboxEntry>, StoreError>> + Send;

    /// Inbox records, newest first.
    fn list_inbox(
        &self,
        filter: &InboxFilter,
    ) -> impl Future<Output = Result<Vec<InboxEntry>, StoreError>> + Send;

    /// Webhook receipts, newest id first.
    fn list_receipts_page(
        &self,
        filter: &ReceiptFilter,
    ) -> impl Future<Output = Result<Vec<Receipt>, StoreError>> + Send;

    /// In `tx`: [`WebhookStore::replay_receipt`](crate::webhooks::WebhookStore::replay_receipt).
    fn replay_receipt_in<'a>(
        tx: &'a mut Self::Tx,
        endpoint: &'a str,
        delivery_id: &'a str,
        now_ms: i64,
    ) -> impl Future<Output = Result<Requeue, StoreError>> + Send + 'a;

    /// Runs without their steps, newest first.
    fn list_runs_page(
        &self,
        filter: &RunPageFilter,
    ) -> impl Future<Output = Result<Vec<RunRecord>, StoreError>> + Send;

    /// In `tx`: a live run's lease ends at `now_ms`, so the next recovery
    /// round takes it over (adding one to its fence).
    fn end_run_lease<'a>(
        tx: &'a mut Self::Tx,
        id: &'a RunId,
        now_ms: i64,
    ) -> impl Future<Output = Result<LeaseEnd, StoreError>> + Send + 'a;

    /// In `tx`: writes an audit row; returns its id.
    fn insert_audit<'a>(
        tx: &'a mut Self::Tx,
        entry: &'a NewAudit<'a>,
    ) -> impl Future<Output = Result<i64, StoreError>> + Send + 'a;

    /// Audit rows, newest first.
    fn list_audit(
        &self,
        filter: &AuditFilter,
    ) -> impl Future<Output = Result<Vec<AuditEntry>, StoreError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_prefixes_match_wildcards_literally() {
        assert_eq!(like_prefix("ord-"), "ord-%");
        assert_eq!(like_prefix("50%_off\\"), "50\\%\\_off\\\\%");
        assert_eq!(like_prefix(""), "%");
    }

    #[test]
    fn outbox_states_round_trip() {
        for s in [OutboxState::Pending, OutboxState::Sent, OutboxState::Dead] {
            assert_eq!(OutboxState::parse(s.as_str()), Some(s));
        }
        assert_eq!(OutboxState::parse("gone"), None);
        assert_eq!(page(0), 1);
        assert_eq!(page(5000), i64::from(MAX_PAGE));
    }
}
