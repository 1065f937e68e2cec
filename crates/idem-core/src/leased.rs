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
//! A holder that died leaves a pending record whose lease runs out; a holder
//! that learns its work's outcome is unknown (the other system may have
//! acted, and no answer came back) ends its lease at once
//! ([`LeasedKeyStore::abandon_leased`]) and the record stays pending. Either
//! way the record is *abandoned*, and what a retry does then is the
//! record's [`OnUnknown`], chosen when it was claimed and stored with it:
//! take the record over and do the work again — safe only when the work
//! is itself idempotent, as a forward with a derived `Idempotency-Key` to a
//! system that honours it is —, take it over to *verify* first whether the
//! work landed, or stop and leave the record to an operator
//! ([`LeasedKeyStore::resolve_abandoned`]).

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

pub use crate::keys::OnUnknown;

/// What [`LeasedKeyStore::claim_leased`] did.
#[derive(Debug)]
pub enum LeasedClaim {
    /// The key was free (or its record had expired): a pending record with
    /// the token is committed.
    Claimed,
    /// The key's pending record was abandoned (its lease ran out, or its
    /// holder ended it) and the request is the same: it now holds the token
    /// and a new lease. The earlier holder's work may have landed.
    TakenOver {
        /// When the earlier holder's lease ended (unix ms): from then on
        /// its work's outcome was unknown, so "not found" by a lookup is
        /// only trusted once a landing window from here has passed.
        lease_ended_at_ms: i64,
    },
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
    /// Its holder's lease ended and the outcome of its work is unknown
    /// ([`OnUnknown::Reject`], or a claimer that takes over got there first).
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

/// What a claimer does with the record it found in its way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextStep {
    /// The record expired (not collected yet): claim the key afresh.
    Reclaim,
    /// The same request's lease ran out and takeovers are allowed.
    TakeOver,
    /// Leave it: it is the answer ([`leased_decision`] says what it means).
    Keep,
}

/// What a claimer does with an existing record (pure logic, shared by every
/// backend's [`LeasedKeyStore::claim_leased`]): a finished record, a live
/// lease and another request's record are kept, so a replay writes nothing.
/// An abandoned record is taken over only when the claimer's policy takes
/// over and the record's own (stored when it was claimed) is no stricter:
/// a claimer configured otherwise since never repeats what the record's
/// policy holds.
pub fn next_step(
    record: &StoredRecord,
    fingerprint: &Fingerprint,
    on_unknown: OnUnknown,
    now_ms: i64,
) -> NextStep {
    if record.expires_at_ms <= now_ms {
        NextStep::Reclaim
    } else if on_unknown.takes_over()
        && record
            .on_unknown
            .is_none_or(|stored| stored.strictness() <= on_unknown.strictness())
        && record.fingerprint == *fingerprint
        && record.state == RecordState::Pending
        && record.locked_until_ms.is_some_and(|t| t <= now_ms)
    {
        NextStep::TakeOver
    } else {
        NextStep::Keep
    }
}

/// The expiry of a record whose outcome is unknown and whose work may not
/// be repeated blindly (9999-12-31T23:59:59.999Z): it is held until it is
/// verified or resolved.
pub const UNRESOLVED_EXPIRES_AT_MS: i64 = 253_402_300_799_999;

