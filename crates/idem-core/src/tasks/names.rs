//! The names and derived identifiers of tasks: [`QueueName`], [`PollerName`],
//! [`WorkerName`], [`TaskId`], [`ActionName`] and [`ActionKey`].

use std::fmt;

use crate::derive::{digest, hex};

use crate::IdempotencyKey;
use crate::scope::Tenant;
use crate::steps::Namespace;

/// Why a queue, poller, worker, task id or action name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TaskNameError {
    /// A queue, poller or action name: 1 to 64 characters of `[A-Za-z0-9._-]`.
    #[error("{what} must be 1 to 64 characters of [A-Za-z0-9._-], got {value:?}")]
    Name {
        /// `queue`, `poller` or `action`.
        what: &'static str,
        /// The value, cut to 80 characters.
        value: String,
    },
    /// A worker name: 1 to 128 characters of `[A-Za-z0-9._:@-]`.
    #[error("worker must be 1 to 128 characters of [A-Za-z0-9._:@-], got {0:?}")]
    Worker(String),
    /// A task id is `tsk_` and 32 lowercase hex digits.
    #[error("task id must be tsk_ followed by 32 lowercase hex digits, got {0:?}")]
    TaskId(String),
}

fn cut(value: &str) -> String {
    value.chars().take(80).collect()
}

fn is_name(value: &str, max: usize, extra: &[u8]) -> bool {
    (1..=max).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || extra.contains(&b))
}

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// The longest name accepted.
            pub const MAX_LEN: usize = 64;

            /// Validates a name.
            pub fn new(value: impl Into<String>) -> Result<Self, TaskNameError> {
                let value = value.into();
                if is_name(&value, Self::MAX_LEN, b"._-") {
                    Ok(Self(value))
                } else {
                    Err(TaskNameError::Name {
                        what: $what,
                        value: cut(&value),
                    })
                }
            }

            /// The name as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

name_type!(
    /// A queue of tasks: 1 to 64 characters of `[A-Za-z0-9._-]`.
    QueueName,
    "queue"
);
name_type!(
    /// A poller whose cursor Idem keeps: 1 to 64 characters of `[A-Za-z0-9._-]`.
    PollerName,
    "poller"
);
name_type!(
    /// An action a task performs on another system (`notify`, `comment`):
    /// 1 to 64 characters of `[A-Za-z0-9._-]`.
    ActionName,
    "action"
);

/// The worker that claims a task: 1 to 128 characters of `[A-Za-z0-9._:@-]`
/// (`agent-3`, `host-a:4711`). It names the holder in the timeline; the
/// fence, not the name, decides who may write.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WorkerName(String);

impl WorkerName {
    /// Validates a worker name.
    pub fn new(value: impl Into<String>) -> Result<Self, TaskNameError> {
        let value = value.into();
        if is_name(&value, 128, b"._:@-") {
            Ok(Self(value))
        } else {
            Err(TaskNameError::Worker(cut(&value)))
        }
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A task's id: `tsk_` and 32 hex digits derived from the installation's
/// namespace, the tenant, the queue and the task's key, so every poller
/// that observes one change names the same task.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(String);

impl TaskId {
    const PREFIX: &'static str = "tsk_";

    /// The id of the task keyed `key` in `queue` of `tenant`.
    pub fn of(
        namespace: &Namespace,
        tenant: &Tenant,
        queue: &QueueName,
        key: &IdempotencyKey,
    ) -> Self {
        let d = digest(
            "idem.task.v1",
            &[
                namespace.as_str(),
                tenant.as_str(),
                queue.as_str(),
                key.as_str(),
            ],
        );
        Self(format!("{}{}", Self::PREFIX, hex(&d[..16])))
    }

    /// Validates an id read from outside (a path, a command line).
    pub fn parse(value: &str) -> Result<Self, TaskNameError> {
        match value.strip_prefix(Self::PREFIX) {
            Some(h)
                if h.len() == 32 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) =>
            {
                Ok(Self(value.to_owned()))
            }
            _ => Err(TaskNameError::TaskId(cut(value))),
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The key an action sends downstream (as `Idempotency-Key`, a message id):
/// `idem:<action>:<32 hex digits>`, derived from the namespace, the task and
/// the action's name — the same for every attempt and every worker. A valid
/// [`IdempotencyKey`] and the action's entry in the send-once ledger.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ActionKey(String);

impl ActionKey {
    /// The key of action `action` of task `task` in `namespace`.
    pub fn derive(namespace: &Namespace, task: &TaskId, action: &ActionName) -> Self {
        let d = digest(
            "idem.action.v1",
            &[namespace.as_str(), task.as_str(), action.as_str()],
        );
        Self(format!("idem:{}:{}", action.as_str(), hex(&d[..16])))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ActionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
