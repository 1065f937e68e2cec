//! Runs and steps: operations that call other systems, recorded step by step
//! so that a crash, a retry or a zombie executor never produces a second
//! external effect.
//!
//! A **run** belongs to one idempotency scope (tenant, operation, key) and is
//! created in the transaction that claims the key. It holds its state
//! ([`RunState`]), the recorded outcome of each **step** ([`StepRecord`]),
//! the recovery point, and a **lease**: the executor holding it (`holder`),
//! until when (`locked_until_ms`) and a **fence** ([`Fence`]) that grows by
//! one on every takeover. Every write of a run is conditional on the fence
//! its executor took the lease with, so an executor that lost its lease —
//! paused past it, partitioned — records nothing.
//!
//! Downstream keys are derived, never drawn: [`StepKey::derive`] hashes the
//! installation's [`Namespace`], the run's scope and the step's *name*, so
//! every attempt of a step, by any executor, sends the same key. [`RunId::of`]
//! derives the run's id the same way.
//!
//! This module holds the types and the [`RunStore`] capability a backend
//! implements (`idem-sqlite`, `idem-postgres`); the executor is the
//! `idem-steps` crate.
//!
//! ```
//! use idem_core::{IdempotencyKey, Operation, Scope, Tenant};
//! use idem_core::steps::{Namespace, RunId, StepKey, StepName};
//! let ns = Namespace::new("shop-eu-1")?;   // each database draws its own
//! let scope = Scope::new(Tenant::new("acme")?, Operation::new("orders.create")?,
//!                        IdempotencyKey::new("k-1")?);
//! let charge = StepName::new("charge")?;
//! // The same installation, scope and step name give the same key, whoever
//! // computes it, whenever; another installation gets another key.
//! assert_eq!(StepKey::derive(&ns, &scope, &charge), StepKey::derive(&ns, &scope, &charge));
//! assert_ne!(StepKey::derive(&Namespace::new("staging")?, &scope, &charge),
//!            StepKey::derive(&ns, &scope, &charge));
//! assert!(StepKey::derive(&ns, &scope, &charge).as_str().starts_with("idem:charge:"));
//! assert_eq!(RunId::of(&ns, &scope), RunId::parse(RunId::of(&ns, &scope).as_str())?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod names;
mod records;
mod state;
mod store;
#[cfg(test)]
mod tests;

pub use names::{Fence, NameError, Namespace, RunId, StepKey, StepName};
pub use records::{Failure, Lease, RunColumns, RunRecord, StepColumns, StepRecord, attach_steps};
pub use state::{MessageState, RunState, StepKind, StepState};
pub use store::{
    MessageClaim, MessageColumns, NewRun, RunChange, RunFilter, RunStore, SentMessage,
};
