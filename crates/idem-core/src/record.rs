//! Key records, their states, and what is stored for replay.

use std::fmt;
use std::time::Duration;

use crate::fingerprint::Fingerprint;

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
        serde_json::Value::Array(
            self.headers
                .iter()
                .map(|(n, v)| serde_json::json!([n, v]))
                .collect(),
        )
        .to_string()
    }

    /// Decodes headers written by [`StoredResponse::headers_json`].
    pub fn parse_headers(json: &str) -> Option<Vec<(String, String)>> {
        let pairs: Vec<(String, String)> = serde_json::from_str(json).ok()?;
        Some(pairs)
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
        }
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