/// The expiry a claim gives its pending record. Work that may be repeated
/// harmlessly ([`OnUnknown::Reforward`]) expires with the policy's TTL, so
/// a record whose holder died is claimed afresh later. Any other is held
/// ([`UNRESOLVED_EXPIRES_AT_MS`]) from the claim on: a holder killed before
/// it could write anything leaves an outcome as unknown as one that timed
/// out, and it is never claimed afresh or collected while pending. Its
/// answer ([`LeasedKeyStore::complete_leased`]) or an operator's
/// ([`LeasedKeyStore::resolve_abandoned`]) brings it back to a TTL.
pub fn claim_expires_at_ms(policy: &Policy, on_unknown: OnUnknown, now_ms: i64) -> i64 {
    if on_unknown.repeat_is_harmless() {
        policy.expires_at_ms(now_ms)
    } else {
        UNRESOLVED_EXPIRES_AT_MS
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
    /// inserts a pending record holding `on_unknown` unless a live one
    /// exists. When `on_unknown` takes over ([`OnUnknown::takes_over`]), a
    /// pending record of the same request whose lease ended is taken over
    /// (token and lease replaced). Otherwise the record is returned
    /// unchanged.
    #[allow(clippy::too_many_arguments)]
    fn claim_leased(
        &self,
        scope: &Scope,
        fingerprint: &Fingerprint,
        policy: &Policy,
        token: &LeaseToken,
        locked_until_ms: i64,
        on_unknown: OnUnknown,
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

    /// Ends the lease `token` holds at `until_ms` (at most `now_ms`) and
    /// commits, the record still pending: the work's outcome is unknown
    /// from `until_ms` on, and the next retry finds the record abandoned
    /// (its [`OnUnknown`] says what then). `reason` (kept when `None`) is
    /// stored for operators as the record's recovery point. `false` when
    /// `token` holds no lease.
    fn abandon_leased(
        &self,
        scope: &Scope,
        token: &LeaseToken,
        until_ms: i64,
        reason: Option<&str>,
        now_ms: i64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Stores the outcome on the pending record `token` holds and commits;
    /// `false` (nothing written) when it holds none. The record expires at
    /// `expires_at_ms` at the latest (one held while its outcome was
    /// unknown expires only then).
    fn complete_leased(
        &self,
        scope: &Scope,
        token: &LeaseToken,
        completion: &Completion,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Deletes the pending record `token` holds, so a retry does the work
    /// again; `false` when it holds none.
    fn release_leased(
        &self,
        scope: &Scope,
        token: &LeaseToken,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// An operator's end of an abandoned record: a pending record whose
    /// lease ran out by `now_ms` is deleted or given an outcome (kept for
    /// [`Policy::DEFAULT_TTL`] at most). `false` when there is no such
    /// record (finished, live, absent).
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
            on_unknown: None,
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
    fn only_expired_and_abandoned_records_are_written_over() {
        let fp = Fingerprint::from_bytes([1; 32]);
        let take = OnUnknown::Reforward;
        let mut r = record([1; 32], RecordState::Pending, Some(500));
        assert_eq!(next_step(&r, &fp, take, 400), NextStep::Keep, "live");
        assert_eq!(next_step(&r, &fp, take, 500), NextStep::TakeOver);
        assert_eq!(
            next_step(&r, &fp, OnUnknown::Verify, 500),
            NextStep::TakeOver,
            "verified by the claimer that takes it over"
        );
        assert_eq!(next_step(&r, &fp, OnUnknown::Reject, 500), NextStep::Keep);
        // The record's own policy, stored when it was claimed, wins when it
        // is stricter: a gateway configured otherwise since repeats nothing.
        r.on_unknown = Some(OnUnknown::Reject);
        assert_eq!(next_step(&r, &fp, take, 500), NextStep::Keep);
        r.on_unknown = Some(OnUnknown::Verify);
        assert_eq!(next_step(&r, &fp, take, 500), NextStep::Keep);
        assert_eq!(
            next_step(&r, &fp, OnUnknown::Verify, 500),
            NextStep::TakeOver
        );
        r.on_unknown = Some(OnUnknown::Reforward);
        assert_eq!(
            next_step(&r, &fp, OnUnknown::Verify, 500),
            NextStep::TakeOver
        );
        r.on_unknown = None;
        let other = Fingerprint::from_bytes([2; 32]);
        assert_eq!(
            next_step(&r, &other, take, 500),
            NextStep::Keep,
            "another request"
        );
        r.expires_at_ms = 500;
        assert_eq!(
            next_step(&r, &other, OnUnknown::Reject, 500),
            NextStep::Reclaim
        );
        let done = record([1; 32], RecordState::Completed, None);
        assert_eq!(next_step(&done, &fp, take, 999), NextStep::Keep, "a replay");
    }

    #[test]
    fn policies_have_one_name_each_and_only_reforward_repeats_blindly() {
        for p in OnUnknown::ALL {
            assert_eq!(OnUnknown::parse(p.as_str()), Some(p));
        }
        assert_eq!(OnUnknown::parse("pray"), None);
        assert!(OnUnknown::Reforward.repeat_is_harmless());
        assert!(!OnUnknown::Verify.repeat_is_harmless());
        assert!(!OnUnknown::Reject.repeat_is_harmless());
        assert!(!OnUnknown::Reject.takes_over());
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
