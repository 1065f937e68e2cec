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

use std::fmt;
use std::future::Future;

use sha2::{Digest, Sha256};

use crate::error::StoreError;
use crate::idempotency_key::IdempotencyKey;
use crate::keys::KeyStore;
use crate::scope::{Operation, Scope, Tenant};

/// Why a step name, run id or message id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// A step name must be 1 to 64 characters of `[A-Za-z0-9._-]`.
    #[error("step name must be 1 to 64 characters of [A-Za-z0-9._-], got {0:?}")]
    StepName(String),
    /// A run id is `run_` and 32 lowercase hex digits.
    #[error("run id must be run_ followed by 32 lowercase hex digits, got {0:?}")]
    RunId(String),
    /// A message id must be 1 to 255 visible ASCII characters.
    #[error("message id must be 1 to 255 visible ASCII characters")]
    MessageId,
    /// A namespace must be 1 to 64 characters of `[A-Za-z0-9._-]`.
    #[error("namespace must be 1 to 64 characters of [A-Za-z0-9._-], got {0:?}")]
    Namespace(String),
}

/// SHA-256 over length-prefixed parts, after a domain tag: no two different
/// tuples hash alike, and run ids never collide with step keys.
fn digest(domain: &str, parts: &[&str]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(domain.as_bytes());
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p.as_bytes());
    }
    h.finalize().into()
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The installation a run belongs to: part of every id it derives, so two
/// installations that share a provider (staging and production, two shops
/// on one merchant account) never send each other's keys for a client key
/// they happen to share. Each database draws its own once
/// ([`RunStore::namespace`]); 1 to 64 characters of `[A-Za-z0-9._-]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Namespace(String);

impl Namespace {
    /// Validates a namespace.
    pub fn new(value: impl Into<String>) -> Result<Self, NameError> {
        let value = value.into();
        let ok = (1..=64).contains(&value.len())
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if ok {
            Ok(Self(value))
        } else {
            Err(NameError::Namespace(value.chars().take(80).collect()))
        }
    }

    /// A new random one (32 hex digits).
    pub fn generate() -> Self {
        Self(uuid::Uuid::new_v4().simple().to_string())
    }

    /// The namespace as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A run's id: `run_` and 32 hex digits derived from its installation's
/// namespace and its scope, so every retry of one intent names the same run.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId(String);

impl RunId {
    const PREFIX: &'static str = "run_";

    /// The id of the run of `scope` in installation `namespace`.
    pub fn of(namespace: &Namespace, scope: &Scope) -> Self {
        let d = digest(
            "idem.run.v2",
            &[
                namespace.as_str(),
                scope.tenant.as_str(),
                scope.operation.as_str(),
                scope.key.as_str(),
            ],
        );
        Self(format!("{}{}", Self::PREFIX, hex(&d[..16])))
    }

    /// Validates an id read from outside (a command line, a path).
    pub fn parse(value: &str) -> Result<Self, NameError> {
        match value.strip_prefix(Self::PREFIX) {
            Some(h)
                if h.len() == 32 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) =>
            {
                Ok(Self(value.to_owned()))
            }
            _ => Err(NameError::RunId(value.chars().take(80).collect())),
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The 32 hex digits after `run_`: a stable suffix for ids of what the
    /// run creates (an order `ord_<suffix>`).
    pub fn suffix(&self) -> &str {
        &self.0[Self::PREFIX.len()..]
    }

    /// The run id whose suffix is `suffix` (32 lowercase hex digits).
    pub fn from_suffix(suffix: &str) -> Result<Self, NameError> {
        Self::parse(&format!("{}{suffix}", Self::PREFIX))
    }
}

impl fmt::Debug for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A step's name within its run: 1 to 64 characters of `[A-Za-z0-9._-]`.
/// Names, not positions, identify steps: a step keeps its name, its record
/// and its downstream key whatever runs before it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StepName(String);

impl StepName {
    /// The longest name accepted.
    pub const MAX_LEN: usize = 64;

