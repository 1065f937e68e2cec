//! Key records: the [`KeyStore`] capability a backend implements, the record
//! states, what is stored for replay, and the pure [`decide`] function.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::clock::SharedClock;
use crate::error::StoreError;
use crate::fingerprint::Fingerprint;
use crate::policy::Policy;
use crate::scope::Scope;

/// The state of a key record.
///
/// In the single-transaction flow a `Pending` record is never visible to other
/// transactions: the claim and the completion commit together. A committed
/// `Pending` record means a multi-phase operation holds a lease on the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    /// Claimed; the operation is running.
    Pending,
    /// The operation succeeded; its response is stored for replay.
    Completed,
    /// The operation ended in a business error that is part of its contract
    /// (e.g. "card declined"); the error response is stored for replay.
    Failed,
}

impl RecordState {
    /// The name used in storage.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Completed => "completed",
            Self::Failed => "failed",
        }
    }

    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pending" => Some(Self::Pending),
            "completed" => Some(Self::Completed),
            "failed" => Some(Self::Failed),
            _ => None,
        }
    }
}

impl fmt::Display for RecordState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A response as stored for replay: status, allow-listed headers, body bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// Status code, e.g. 201.
    pub status: u16,
    /// Header names (lowercase) and values, in order.
    pub headers: Vec<(String, String)>,
    /// The exact body bytes.
    pub body: Vec<u8>,
}

impl StoredResponse {
    /// Encodes headers for storage as a JSON array of `[name, value]` pairs.
    pub fn headers_json(&self) -> String {
        crate::headers::to_json(&self.headers)
    }

    /// Decodes headers written by [`StoredResponse::headers_json`].
    pub fn parse_headers(json: &str) -> Option<Vec<(String, String)>> {
        crate::headers::from_json(json)
    }
}

/// A pointer to the resource an operation created, kept with the record so an
/// operator can find it (`payment`, `pay_123`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceRef {
    /// Kind of resource.
    pub kind: String,
    /// Its id.
    pub id: String,
}

/// A key record as read from a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    /// Fingerprint of the request that claimed the key.
    pub fingerprint: Fingerprint,
    /// Current state.
    pub state: RecordState,
    /// The stored outcome, present once `Completed` or `Failed`.
    pub response: Option<StoredResponse>,
    /// The resource the operation created, if it said.
    pub resource: Option<ResourceRef>,
    /// Until when a `Pending` record's lease holds (unix ms).
    pub locked_until_ms: Option<i64>,
    /// When the key was first claimed (unix ms).
    pub created_at_ms: i64,
    /// When the record may be deleted (unix ms).
    pub expires_at_ms: i64,
    /// A leased record's policy for an unknown outcome
    /// ([`crate::leased`]); `None` for the other claim paths.
    pub on_unknown: Option<OnUnknown>,
}

/// What a retry does with an abandoned record: its holder's work may have
/// reached another system and no answer came back (the holder said so, or
/// it stopped renewing its lease). Stored with the record as
/// [`OnUnknown::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OnUnknown {
    /// Take it over (a new token, a new lease) and do the work again with
    /// the same derived key: only for a system known to deduplicate by it.
    Reforward,
    /// Take it over and first learn whether the work landed (a lookup on
    /// the other system); do it again only once it is known it did not.
    Verify,
    /// Leave it to an operator: the work's outcome is unknown.
    Reject,
}

impl OnUnknown {
    /// Every policy, for listings and errors.
    pub const ALL: [OnUnknown; 3] = [Self::Reforward, Self::Verify, Self::Reject];

