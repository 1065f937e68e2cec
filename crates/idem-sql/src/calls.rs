//! What a [`Dialect`](crate::Dialect)'s own methods take and answer: the
//! parameters of a claim, a leased claim, a run's fenced write and takeover,
//! and why a message ending in `COMMIT` did not commit. They sit apart from
//! the capability modules (which re-export them) so that the dialect and the
//! code written over it do not import each other.

use idem_core::StoreError;
use idem_core::steps::{Lease, RunChange, StepRecord};

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

/// What a leased claim asks for: the parameters of
/// [`LeasedKeyStore::claim_leased`](idem_core::leased::LeasedKeyStore::claim_leased)
/// besides the scope and now, as the backend's own claim takes them.
#[derive(Debug, Clone, Copy)]
pub struct LeaseClaim<'a> {
    /// The request's fingerprint.
    pub fingerprint: &'a idem_core::Fingerprint,
    /// The operation's policy (its expiry, its wait).
    pub policy: &'a idem_core::Policy,
    /// The claimer's token.
    pub token: &'a idem_core::leased::LeaseToken,
    /// The lease's end.
    pub locked_until_ms: i64,
    /// What an unknown outcome of the claimer's work allows.
    pub on_unknown: idem_core::leased::OnUnknown,
}

/// One fenced write of a run, as a backend's `record_in` and
/// `record_here` take it: the parameters of `RunStore::record_run`.
#[derive(Clone, Copy)]
pub struct RunWrite<'a> {
    /// The lease the write is fenced by.
    pub lease: &'a Lease,
    /// What changes.
    pub change: &'a RunChange<'a>,
    /// The step written with it, if any.
    pub step: Option<&'a StepRecord>,
    /// Now.
    pub now_ms: i64,
}

/// A takeover, as a backend's `take_over_here` and `claim_due_here` take
/// it: who takes over, when, until when.
#[derive(Debug, Clone, Copy)]
pub struct Takeover<'a> {
    /// The new holder.
    pub holder: &'a str,
    /// Now.
    pub now_ms: i64,
    /// The new lease's end.
    pub locked_until_ms: i64,
}

/// Why a message that ends in `COMMIT` did not commit: what a backend's
/// `complete_message` and `insert_completed_message` answer, which
/// the key store's `complete` and `insert_completed` ([`crate::keys`]) turn into its answer.
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