    /// Validates a name.
    pub fn new(value: impl Into<String>) -> Result<Self, NameError> {
        let value = value.into();
        let ok = (1..=Self::MAX_LEN).contains(&value.len())
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if ok {
            Ok(Self(value))
        } else {
            Err(NameError::StepName(value.chars().take(80).collect()))
        }
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for StepName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The key a step sends downstream (as `Idempotency-Key`, a message id):
/// `idem:<step>:<32 hex digits>`, derived from the installation's namespace,
/// the run's scope and the step's name — never from a position, a run
/// attempt, a random draw or the time. A valid
/// [`IdempotencyKey`](crate::IdempotencyKey) (at most 102 characters).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StepKey(String);

impl StepKey {
    /// The key of step `step` of the run of `scope` in `namespace`.
    pub fn derive(namespace: &Namespace, scope: &Scope, step: &StepName) -> Self {
        let d = digest(
            "idem.step.v2",
            &[
                namespace.as_str(),
                scope.tenant.as_str(),
                scope.operation.as_str(),
                scope.key.as_str(),
                step.as_str(),
            ],
        );
        Self(format!("idem:{}:{}", step.as_str(), hex(&d[..16])))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for StepKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The fencing token of a lease: it grows by one each time another executor
/// takes the run over (and on every operator action), and every write of the
/// run is conditional on it. Hand it to downstream systems that accept one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fence(pub i64);

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

macro_rules! named_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The name used in storage and on the command line.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }

            /// Parses a stored name.
            pub fn parse(s: &str) -> Option<Self> {
                match s {
                    $($text => Some($name::$variant),)*
                    _ => None,
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

named_enum! {
    /// Where a run is. Every state has a way out: `running` and
    /// `compensating` runs are resumed by whoever takes their lease once it
    /// expires (a retry of the request, or the recovery worker);
    /// `needs_attention` waits for an operator (`idem steps resolve`);
    /// `completed` and `failed` are final and replayed.
    RunState {
        /// Moving forward.
        Running = "running",
        /// Undoing its completed steps, newest first, after a permanent
        /// failure or its deadline.
        Compensating = "compensating",
        /// Stopped at a step an operator must resolve (an at-most-once
        /// effect whose outcome is unknown, retries exhausted after the
        /// point of no return, a compensation that cannot complete).
        NeedsAttention = "needs_attention",
        /// Finished; its outcome is stored on the key record.
        Completed = "completed",
        /// Finished after compensation (or with a business error); its
        /// outcome is stored on the key record.
        Failed = "failed",
    }
}

impl RunState {
    /// `completed` or `failed`.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Completed | Self::Failed)
    }

    /// `running` or `compensating`: an executor may hold it.
    pub fn is_live(self) -> bool {
        matches!(self, Self::Running | Self::Compensating)
    }
}

named_enum! {
    /// What a step does, which decides how it is retried and resolved.
    StepKind {
        /// Local database work, committed with its record: never unknown.
        Phase = "phase",
        /// An external call that accepts the derived key: retried with it.
        Call = "call",
        /// A send to a sink without keys: before sending again, the sink is
        /// asked whether the message id arrived (verify-then-send).
        Send = "send",
        /// An effect that is never retried automatically: an unknown
        /// outcome waits for an operator.
        AtMostOnce = "at_most_once",
        /// The compensation of an external call, itself a recorded call
        /// with its own derived key; when the call's outcome is unknown, its
        /// lookup's attempts are this step's too.
        Undo = "undo",
        /// The compensation of a phase: local work, committed with its record.
        UndoPhase = "undo_phase",
    }
}

named_enum! {
    /// A step's recorded state.
    StepState {
        /// Attempted, no outcome recorded: the effect may or may not have
        /// happened (the call is in flight, or its answer was lost).
        Started = "started",
        /// Done; its result is recorded and returned on resume.
        Done = "done",
        /// Failed for good; recorded and returned on resume.
        Failed = "failed",
        /// The last attempt certainly did nothing (a refused call, a
        /// rolled-back phase, a compensation's lookup, or an operator's
        /// word): it may run once more.
        NotSent = "not_sent",
    }
}

named_enum! {
    /// A message id's state in the send-once ledger.
    MessageState {
        /// An attempt to send it is (or was) under way: outcome unknown.
        Sending = "sending",
        /// Sent: it is never sent again, by this run or any other.
        Sent = "sent",
        /// Not sent, for certain: it may be sent.
        NotSent = "not_sent",
    }
}

/// One step's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRecord {
    /// The step's name.
    pub name: String,
    /// Its order of first appearance in the run (1, 2, …).
    pub seq: i64,
    /// What it does.
    pub kind: StepKind,
    /// Where it is.
    pub state: StepState,
    /// Attempts started so far.
    pub attempts: u32,
    /// Attempts that failed (answered with an error, or timed out); what a
    /// retry budget counts. An attempt cut short by a crash is not one.
    pub failures: u32,
    /// The key it sends downstream (or its message id).
    pub key: String,
    /// The fence of the executor that wrote this record last.
    pub fence: Fence,
    /// The recorded result (JSON), once `Done`. On the compensation of a
    /// call whose outcome was unknown (`undo`): what the call's lookup
    /// found, as soon as it is known (`{"lookup":"found","value":…}`, then
    /// kept once done; or `{"lookup":"not_found"}`, done: nothing undone).
    pub result: Option<Vec<u8>>,
    /// The last error, if an attempt failed.
    pub error: Option<String>,
    /// When its first attempt started (unix ms).
    pub started_at_ms: Option<i64>,
    /// When it was recorded done or failed (unix ms).
    pub finished_at_ms: Option<i64>,
    /// When the record last changed (unix ms).
    pub updated_at_ms: i64,
}

/// Why a run failed or is being compensated: stored with the run, so a
/// resumed executor fails it for the same reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// A short machine-readable reason (`card_declined`, `deadline`,
    /// `step_failed`).
    pub reason: String,
    /// The step it happened at, if any.
    pub step: Option<String>,
    /// What happened, for operators.
    pub detail: Option<String>,
}

impl Failure {
    /// A failure with only a reason.
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            step: None,
            detail: None,
        }
    }