    /// The stored and configured name: `reforward`, `verify`, `reject`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reforward => "reforward",
            Self::Verify => "verify",
            Self::Reject => "reject",
        }
    }

    /// The policy of a stored or configured name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == name)
    }

    /// Whether a retry takes an abandoned record over (to do the work
    /// again, or to verify it first).
    pub fn takes_over(self) -> bool {
        self != Self::Reject
    }

    /// How strict the policy is: a retry honours the stricter of the
    /// record's and its own (`reforward` < `verify` < `reject`).
    pub fn strictness(self) -> u8 {
        match self {
            Self::Reforward => 0,
            Self::Verify => 1,
            Self::Reject => 2,
        }
    }

    /// Whether the work may be repeated without learning its outcome: only
    /// when the other system deduplicates. An operator who deletes such a
    /// record (a forced release) risks nothing; for the others they must
    /// have checked the other system first.
    pub fn repeat_is_harmless(self) -> bool {
        self == Self::Reforward
    }
}

impl fmt::Display for OnUnknown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A key record's columns as read from any backend, before validation.
#[derive(Debug, Clone, Default)]
pub struct RecordColumns {
    /// `request_hash`.
    pub request_hash: Vec<u8>,
    /// `state`.
    pub state: String,
    /// `status_code`.
    pub status_code: Option<i64>,
    /// `response_headers` (JSON list of pairs).
    pub response_headers: Option<String>,
    /// `response_body`.
    pub response_body: Option<Vec<u8>>,
    /// `resource_type`.
    pub resource_type: Option<String>,
    /// `resource_id`.
    pub resource_id: Option<String>,
    /// `locked_until_ms`.
    pub locked_until_ms: Option<i64>,
    /// `created_at_ms`.
    pub created_at_ms: i64,
    /// `expires_at_ms`.
    pub expires_at_ms: i64,
    /// `on_unknown`.
    pub on_unknown: Option<String>,
}

impl RecordColumns {
    /// Validates the columns into a record; the error says which one is bad.
    pub fn decode(self) -> Result<StoredRecord, StoreError> {
        let corrupt = |detail: String| StoreError::Corrupt { detail };
        let response = match (self.status_code, self.response_headers) {
            (Some(status), Some(headers)) => Some(StoredResponse {
                status: u16::try_from(status)
                    .map_err(|_| corrupt(format!("status code {status} out of range")))?,
                headers: StoredResponse::parse_headers(&headers).ok_or_else(|| {
                    corrupt("response headers are not a JSON list of pairs".into())
                })?,
                body: self.response_body.unwrap_or_default(),
            }),
            _ => None,
        };
        Ok(StoredRecord {
            fingerprint: Fingerprint::from_slice(&self.request_hash)
                .ok_or_else(|| corrupt("request hash is not 32 bytes".into()))?,
            state: RecordState::parse(&self.state)
                .ok_or_else(|| corrupt(format!("state {:?}", self.state)))?,
            response,
            resource: self
                .resource_type
                .zip(self.resource_id)
                .map(|(kind, id)| ResourceRef { kind, id }),
            locked_until_ms: self.locked_until_ms,
            created_at_ms: self.created_at_ms,
            expires_at_ms: self.expires_at_ms,
            on_unknown: match self.on_unknown.as_deref() {
                None => None,
                Some(name) => Some(
                    OnUnknown::parse(name)
                        .ok_or_else(|| corrupt(format!("on_unknown {name:?}")))?,
                ),
            },
        })
    }
}

/// What to store when an operation ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// `Completed` or `Failed`; never `Pending`.
    pub state: RecordState,
    /// The response to replay.
    pub response: StoredResponse,
    /// The resource created, if any.
    pub resource: Option<ResourceRef>,
}

impl Completion {
    /// The `resource_type` and `resource_id` columns.
    pub fn resource_columns(&self) -> (Option<&str>, Option<&str>) {
        self.resource
            .as_ref()
            .map(|r| (Some(r.kind.as_str()), Some(r.id.as_str())))
            .unwrap_or((None, None))
    }

    /// A successful outcome.
    pub fn completed(response: StoredResponse) -> Self {
        Self {
            state: RecordState::Completed,
            response,
            resource: None,
        }
    }

