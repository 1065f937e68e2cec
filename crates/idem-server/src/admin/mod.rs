//! The operator's routes under `/admin` and every JSON shape they return
//! (the `idem webhooks` and `idem stats` commands print the same shapes).
//!
//! - [`auth`]: the guard over every `/admin` and `/console` path: a bearer
//!   token or a console session (cookie + CSRF token); the [`Actor`].
//! - [`outbox`]: `GET /admin/outbox`, the relay's lag figures.
//! - [`webhooks`]: stored webhook deliveries — list, show, replay, counters.

pub mod auth;
pub mod outbox;
pub mod webhooks;

pub use auth::{Actor, AdminToken, MAX_TOKEN_LEN, MIN_TOKEN_LEN, PREFIX, guarded};