    /// The stored form (JSON).
    pub fn to_json(&self) -> String {
        serde_json::json!({"reason": self.reason, "step": self.step, "detail": self.detail})
            .to_string()
    }

    /// Reads the stored form.
    pub fn from_json(text: &str) -> Option<Self> {
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        let text = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
        Some(Self {
            reason: text("reason")?,
            step: text("step"),
            detail: text("detail"),
        })
    }
}

/// A run as read from a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRecord {
    /// Its id, derived from the scope.
    pub id: RunId,
    /// The scope whose key record carries its final outcome.
    pub scope: Scope,
    /// Where it is.
    pub state: RunState,
    /// What it was started with (the request body).
    pub input: Vec<u8>,
    /// The last step recorded done.
    pub recovery_point: Option<String>,
    /// Why it is compensating or failed.
    pub failure: Option<Failure>,
    /// The step an operator must resolve, in `needs_attention`.
    pub blocked_step: Option<String>,
    /// Why it needs attention.
    pub attention: Option<String>,
    /// Whether it passed its point of no return (no compensation after it).
    pub no_return: bool,
    /// The executor holding the lease, if any.
    pub holder: Option<String>,
    /// Until when the lease holds (unix ms); a released run is due then.
    pub locked_until_ms: i64,
    /// The current fence.
    pub fence: Fence,
    /// How often another executor took it over.
    pub takeovers: u32,
    /// After this (unix ms) it compensates instead of retrying, unless it
    /// passed its point of no return.
    pub deadline_ms: i64,
    /// How long its key record and its own record live once it finished.
    pub ttl_ms: i64,
    /// When it started (unix ms).
    pub created_at_ms: i64,
    /// When it last changed (unix ms).
    pub updated_at_ms: i64,
    /// When it finished (unix ms).
    pub finished_at_ms: Option<i64>,
    /// Its steps in order ([`RunStore::list_runs`] leaves them out).
    pub steps: Vec<StepRecord>,
}

impl RunRecord {
    /// The record of step `name`, if it has one.
    pub fn step(&self, name: &str) -> Option<&StepRecord> {
        self.steps.iter().find(|s| s.name == name)
    }