    /// A business error that is part of the operation's contract; it is stored
    /// and replayed like a success.
    pub fn failed(response: StoredResponse) -> Self {
        Self {
            state: RecordState::Failed,
            response,
            resource: None,
        }
    }

    /// Records which resource the operation created.
    pub fn with_resource(mut self, kind: impl Into<String>, id: impl Into<String>) -> Self {
        self.resource = Some(ResourceRef {
            kind: kind.into(),
            id: id.into(),
        });
        self
    }
}

/// What the engine decided about an existing record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Same request, finished: replay the stored outcome.
    Replay(StoredRecord),
    /// Same key, different request.
    Mismatch,
    /// Same request, still running elsewhere.
    InFlight {
        /// When to try again.
        retry_after: Duration,
    },
}

/// Decides what a request gets when its key already has a live record.
///
/// A different fingerprint is a mismatch whatever the state, so a client that
/// reuses a key by mistake learns it at once. This is pure logic, shared by all
/// backends.
pub fn decide(existing: StoredRecord, fingerprint: &Fingerprint, now_ms: i64) -> Decision {
    if existing.fingerprint != *fingerprint {
        return Decision::Mismatch;
    }
    match (existing.state, &existing.response) {
        (RecordState::Completed | RecordState::Failed, Some(_)) => Decision::Replay(existing),
        _ => {
            let left_ms = existing.locked_until_ms.unwrap_or(now_ms) - now_ms;
            let secs = (left_ms.max(0) as u64).div_ceil(1000).max(1);
            Decision::InFlight {
                retry_after: Duration::from_secs(secs),
            }
        }
    }
}

/// Whether a record read before any transaction is the answer by itself,
/// so the claim ends there ([`KeyStore::claim`]'s read-first step): a live
/// record with another fingerprint (a mismatch, whatever its state), a
/// completed or failed one (a replay), or — in optimistic mode, which never
/// waits for a lease — a pending one (in flight). An expired record, or a
/// pending one a pessimistic claim may wait for, goes on to the claim.
pub fn answered_by_read(
    record: &StoredRecord,
    fingerprint: &Fingerprint,
    policy: &Policy,
    now_ms: i64,
) -> bool {
    record.expires_at_ms > now_ms
        && (record.fingerprint != *fingerprint
            || record.state != RecordState::Pending
            || policy.mode == crate::ClaimMode::Optimistic)
}

/// The result of trying to claim a key.
#[derive(Debug)]
pub enum Claim<T> {
    /// The key was free (or its record had expired): the caller now owns the
    /// open transaction `T`, which holds a pending record (pessimistic mode)
    /// or nothing yet (optimistic mode). Business writes go into `T` and
    /// commit with the record.
    Claimed(T),
    /// A live record exists and was committed by someone else: read before
    /// any transaction, or found by the claim. The store has already ended
    /// its own transaction, if it opened one.
    Existing(StoredRecord),
}

/// The result of inserting a completed record at the end of an optimistic
/// transaction ([`KeyStore::insert_completed`]).
#[derive(Debug)]
pub enum Settled {
    /// The record was inserted and committed with the business writes.
    Committed,
    /// A live record was there first: the transaction, business writes
    /// included, was rolled back. This is that record.
    Existing(StoredRecord),
}

