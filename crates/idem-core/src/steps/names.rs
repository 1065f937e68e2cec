//! The names and derived identifiers of runs and steps: [`Namespace`](crate::steps::Namespace),
//! [`RunId`](crate::steps::RunId), [`StepName`](crate::steps::StepName), [`StepKey`](crate::steps::StepKey), and the lease's [`Fence`](crate::steps::Fence).

use std::fmt;

use crate::derive::{digest, hex};

use crate::scope::Scope;

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

/// The installation a run belongs to: part of every id it derives, so two
/// installations that share a provider (staging and production, two shops
/// on one merchant account) never send each other's keys for a client key
/// they happen to share. Each database draws its own once
/// ([`RunStore::namespace`](crate::steps::RunStore::namespace)); 1 to 64 characters of `[A-Za-z0-9._-]`.
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