    /// The lease this record says is held (for the executor that just took it).
    pub fn lease(&self) -> Option<Lease> {
        Some(Lease {
            run: self.id.clone(),
            holder: self.holder.clone()?,
            fence: self.fence,
        })
    }
}

/// A run's columns as read from any backend, before validation.
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct RunColumns {
    pub id: String,
    pub tenant_id: String,
    pub operation: String,
    pub idempotency_key: String,
    pub state: String,
    pub input: Vec<u8>,
    pub recovery_point: Option<String>,
    pub failure: Option<String>,
    pub blocked_step: Option<String>,
    pub attention: Option<String>,
    pub no_return: bool,
    pub holder: Option<String>,
    pub locked_until_ms: i64,
    pub fence: i64,
    pub takeovers: i64,
    pub deadline_ms: i64,
    pub ttl_ms: i64,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub finished_at_ms: Option<i64>,
}

fn corrupt(detail: String) -> StoreError {
    StoreError::Corrupt { detail }
}

impl RunColumns {
    /// Validates the columns into a record (without steps).
    pub fn decode(self) -> Result<RunRecord, StoreError> {
        let scope = Scope::new(
            Tenant::new(self.tenant_id).map_err(|e| corrupt(format!("run tenant: {e}")))?,
            Operation::new(self.operation).map_err(|e| corrupt(format!("run operation: {e}")))?,
            IdempotencyKey::new(self.idempotency_key)
                .map_err(|e| corrupt(format!("run key: {e}")))?,
        );
        let failure = match self.failure {
            None => None,
            Some(text) => Some(
                Failure::from_json(&text)
                    .ok_or_else(|| corrupt(format!("run failure {text:?}")))?,
            ),
        };
        Ok(RunRecord {
            id: RunId::parse(&self.id).map_err(|e| corrupt(e.to_string()))?,
            scope,
            state: RunState::parse(&self.state)
                .ok_or_else(|| corrupt(format!("run state {:?}", self.state)))?,
            input: self.input,
            recovery_point: self.recovery_point,
            failure,
            blocked_step: self.blocked_step,
            attention: self.attention,
            no_return: self.no_return,
            holder: self.holder,
            locked_until_ms: self.locked_until_ms,
            fence: Fence(self.fence),
            takeovers: u32::try_from(self.takeovers).unwrap_or(u32::MAX),
            deadline_ms: self.deadline_ms,
            ttl_ms: self.ttl_ms,
            created_at_ms: self.created_at_ms,
            updated_at_ms: self.updated_at_ms,
            finished_at_ms: self.finished_at_ms,
            steps: Vec::new(),
        })
    }
}

/// A step's columns as read from any backend, before validation.
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct StepColumns {
    pub run_id: String,
    pub name: String,
    pub seq: i64,
    pub kind: String,
    pub state: String,
    pub attempts: i64,
    pub failures: i64,
    pub step_key: String,
    pub fence: i64,
    pub result: Option<Vec<u8>>,
    pub error: Option<String>,
    pub started_at_ms: Option<i64>,
    pub finished_at_ms: Option<i64>,
    pub updated_at_ms: i64,
}

impl StepColumns {
    /// Validates the columns into a step record; returns its run's id too.
    pub fn decode(self) -> Result<(String, StepRecord), StoreError> {
        let record = StepRecord {
            kind: StepKind::parse(&self.kind)
                .ok_or_else(|| corrupt(format!("step kind {:?}", self.kind)))?,
            state: StepState::parse(&self.state)
                .ok_or_else(|| corrupt(format!("step state {:?}", self.state)))?,
            name: self.name,
            seq: self.seq,
            attempts: u32::try_from(self.attempts).unwrap_or(u32::MAX),
            failures: u32::try_from(self.failures).unwrap_or(u32::MAX),
            key: self.step_key,
            fence: Fence(self.fence),
            result: self.result,
            error: self.error,
            started_at_ms: self.started_at_ms,
            finished_at_ms: self.finished_at_ms,
            updated_at_ms: self.updated_at_ms,
        };
        Ok((self.run_id, record))
    }
}

/// Attaches decoded steps (in `seq` order) to their runs.
pub fn attach_steps(runs: &mut [RunRecord], steps: Vec<(String, StepRecord)>) {
    for (run_id, step) in steps {
        if let Some(run) = runs.iter_mut().find(|r| r.id.as_str() == run_id) {
            run.steps.push(step);
        }
    }
    for run in runs {
        run.steps.sort_by_key(|s| s.seq);
    }
}

/// A held lease: whose, and with which fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The run.
    pub run: RunId,
    /// The executor holding it.
    pub holder: String,
    /// The fence it was taken with.
    pub fence: Fence,
}