/// Key records, stored in the same database as the business data.
///
/// Implementations must enforce uniqueness with the primary key
/// `(tenant_id, operation, idempotency_key)` and an `INSERT … ON CONFLICT`, never
/// a read followed by a write, and must make a concurrent claim of the same key
/// wait at most `policy.wait` before returning [`StoreError::Busy`].
pub trait KeyStore: Clone + Send + Sync + 'static {
    /// An open database transaction handed to business code.
    type Tx: Send + 'static;

    /// Reads the committed record of `scope` first — one indexed read,
    /// outside any transaction — and returns it when
    /// [`answered_by_read`] says it is the answer. Otherwise opens a
    /// transaction and,
    /// in pessimistic mode, inserts a pending record unless a live one
    /// exists (then returns that one); in optimistic mode returns the
    /// transaction as it is.
    ///
    /// # Cancel safety
    /// Cancelling the future drops the transaction, which rolls it back.
    fn claim(
        &self,
        scope: &Scope,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now_ms: i64,
    ) -> impl Future<Output = Result<Claim<Self::Tx>, StoreError>> + Send;

    /// Stores the outcome on the record claimed in `tx` and commits the
    /// transaction, business writes included.
    fn complete(
        &self,
        tx: Self::Tx,
        scope: &Scope,
        completion: &Completion,
        now_ms: i64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Optimistic claims: inserts the completed record of `scope` in `tx`
    /// (a transaction from [`KeyStore::begin`]) and commits it with the
    /// business writes. A record that expired at or before `now_ms` is
    /// replaced; when a live one exists, `tx` is rolled back instead and that
    /// record returned. The primary key decides a race: of concurrent
    /// inserts exactly one commits.
    fn insert_completed(
        &self,
        tx: Self::Tx,
        scope: &Scope,
        fingerprint: &Fingerprint,
        completion: &Completion,
        policy: &Policy,
        now_ms: i64,
    ) -> impl Future<Output = Result<Settled, StoreError>> + Send;

    /// Opens a transaction that claims no key, for requests sent without one.
    fn begin(&self) -> impl Future<Output = Result<Self::Tx, StoreError>> + Send;

    /// Commits a transaction from [`KeyStore::begin`].
    fn commit(&self, tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Rolls back a transaction: the claim and every business write vanish.
    fn rollback(&self, tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Reads the committed record of `scope`, if any: one indexed read
    /// outside any transaction, taking no lock. The engine's read-first
    /// path answers replays from it.
    fn fetch(
        &self,
        scope: &Scope,
    ) -> impl Future<Output = Result<Option<StoredRecord>, StoreError>> + Send;

    /// Deletes at most `limit` records that expired at or before `now_ms` and
    /// returns how many it deleted.
    fn purge_expired(
        &self,
        now_ms: i64,
        limit: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// The clock this store's records are judged by: every lease, takeover
    /// and expiry decided on them by any process. Processes that share the
    /// records must read one clock, or one whose clock runs ahead takes over
    /// a live holder's lease.
    ///
    /// The default is this host's clock
    /// ([`SystemClock`](crate::SystemClock)), right when every process
    /// sharing the store runs on one host (SQLite). A store shared across
    /// hosts returns a clock that follows the database server's
    /// (`idem_postgres::PgStore` does, with a
    /// [`ReferenceClock`](crate::ReferenceClock)).
    /// [`Engine::new`](crate::Engine::new) and the components built on a key
    /// store take it by default.
    fn clock(&self) -> SharedClock {
        SharedClock::system()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(fp: [u8; 32], state: RecordState) -> StoredRecord {
        StoredRecord {
            fingerprint: Fingerprint::from_bytes(fp),
            state,
            response: (state != RecordState::Pending).then(|| StoredResponse {
                status: 201,
                headers: vec![("content-type".into(), "application/json".into())],
                body: b"{}".to_vec(),
            }),
            resource: None,
            locked_until_ms: (state == RecordState::Pending).then_some(10_500),
            created_at_ms: 0,
            expires_at_ms: 100_000,
            on_unknown: None,
        }
    }

    #[test]
    fn a_read_answers_every_live_record_but_a_pending_one_a_pessimistic_claim_waits_for() {
        let (same, other) = (
            Fingerprint::from_bytes([1; 32]),
            Fingerprint::from_bytes([2; 32]),
        );
        let (pessimistic, optimistic) = (Policy::default(), Policy::default().optimistic());
        for policy in [pessimistic, optimistic] {
            for state in [RecordState::Completed, RecordState::Failed] {
                assert!(answered_by_read(&record([1; 32], state), &same, &policy, 0));
            }
            for state in [RecordState::Pending, RecordState::Completed] {
                assert!(answered_by_read(
                    &record([1; 32], state),
                    &other,
                    &policy,
                    0
                ));
                // Expired: whatever it holds, the claim takes it over.
                assert!(!answered_by_read(
                    &record([1; 32], state),
                    &other,
                    &policy,
                    100_000
                ));
            }
        }
        let pending = record([1; 32], RecordState::Pending);
        assert!(!answered_by_read(&pending, &same, &pessimistic, 0));
        assert!(answered_by_read(&pending, &same, &optimistic, 0));
    }

    #[test]
    fn same_fingerprint_replays_completed_and_failed() {
        let fp = Fingerprint::from_bytes([1; 32]);
        for state in [RecordState::Completed, RecordState::Failed] {
            let r = record([1; 32], state);
            assert_eq!(decide(r.clone(), &fp, 0), Decision::Replay(r));
        }
    }

    #[test]
    fn different_fingerprint_is_a_mismatch_in_every_state() {
        let fp = Fingerprint::from_bytes([2; 32]);
        for state in [
            RecordState::Pending,
            RecordState::Completed,
            RecordState::Failed,
        ] {
            assert_eq!(decide(record([1; 32], state), &fp, 0), Decision::Mismatch);
        }
    }

    #[test]
    fn pending_is_in_flight_until_its_lease_ends() {
        let fp = Fingerprint::from_bytes([1; 32]);
        assert_eq!(
            decide(record([1; 32], RecordState::Pending), &fp, 10_000),
            Decision::InFlight {
                retry_after: Duration::from_secs(1)
            }
        );
        assert_eq!(
            decide(record([1; 32], RecordState::Pending), &fp, 7_000),
            Decision::InFlight {
                retry_after: Duration::from_secs(4)
            }
        );
    }

    #[test]
    fn columns_decode_or_name_the_bad_column() {
        let good = RecordColumns {
            request_hash: vec![7; 32],
            state: "completed".into(),
            status_code: Some(201),
            response_headers: Some(r#"[["content-type","application/json"]]"#.into()),
            response_body: Some(b"{}".to_vec()),
            resource_type: Some("payment".into()),
            resource_id: Some("p1".into()),
            created_at_ms: 1,
            expires_at_ms: 2,
            ..RecordColumns::default()
        };
        let r = good.clone().decode().unwrap();
        assert_eq!(r.state, RecordState::Completed);
        assert_eq!(r.response.unwrap().status, 201);
        assert_eq!(r.resource.unwrap().id, "p1");
        let bad = |c: RecordColumns| match c.decode() {
            Err(StoreError::Corrupt { detail }) => detail,
            other => panic!("expected Corrupt, got {other:?}"),
        };
        assert!(
            bad(RecordColumns {
                request_hash: vec![1; 31],
                ..good.clone()
            })
            .contains("hash")
        );
        assert!(
            bad(RecordColumns {
                state: "done".into(),
                ..good.clone()
            })
            .contains("state")
        );
        assert!(
            bad(RecordColumns {
                status_code: Some(70_000),
                ..good.clone()
            })
            .contains("status")
        );
        assert!(
            bad(RecordColumns {
                response_headers: Some("{".into()),
                ..good
            })
            .contains("headers")
        );
    }

    #[test]
    fn headers_roundtrip_through_json() {
        let r = StoredResponse {
            status: 200,
            headers: vec![("location".into(), "/v1/p/\"1\"".into())],
            body: vec![],
        };
        assert_eq!(
            StoredResponse::parse_headers(&r.headers_json()),
            Some(r.headers.clone())
        );
        assert_eq!(StoredResponse::parse_headers("{"), None);
    }
}
