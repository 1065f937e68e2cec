//! The operator's routes under `/admin` and every JSON shape they return
//! (the `idem webhooks` and `idem stats` commands print the same shapes).
//!
//! - [`auth`]: the guard over every `/admin` and `/console` path: a bearer
//!   token or a console session (cookie + CSRF token); the [`Actor`].
//! - [`outbox`]: `GET /admin/outbox`, the relay's lag figures.
//! - [`webhooks`]: stored webhook deliveries — list, show, replay, counters.
//! - [`v1`]: the versioned admin JSON API `/admin/v1` (docs/admin-api.md).

pub mod auth;
pub mod outbox;
pub mod v1;
pub mod webhooks;

pub use auth::{AdminToken, MAX_TOKEN_LEN, MIN_TOKEN_LEN, PREFIX, guarded};

/// Who is acting, for the audit log: set as a request extension by the
/// authentication layer (the console's login name, or a bearer request's
/// `X-Idem-Actor`); `admin` when absent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor(pub String);