/// A run to create, in the transaction that claims its key.
#[derive(Debug, Clone)]
pub struct NewRun<'a> {
    /// `RunId::of(scope)`.
    pub id: &'a RunId,
    /// The claimed scope.
    pub scope: &'a Scope,
    /// What it is started with.
    pub input: &'a [u8],
    /// The executor that starts it (holds the lease).
    pub holder: &'a str,
    /// Until when the first lease holds.
    pub locked_until_ms: i64,
    /// When it stops retrying and compensates.
    pub deadline_ms: i64,
    /// Retention once finished.
    pub ttl_ms: i64,
    /// Now.
    pub now_ms: i64,
}

/// What a fenced write changes on a run; `Default` changes nothing but
/// `updated_at_ms`. The write happens only while the run's fence is the
/// writer's.
#[derive(Debug, Clone, Default)]
pub struct RunChange<'a> {
    /// A new state.
    pub state: Option<RunState>,
    /// A new recovery point.
    pub recovery_point: Option<&'a str>,
    /// Why it fails (kept once set).
    pub failure: Option<&'a Failure>,
    /// `Some(Some((step, why)))` blocks the run at `step`; `Some(None)`
    /// clears a block.
    pub attention: Option<Option<(&'a str, &'a str)>>,
    /// Marks the point of no return as passed.
    pub no_return: bool,
    /// Moves the lease's end (a heartbeat; or when a released run is due).
    pub locked_until_ms: Option<i64>,
    /// Gives the lease up: no holder any more.
    pub release: bool,
    /// Adds one to the fence (operator actions: any executor still running
    /// the run is fenced out).
    pub bump_fence: bool,
    /// The run is final: it and its key record expire at this time.
    pub expires_at_ms: Option<i64>,
    /// Marks a message of the send-once ledger (this run's own).
    pub message: Option<(&'a str, MessageState)>,
}

/// A claim on a message id of the send-once ledger, before an attempt.
#[derive(Debug, Clone)]
pub struct MessageClaim<'a> {
    /// The message id (a step key, or an id derived from a business id).
    pub message_id: &'a str,
    /// The claiming run.
    pub run: &'a RunId,
    /// The claiming step.
    pub step: &'a str,
    /// Now.
    pub now_ms: i64,
    /// When the ledger may forget it.
    pub expires_at_ms: i64,
}

/// A message id's entry in the send-once ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentMessage {
    /// The message id.
    pub message_id: String,
    /// The run holding it.
    pub run_id: String,
    /// The step holding it.
    pub step: String,
    /// Where it is.
    pub state: MessageState,
    /// Attempts over all runs.
    pub attempts: u32,
    /// When it was first claimed (unix ms).
    pub created_at_ms: i64,
    /// When it was marked sent (unix ms).
    pub sent_at_ms: Option<i64>,
}

