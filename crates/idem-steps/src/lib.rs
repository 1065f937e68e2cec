//! # Idem steps
//!
//! Operations that call other systems — charge a card at a provider, send
//! an email, write a ledger — made safe to retry and to crash, on the
//! database the service already has (SQLite or PostgreSQL), without a
//! workflow cluster.
//!
//! A **run** is created in the transaction that claims an idempotency key.
//! Your [`Workflow`] does its work through the [`Run`]:
//!
//! - [`Run::phase`]: local database work, committed together with its
//!   record (the first phase with the key's claim and the run itself);
//! - [`Run::call`]: an external call that gets a key **derived** from the
//!   run's scope and the step's name — the same on every attempt, by every
//!   executor — recorded before it starts and after it answers;
//! - [`Run::send`] (verify-then-send) and [`Run::send_at_most_once`]:
//!   effects on sinks without keys, claimed in a send-once ledger;
//! - `.undo(…)`: a compensation, itself a recorded step with its own derived
//!   key, run newest first when the run fails (before its point of no
//!   return). It gets what the step did, never a guess: the step's recorded
//!   result or, when a call's outcome is unknown, what the call's
//!   [`Call::lookup`] finds at the other system. A compensation never
//!   creates what it undoes: it does not re-send the call to find out. A
//!   lookup's "not found" is trusted only once a request the call sent can
//!   no longer land (the **landing window**,
//!   [`RunsConfig::landing_margin`]); an unknown outcome without a lookup
//!   waits for an operator. A step that never started, failed for good,
//!   whose every attempt certainly did nothing ([`StepError::Retry`]), or
//!   that its lookup did not find, is not compensated.
//!
//! Every write of a run is conditional on the **fence** of the lease its
//! executor holds, so an executor paused past its lease records nothing
//! once another took over. A run whose executor died is resumed — by a
//! retry of the request or by the [`Recovery`] worker — from its recorded
//! steps: a recorded step returns its result without running again, a step
//! that started without a recorded result runs again with the same key.
//! Runs that cannot go on safely wait in `needs_attention` for an operator
//! ([`resolve`]).
//!
//! With the feature `http`, [`WorkflowService`] serves a workflow behind
//! the `Idempotency-Key` contract of `idem-http`.
//!
//! ```
//! use idem_core::steps::{Failure, RunStore};
//! use idem_core::{BoxFuture, Completion, StoredResponse};
//! use idem_steps::{Run, StepError, Stop, Workflow};
//!
//! /// Charges a card at a provider that honours `Idempotency-Key`.
//! struct Checkout;
//!
//! async fn charge(key: &str, amount: i64) -> Result<String, StepError> {
//!     // POST /v1/payments with `Idempotency-Key: key` …
//!     Ok(format!("pay_for_{amount}"))
//! }
//!
//! async fn find_charge(key: &str) -> Result<Option<String>, StepError> {
//!     // GET /v1/payments?idempotency_key=key: read-only, never a charge …
//!     Ok(None)
//! }
//!
//! async fn refund(key: &str, payment: &str) -> Result<(), StepError> {
//!     // POST /v1/payments/{payment}/refunds with `Idempotency-Key: key` …
//!     Ok(())
//! }
//!
//! impl<S: RunStore> Workflow<S> for Checkout {
//!     fn run<'r>(&'r self, run: &'r mut Run<S>) -> BoxFuture<'r, Result<Completion, Stop>> {
//!         Box::pin(async move {
//!             let payment: String = run
//!                 .call("charge", |ctx| async move { charge(ctx.key.as_str(), 1000).await })
//!                 // Should the run fail: what the charge did — its answer, or
//!                 // what the lookup finds if the answer was lost — is refunded.
//!                 .lookup(|ctx| async move { find_charge(ctx.key.as_str()).await })
//!                 .undo("refund", |ctx, payment: String| async move {
//!                     refund(ctx.key.as_str(), &payment).await
//!                 })
//!                 .await?;
//!             Ok(Completion::completed(StoredResponse {
//!                 status: 201,
//!                 headers: vec![("content-type".into(), "application/json".into())],
//!                 body: format!(r#"{{"payment":"{payment}"}}"#).into_bytes(),
//!             }))
//!         })
//!     }
//!
//!     fn failed<'r>(&'r self, _run: &'r mut Run<S>, failure: &'r Failure)
//!         -> BoxFuture<'r, Result<Completion, Stop>> {
//!         let body = format!(r#"{{"failed":"{}"}}"#, failure.reason).into_bytes();
//!         Box::pin(async move {
//!             Ok(Completion::failed(StoredResponse { status: 424, headers: vec![], body }))
//!         })
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_core::{FingerprintSpec, IdempotencyKey, Operation, Policy, RequestParts, Scope, Tenant};
//! use idem_steps::{Ended, Runs, Started, WorkflowPolicy};
//! # let dir = std::env::temp_dir().join(format!("idem-steps-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir)?;
//! # let url = format!("sqlite://{}", dir.join("doc.db").display());
//! let store = idem_sqlite::SqliteStore::connect(&url, Default::default()).await?;
//! store.migrate().await?;
//! let op = Operation::new("orders.create")?;
//! let runs = Runs::builder(store)
//!     .workflow(op.clone(), Checkout, WorkflowPolicy::default())
//!     .build()?;
//!
//! let scope = Scope::new(Tenant::new("acme")?, op.clone(), IdempotencyKey::new("order-1")?);
//! let fp = FingerprintSpec::default().fingerprint(&RequestParts {
//!     method: "POST", operation: &op, target: "/orders", json: true, body: b"{}",
//! });
//! let Started::Running(mut run) = runs.start(&scope, &fp, &Policy::default(), b"{}".to_vec()).await? else {
//!     unreachable!("a new key starts a run");
//! };
//! let Some(Ended::Finished(done)) = run.ended(std::time::Duration::from_secs(5)).await else {
//!     unreachable!("the run finishes");
//! };
//! assert_eq!(done.response.status, 201);
//! // The same intent again: the stored outcome, not a second charge.
//! assert!(matches!(runs.start(&scope, &fp, &Policy::default(), b"{}".to_vec()).await?, Started::Replay(_)));
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(()) }
//! ```

mod config;
mod error;
mod executor;
#[cfg(feature = "http")]
mod http;
pub mod metrics;
mod recovery;
mod resolve;
mod run;
mod runs;
mod workflow;

pub use config::{RunsConfig, WorkflowPolicy};
pub use error::{Ended, ResolveError, StartError, StepError, Stop};
#[cfg(feature = "http")]
pub use http::{ResponseFuture, ServiceError, WorkflowService};
pub use recovery::Recovery;
pub use resolve::{Resolution, Resolved, resolve, resolve_in};
pub use run::attempt::CUT_SHORT_FACTOR;
pub use run::end::Keep;
pub use run::forward::{Call, Phase};
pub use run::send::{NoVerify, SendCtx, SendStep, Sent};
pub use run::undo::{LookupCtx, UndoCtx};
pub use run::{Run, StepCtx};
pub use runs::builder::RunsBuilder;
pub use runs::{RunHandle, Runs, Started};
pub use workflow::Workflow;
