//! # Idem backend conformance
//!
//! The behaviour every Idem backend must show, as reusable checks, one
//! module per capability (every check is re-exported at the crate root):
//!
//! | module | store | what it checks |
//! |---|---|---|
//! | `keys` | [`KeyStore`](idem_core::KeyStore) | claims, replay, mismatch, isolation, concurrency, bounded waits, expiry, optimistic claims, business writes with the key |
//! | `messages` | [`KeyStore`](idem_core::KeyStore) | values in the key transaction's messages round-trip, a dropped transaction rolls back, a record no longer pending commits nothing |
//! | `outbox` | [`OutboxStore`](idem_core::outbox::OutboxStore) | commit with the transaction, order per key, leases, backoff, purge |
//! | `inbox` | [`InboxStore`](idem_core::inbox::InboxStore) | once per subscriber, concurrent duplicates, collection; log positions with the transaction, never backwards |
//! | `webhooks` | [`WebhookStore`](idem_core::webhooks::WebhookStore) | stored once, entity order, counts, replay, content dedupe |
//! | `runs`, `send_once` | [`RunStore`](idem_core::steps::RunStore) | runs created with their key, fenced writes, takeovers only after the lease, claims never shared, listing; the send-once ledger |
//! | `tasks`, `task_asks` | [`TaskStore`](idem_core::tasks::TaskStore) | tasks once per key, cursors moved only from where they are, fenced claims and settles, actions once; `go` once per fence whoever asks |
//! | `leased` | [`LeasedKeyStore`](idem_core::leased::LeasedKeyStore) | leased claims, token-fenced writes, takeovers of abandoned records, resolution, unknown outcomes |
//! | `admin` | [`AdminStore`](idem_core::admin::AdminStore) | keyset pages, literal prefixes, actions and audit rows in the caller's transaction |
//! | `patterns` | [`PatternExec`](idem_sql::patterns::PatternExec) | upserts, versioned updates and transitions on a real table |
//! | `connections` | a backend's pool | callers cancelled mid-claim leave every connection clean |
//!
//! A backend runs each check against a real database in its integration
//! tests, the way `idem-sqlite` and `idem-postgres` do; each check takes a
//! store on an empty database (a fresh one per check) and panics with a
//! message naming the property that failed.
//!
//! ```no_run
//! # async fn run<S: idem_core::KeyStore>(fresh_store: impl Fn() -> S) {
//! idem_conformance::replay_and_mismatch(fresh_store()).await;
//! idem_conformance::rollback_leaves_no_record(fresh_store()).await;
//! idem_conformance::concurrent_claims_execute_once(fresh_store(), 16).await;
//! # }
//! ```
#![allow(clippy::unwrap_used)]

mod admin;
mod connections;
mod inbox;
mod keys;
mod leased;
mod messages;
mod outbox;
mod patterns;
mod runs;
mod send_once;
mod support;
mod task_asks;
mod tasks;
mod webhooks;

pub use admin::*;
pub use connections::*;
pub use inbox::*;
pub use keys::*;
pub use leased::unknown::*;
pub use leased::*;
pub use messages::*;
pub use outbox::*;
pub use patterns::*;
pub use runs::*;
pub use send_once::*;
pub use support::{fingerprint, response, scope};
pub use task_asks::*;
pub use tasks::*;
pub use webhooks::*;