/// A send-once ledger row's columns, before validation.
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct MessageColumns {
    pub message_id: String,
    pub run_id: String,
    pub step: String,
    pub state: String,
    pub attempts: i64,
    pub created_at_ms: i64,
    pub sent_at_ms: Option<i64>,
}

impl MessageColumns {
    /// Validates the columns.
    pub fn decode(self) -> Result<SentMessage, StoreError> {
        Ok(SentMessage {
            state: MessageState::parse(&self.state)
                .ok_or_else(|| corrupt(format!("message state {:?}", self.state)))?,
            message_id: self.message_id,
            run_id: self.run_id,
            step: self.step,
            attempts: u32::try_from(self.attempts).unwrap_or(u32::MAX),
            created_at_ms: self.created_at_ms,
            sent_at_ms: self.sent_at_ms,
        })
    }
}

/// Which runs [`RunStore::list_runs`] returns: newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunFilter {
    /// Only runs in this state.
    pub state: Option<RunState>,
    /// At most this many (1 to 1000).
    pub limit: u32,
}

impl Default for RunFilter {
    fn default() -> Self {
        Self {
            state: None,
            limit: 100,
        }
    }
}

/// Runs and steps, stored in the same database as the key records and the
/// business data.
///
/// Every write of a run ([`RunStore::record_run_in`], [`RunStore::record_run`]) is
/// conditional on the writer's fence and reports `Ok(false)`, writing
/// nothing, when the fence moved. Takeovers ([`RunStore::take_over`],
/// [`RunStore::claim_due`]) only take a live run whose lease expired, add one
/// to its fence, and never hand one run to two claimers (PostgreSQL: `FOR
/// UPDATE SKIP LOCKED`; SQLite: one writer at a time).
pub trait RunStore: KeyStore {
    /// This database's [`Namespace`]: drawn at random the first time it is
    /// asked for, kept for good. Every id an executor derives includes it.
    fn namespace(&self) -> impl Future<Output = Result<Namespace, StoreError>> + Send;

