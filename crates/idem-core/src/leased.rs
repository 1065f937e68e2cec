//! Keys claimed with a lease and committed at once: for a request whose
//! work happens outside the database (a gateway forwarding it to another
//! service), so no transaction can stay open around it.
//!
//! The claim commits a `pending` record holding a [`LeaseToken`] and a
//! lease deadline before the work starts. The holder renews the lease while
//! it works and ends the record with its token: it stores the outcome
//! ([`LeasedKeyStore::complete_leased`]) or deletes the record
//! ([`LeasedKeyStore::release_leased`]) so a retry does the work again.
//! Every write after the claim is conditional on the token: a holder that
//! lost its lease (paused past it while another took over) changes nothing.
//!
//! A holder that died leaves a pending record whose lease runs out. What a
//! retry does then is the caller's choice ([`OnAbandoned`]): take the
//! record over and do the work again — safe when the work is itself
//! idempotent, as a forward with a derived `Idempotency-Key` is — or stop
//! and leave the record to an operator ([`LeasedKeyStore::resolve_abandoned`]).

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::error::StoreError;
use crate::fingerprint::Fingerprint;
use crate::keys::{Completion, KeyStore, RecordState, StoredRecord};
use crate::policy::Policy;
use crate::scope::Scope;

/// The secret-free identity of one holder of one lease: 32 lowercase hex
/// digits, drawn at random for every claim and takeover.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LeaseToken(String);

impl LeaseToken {
    /// A fresh token.
    pub fn new() -> Self {
        Self(uuid::Uuid::new_v4().simple().to_string())
    }

    /// The token as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for LeaseToken {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not a secret, but long and useless in logs: the first 8 digits.
        write!(f, "LeaseToken({}…)", &self.0[..8.min(self.0.len())])
    }
}

/// What a retry does with a pending record whose holder stopped renewing
/// its lease (it died, or it is stuck).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnAbandoned {
    /// Take it over (a new token, a new lease) and do the work again.
    TakeOver,
    /// Leave it to an operator: the work's outcome is unknown.
    Stop,
}

/// What [`LeasedKeyStore::claim_leased`] did.
#[derive(Debug)]
pub enum LeasedClaim {
    /// The key was free (or its record had expired): a pending record with
    /// the token is committed.
    Claimed,
    /// The key's pending record was abandoned (its lease ran out) and the
    /// request is the same: it now holds the token and a new lease.
    TakenOver,
    /// A record exists and stays as it was (see [`leased_decision`]).
    Existing(StoredRecord),
}

/// What a request gets from an existing record, when it may not or did
/// not take it over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeasedDecision {
    /// Finished with this request: replay it.
    Replay(StoredRecord),
    /// The key was used with another request.
    Mismatch,
    /// Another holder's lease is live: wait, or try again after this long.
    InFlight {
        /// When its lease runs out (at the latest).
        retry_after: Duration,
    },
    /// Its holder stopped renewing the lease and the outcome of its work is
    /// unknown ([`OnAbandoned::Stop`]).
    Abandoned,
}

/// Decides what a request gets from an existing record (pure logic, shared
/// by every backend and caller). A pending record without a lease deadline
/// belongs to a transaction or a run, not to a lease: it is in flight.
pub fn leased_decision(
    existing: StoredRecord,
    fingerprint: &Fingerprint,
    now_ms: i64,
) -> LeasedDecision {
    if existing.fingerprint != *fingerprint {
        return LeasedDecision::Mismatch;
    }
    match (existing.state, &existing.response, existing.locked_until_ms) {
        (RecordState::Completed | RecordState::Failed, Some(_), _) => {
            LeasedDecision::Replay(existing)
        }
        (RecordState::Pending, _, Some(until)) if until <= now_ms => LeasedDecision::Abandoned,
        (_, _, until) => {
            let left_ms = until.unwrap_or(now_ms) - now_ms;
            let secs = (left_ms.max(0) as u64).div_ceil(1000).max(1);
            LeasedDecision::InFlight {
                retry_after: Duration::from_secs(secs),
            }
        }
    }
}

/// How an operator ends an abandoned record
/// ([`LeasedKeyStore::resolve_abandoned`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// Delete the record: the next retry does the work again.
    Release,
    /// Store this outcome: every retry gets it.
    Answer(Completion),
}

