//! The operator's routes under `/admin` and every JSON shape they return
//! (the `idem webhooks` and `idem stats` commands print the same shapes).
//!
//! - [`auth`]: the bearer-token guard over every `/admin` path.
//! - [`outbox`]: `GET /admin/outbox`, the relay's lag figures.
//! - [`webhooks`]: stored webhook deliveries — list, show, replay, counters.

pub mod auth;
pub mod outbox;
pub mod webhooks;

pub use auth::{AdminToken, MAX_TOKEN_LEN, MIN_TOKEN_LEN, PREFIX, guarded};
