//! Compensations as registered: what an undo's closure and a call's lookup
//! get, and the registered undo of a step (run by `compensate.rs`).

use std::sync::Arc;

use idem_core::steps::{Fence, StepKey, StepName};
use idem_core::{BoxError, BoxFuture};
use serde_json::Value as Json;

use crate::error::StepError;

/// What a compensation's closure gets.
#[derive(Debug, Clone)]
pub struct UndoCtx {
    /// The compensation's own key (derived from its own name): send it with
    /// the undoing request, so a repeat of the compensation is harmless.
    pub key: StepKey,
    /// The key the compensated call sent (what the other system may know
    /// its effect by).
    pub undone: StepKey,
    /// The fence of the lease this attempt runs under.
    pub fence: Fence,
    /// The attempt (its lookups and its attempts count together).
    pub attempt: u32,
}

/// What a call's lookup gets: how to find, at the other system, what the
/// call may have done.
#[derive(Debug, Clone)]
pub struct LookupCtx {
    /// The key the call sent (its derived key), the same on every attempt.
    pub key: StepKey,
    /// The fence of the lease this lookup runs under.
    pub fence: Fence,
    /// The attempt of the compensation this lookup belongs to.
    pub attempt: u32,
}

pub(crate) type UndoPhaseFn<Tx> =
    Box<dyn for<'t> Fn(&'t mut Tx, &'t [u8]) -> BoxFuture<'t, Result<(), BoxError>> + Send + Sync>;
/// A call's compensation, given the call's result (JSON) — always known.
pub(crate) type UndoCallFn =
    Arc<dyn Fn(UndoCtx, &[u8]) -> BoxFuture<'static, Result<(), StepError>> + Send + Sync>;
/// A call's lookup: `Some(result)` (as JSON) if its effect exists now.
pub(crate) type LookupFn =
    Arc<dyn Fn(LookupCtx) -> BoxFuture<'static, Result<Option<Json>, StepError>> + Send + Sync>;

/// A registered compensation.
pub(crate) struct Undo<Tx> {
    pub(super) name: StepName,
    pub(super) target: String,
    pub(super) action: UndoAction<Tx>,
}

pub(crate) enum UndoAction<Tx> {
    Phase(UndoPhaseFn<Tx>),
    Call {
        undo: UndoCallFn,
        /// How to learn the call's outcome when it is unknown; without one,
        /// an unknown outcome waits for an operator.
        lookup: Option<LookupFn>,
    },
}

/// Forces a closure to be higher-ranked over the transaction's lifetime.
pub(super) fn undo_phase_fn<Tx, F>(f: F) -> F
where
    F: for<'t> Fn(&'t mut Tx, &'t [u8]) -> BoxFuture<'t, Result<(), BoxError>>,
{
    f
}