/// Key records claimed with a lease. Implemented by the backends next to
/// [`KeyStore`], on the same `idem_keys` table, so a key is one key whichever
/// path claimed it.
pub trait LeasedKeyStore: KeyStore {
    /// Claims `scope` for `token` until `locked_until_ms` and commits:
    /// inserts a pending record unless a live one exists. With
    /// [`OnAbandoned::TakeOver`], a pending record of the same request whose
    /// lease ran out is taken over (token and lease replaced). Otherwise the
    /// record is returned unchanged.
    #[allow(clippy::too_many_arguments)]
    fn claim_leased(
        &self,
        scope: &Scope,
        fingerprint: &Fingerprint,
        policy: &Policy,
        token: &LeaseToken,
        locked_until_ms: i64,
        on_abandoned: OnAbandoned,
        now_ms: i64,
    ) -> impl Future<Output = Result<LeasedClaim, StoreError>> + Send;

    /// Moves the lease deadline of a pending record `token` holds; `false`
    /// when it holds none (taken over, ended, expired and reclaimed).
    fn renew_leased(
        &self,
        scope: &Scope,
        token: &LeaseToken,
        locked_until_ms: i64,
        now_ms: i64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Stores the outcome on the pending record `token` holds and commits;
    /// `false` (nothing written) when it holds none.
    fn complete_leased(
        &self,
        scope: &Scope,
        token: &LeaseToken,
        completion: &Completion,
        now_ms: i64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Deletes the pending record `token` holds, so a retry does the work
    /// again; `false` when it holds none.
    fn release_leased(
        &self,
        scope: &Scope,
        token: &LeaseToken,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// An operator's end of an abandoned record: a pending record whose
    /// lease ran out by `now_ms` is deleted or given an outcome. `false`
    /// when there is no such record (finished, live, absent).
    fn resolve_abandoned(
        &self,
        scope: &Scope,
        resolution: &Resolution,
        now_ms: i64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::StoredResponse;

    fn record(fp: [u8; 32], state: RecordState, until: Option<i64>) -> StoredRecord {
        StoredRecord {
            fingerprint: Fingerprint::from_bytes(fp),
            state,
            response: (state != RecordState::Pending).then(|| StoredResponse {
                status: 201,
                headers: vec![],
                body: b"{}".to_vec(),
            }),
            resource: None,
            locked_until_ms: until,
            created_at_ms: 0,
            expires_at_ms: 1_000_000,
        }
    }

    #[test]
    fn a_live_lease_is_in_flight_until_it_runs_out_then_abandoned() {
        let fp = Fingerprint::from_bytes([1; 32]);
        let live = record([1; 32], RecordState::Pending, Some(2_500));
        assert_eq!(
            leased_decision(live.clone(), &fp, 1_000),
            LeasedDecision::InFlight {
                retry_after: Duration::from_secs(2)
            }
        );
        assert_eq!(leased_decision(live, &fp, 2_500), LeasedDecision::Abandoned);
        // A transaction's or a run's pending record has no lease deadline.
        let open = record([1; 32], RecordState::Pending, None);
        assert!(matches!(
            leased_decision(open, &fp, 9_999_999),
            LeasedDecision::InFlight { .. }
        ));
    }

    #[test]
    fn finished_replays_and_another_request_is_a_mismatch_in_every_state() {
        let fp = Fingerprint::from_bytes([1; 32]);
        for state in [RecordState::Completed, RecordState::Failed] {
            assert!(matches!(
                leased_decision(record([1; 32], state, None), &fp, 0),
                LeasedDecision::Replay(_)
            ));
        }
        for (state, until) in [
            (RecordState::Pending, Some(0)),
            (RecordState::Pending, Some(10_000)),
            (RecordState::Completed, None),
        ] {
            assert_eq!(
                leased_decision(record([2; 32], state, until), &fp, 5_000),
                LeasedDecision::Mismatch
            );
        }
    }

    #[test]
    fn tokens_are_fresh_and_short_in_debug() {
        let (a, b) = (LeaseToken::new(), LeaseToken::new());
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(format!("{a:?}").len(), "LeaseToken(…)".len() + 8);
    }
}