    /// In the transaction that claimed the run's key: creates the run (state
    /// `running`, the lease held by `run.holder`) and returns its fence: 1,
    /// or one more than the fence of a final run of the same id left from an
    /// expired key record, which it replaces (fences never go back). Keeps
    /// the key record from expiring while the run lives (its expiry is set
    /// when the run is final). A live run of the id is
    /// [`StoreError::Corrupt`].
    fn create_run<'a>(
        tx: &'a mut Self::Tx,
        run: &'a NewRun<'a>,
    ) -> impl Future<Output = Result<Fence, StoreError>> + Send + 'a;

    /// In `tx`: applies `change` to the run and upserts `step`, if the run's
    /// fence is still `lease.fence`; `Ok(false)` and nothing written when it
    /// is not. With `change.expires_at_ms` the key record's expiry moves too.
    fn record_run_in<'a>(
        tx: &'a mut Self::Tx,
        lease: &'a Lease,
        change: &'a RunChange<'a>,
        step: Option<&'a StepRecord>,
        now_ms: i64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'a;

    /// [`RunStore::record_run_in`] as a transaction of its own.
    fn record_run(
        &self,
        lease: &Lease,
        change: &RunChange<'_>,
        step: Option<&StepRecord>,
        now_ms: i64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// In `tx`: claims `claim.message_id` in the send-once ledger for the
    /// run and step, unless another run holds it (`sending` or `sent`); a
    /// `not_sent` entry is anyone's. Returns the entry as it now stands.
    fn claim_message<'a>(
        tx: &'a mut Self::Tx,
        claim: &'a MessageClaim<'a>,
    ) -> impl Future<Output = Result<SentMessage, StoreError>> + Send + 'a;

    /// A message id's ledger entry.
    fn message(
        &self,
        message_id: &str,
    ) -> impl Future<Output = Result<Option<SentMessage>, StoreError>> + Send;

    /// Takes run `id` over for `holder` if it is live and its lease ended by
    /// `now_ms`: the fence grows by one, the lease holds until
    /// `locked_until_ms`. Returns the run with its steps, or `None`.
    fn take_over(
        &self,
        id: &RunId,
        holder: &str,
        now_ms: i64,
        locked_until_ms: i64,
    ) -> impl Future<Output = Result<Option<RunRecord>, StoreError>> + Send;

    /// Takes over up to `limit` live runs of `operations` whose lease ended
    /// by `now_ms`, oldest due first (see [`RunStore::take_over`]). Runs
    /// another claimer is taking are skipped, never shared.
    fn claim_due(
        &self,
        operations: &[Operation],
        holder: &str,
        now_ms: i64,
        locked_until_ms: i64,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<RunRecord>, StoreError>> + Send;

    /// A run with its steps.
    fn load_run(
        &self,
        id: &RunId,
    ) -> impl Future<Output = Result<Option<RunRecord>, StoreError>> + Send;

    /// How many runs are in each state (states with none are left out):
    /// one grouped `COUNT`, for the metrics gauges.
    fn count_runs(&self) -> impl Future<Output = Result<Vec<(RunState, u64)>, StoreError>> + Send;

    /// Runs, newest first, without their steps.
    fn list_runs(
        &self,
        filter: &RunFilter,
    ) -> impl Future<Output = Result<Vec<RunRecord>, StoreError>> + Send;

    /// Deletes at most `limit` final runs (with their steps) whose retention
    /// ended by `now_ms`; returns how many.
    fn purge_runs(
        &self,
        now_ms: i64,
        limit: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Deletes at most `limit` ledger entries whose retention ended by
    /// `now_ms`; returns how many.
    fn purge_messages(
        &self,
        now_ms: i64,
        limit: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(tenant: &str, key: &str) -> Scope {
        Scope::new(
            Tenant::new(tenant).unwrap(),
            Operation::new("orders.create").unwrap(),
            IdempotencyKey::new(key).unwrap(),
        )
    }

    fn ns() -> Namespace {
        Namespace::new("prod").unwrap()
    }

    #[test]
    fn derived_keys_depend_on_namespace_scope_and_name_only() {
        let s = scope("acme", "k-1");
        let charge = StepName::new("charge").unwrap();
        let key = StepKey::derive(&ns(), &s, &charge);
        assert_eq!(key, StepKey::derive(&ns(), &s.clone(), &charge));
        assert_ne!(
            key,
            StepKey::derive(&Namespace::new("staging").unwrap(), &s, &charge)
        );
        assert_ne!(key, StepKey::derive(&ns(), &scope("other", "k-1"), &charge));
        assert_ne!(key, StepKey::derive(&ns(), &scope("acme", "k-2"), &charge));
        assert_ne!(
            key,
            StepKey::derive(&ns(), &s, &StepName::new("refund").unwrap())
        );
        // Length-prefixed: moving a character between parts changes the key.
        assert_ne!(
            StepKey::derive(&ns(), &scope("ab", "c"), &charge),
            StepKey::derive(&ns(), &scope("a", "bc"), &charge)
        );
        let long = StepName::new("x".repeat(64)).unwrap();
        let k = StepKey::derive(&ns(), &s, &long);
        assert!(IdempotencyKey::new(k.as_str()).is_ok(), "{k}");
        assert!(Namespace::new("").is_err() && Namespace::new("a b").is_err());
        assert_ne!(Namespace::generate(), Namespace::generate());
        assert!(Namespace::new(Namespace::generate().as_str()).is_ok());
    }

    #[test]
    fn run_ids_round_trip_and_refuse_anything_else() {
        let id = RunId::of(&ns(), &scope("acme", "k-1"));
        assert_eq!(RunId::parse(id.as_str()), Ok(id.clone()));
        assert_eq!(RunId::from_suffix(id.suffix()), Ok(id.clone()));
        assert_ne!(id, RunId::of(&ns(), &scope("acme", "k-2")));
        assert_ne!(
            id,
            RunId::of(&Namespace::new("other").unwrap(), &scope("acme", "k-1"))
        );
        for bad in [
            "",
            "run_",
            "run_XYZ",
            "pay_0123456789abcdef0123456789abcdef",
            "run_0123",
        ] {
            assert!(RunId::parse(bad).is_err(), "{bad}");
        }
        assert!(RunId::parse(&format!("{}A", &id.as_str()[..35])).is_err());
    }

    #[test]
    fn step_names_are_bounded() {
        assert!(StepName::new("charge").is_ok());
        assert!(StepName::new("mark-failed.v2_x").is_ok());
        assert!(StepName::new("").is_err());
        assert!(StepName::new("a b").is_err());
        assert!(StepName::new("a:b").is_err());
        assert!(StepName::new("x".repeat(65)).is_err());
    }

    #[test]
    fn names_round_trip() {
        for s in RunState::ALL {
            assert_eq!(RunState::parse(s.as_str()), Some(*s));
        }
        for s in StepKind::ALL {
            assert_eq!(StepKind::parse(s.as_str()), Some(*s));
        }
        for s in StepState::ALL {
            assert_eq!(StepState::parse(s.as_str()), Some(*s));
        }
        for s in MessageState::ALL {
            assert_eq!(MessageState::parse(s.as_str()), Some(*s));
        }
        assert_eq!(RunState::parse("done"), None);
        assert!(RunState::Completed.is_final() && !RunState::Running.is_final());
        assert!(RunState::Compensating.is_live() && !RunState::NeedsAttention.is_live());
    }

    #[test]
    fn failures_round_trip() {
        let f = Failure {
            reason: "card_declined".into(),
            step: Some("charge".into()),
            detail: Some("402 \"declined\"".into()),
        };
        assert_eq!(Failure::from_json(&f.to_json()), Some(f));
        assert_eq!(
            Failure::from_json(&Failure::new("deadline").to_json()),
            Some(Failure::new("deadline"))
        );
        assert_eq!(Failure::from_json("{}"), None);
        assert_eq!(Failure::from_json("nope"), None);
    }

    #[test]
    fn columns_decode_or_say_what_is_wrong() {
        let s = scope("acme", "k-1");
        let good = RunColumns {
            id: RunId::of(&ns(), &s).as_str().into(),
            tenant_id: "acme".into(),
            operation: "orders.create".into(),
            idempotency_key: "k-1".into(),
            state: "running".into(),
            fence: 3,
            ..RunColumns::default()
        };
        let run = good.clone().decode().unwrap();
        assert_eq!(
            (run.state, run.fence, run.scope),
            (RunState::Running, Fence(3), s)
        );
        let bad = |c: RunColumns| match c.decode() {
            Err(StoreError::Corrupt { detail }) => detail,
            other => panic!("expected Corrupt, got {other:?}"),
        };
        assert!(
            bad(RunColumns {
                state: "done".into(),
                ..good.clone()
            })
            .contains("state")
        );
        assert!(
            bad(RunColumns {
                tenant_id: "a b".into(),
                ..good.clone()
            })
            .contains("tenant")
        );
        assert!(
            bad(RunColumns {
                failure: Some("{".into()),
                ..good.clone()
            })
            .contains("failure")
        );
        assert!(
            bad(RunColumns {
                id: "x".into(),
                ..good
            })
            .contains("run id")
        );
        let step = StepColumns {
            run_id: "r".into(),
            name: "charge".into(),
            kind: "call".into(),
            state: "started".into(),
            attempts: 2,
            ..StepColumns::default()
        };
        let (run_id, rec) = step.clone().decode().unwrap();
        assert_eq!(
            (run_id.as_str(), rec.kind, rec.attempts),
            ("r", StepKind::Call, 2)
        );
        assert!(
            StepColumns {
                kind: "x".into(),
                ..step
            }
            .decode()
            .is_err()
        );
    }
}
