//! The operator's routes under `/admin` and every JSON shape they return
//! (the `idem webhooks` and `idem stats` commands print the same shapes).
//!
//! - [`auth`]: the guard over every `/admin` and `/console` path: a bearer
//!   token or a console session (cookie + CSRF token); the [`Actor`].
//! - [`hosts`]: the `Host` allow-list (against DNS rebinding).
//! - [`limit`]: the limiter of admin token guesses.
//! - [`token`]: the admin token and its strength rule.
//! - [`outbox`]: `GET /admin/outbox`, the relay's lag figures.
//! - [`webhooks`]: stored webhook deliveries — list, show, replay, counters.
//! - [`v1`]: the versioned admin JSON API `/admin/v1` (docs/admin-api.md).

pub mod auth;
pub mod hosts;
pub mod limit;
pub mod outbox;
pub mod token;
pub mod v1;
pub mod webhooks;

pub use auth::{Auth, PREFIX, guarded};
pub use hosts::AllowedHosts;
pub use token::{AdminToken, MAX_TOKEN_LEN, MIN_TOKEN_LEN};

/// Who is acting, for the audit log: set as a request extension by the
/// authentication layer (the console's login name, or a bearer request's
/// `X-Idem-Actor`); `admin` when absent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor(pub String);
