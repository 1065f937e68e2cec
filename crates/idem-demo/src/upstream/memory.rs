//! The upstream's memory: its payments, the answers stored under keys, and
//! the bounds they are kept within.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Map, Value};

/// Payments kept, at most; beyond, `POST` answers `507`.
pub const MAX_PAYMENTS: usize = 1_000_000;
/// Bytes of payment JSON (and stored answers) kept, at most; beyond, `507`.
pub const MAX_STORED_BYTES: usize = 256 << 20;
/// The largest request body; `413` above.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// How the upstream treats `Idempotency-Key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Ignores the key: every POST is a new payment.
    Naive,
    /// Looks the key up, waits, creates, stores: retries are replayed,
    /// races are not caught.
    CheckThenAct,
}

#[derive(Default)]
pub(super) struct Store {
    /// Payments in creation order.
    pub(super) payments: Vec<Map<String, Value>>,
    pub(super) by_id: HashMap<String, usize>,
    /// Answers stored under their key (check-then-act).
    pub(super) answers: HashMap<String, Bytes>,
    /// Keys whose first answer was lost (`lose_first_answer`).
    pub(super) lost: std::collections::HashSet<String>,
    pub(super) bytes: usize,
}

pub(super) struct Inner {
    pub(super) mode: Mode,
    pub(super) delay: Duration,
    pub(super) lose_first_answer: bool,
    pub(super) store: Mutex<Store>,
    pub(super) requests: AtomicU64,
}

/// The upstream's memory; cheap to clone.
#[derive(Clone)]
pub struct Upstream(pub(super) Arc<Inner>);

impl Upstream {
    /// An empty upstream. `delay` is the pause between the key lookup and
    /// the write in check-then-act mode.
    pub fn new(mode: Mode, delay: Duration) -> Self {
        Self(Arc::new(Inner {
            mode,
            delay,
            lose_first_answer: false,
            store: Mutex::new(Store::default()),
            requests: AtomicU64::new(0),
        }))
    }

    /// The same upstream, losing the answer of each key's first POST after
    /// committing it.
    pub fn losing_first_answers(mode: Mode, delay: Duration) -> Self {
        Self(Arc::new(Inner {
            mode,
            delay,
            lose_first_answer: true,
            store: Mutex::new(Store::default()),
            requests: AtomicU64::new(0),
        }))
    }

    pub(super) fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.0.store.lock().unwrap_or_else(|e| e.into_inner())
    }
}
