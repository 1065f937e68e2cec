//! The Idem admin API (`/admin/v1`) and web console (`/console`) as an
//! [`axum::Router`] any application can mount next to its own routes.
//!
//! The admin API lists and releases idempotency keys, inspects and requeues
//! the outbox and inbox, shows and replays webhook deliveries, resolves
//! workflow runs and reads the audit log (docs/admin-api.md). Every path
//! under `/admin` and `/console` sits behind one guard: a bearer token or a
//! console session (cookie + CSRF token), a `Host` allow-list, and a
//! per-source lockout of token guesses.
//!
//! ```no_run
//! # async fn demo(store: idem_sqlite::SqliteStore) -> Result<(), String> {
//! use idem_admin::{AdminConfig, AdminToken};
//!
//! let token = AdminToken::new(&std::env::var("ADMIN_TOKEN").unwrap_or_default())?;
//! let app = axum::Router::new()
//!     .route("/hello", axum::routing::get(|| async { "hi" }))
//!     .merge(idem_admin::router(store, AdminConfig::new(Some(token))));
//! # let _ = app; Ok(()) }
//! ```
//!
//! Entry point: [`router`] (over any [`AdminBackend`]: `SqliteStore` and
//! `PgStore` are). Serve the app with
//! `into_make_service_with_connect_info::<SocketAddr>()` so the lockout
//! knows each request's source.
//!
//! - [`auth`]: the guard and the [`Actor`] of the audit log;
//!   [`console`]: the console's pages, login and session (assets embedded).
//! - [`hosts`]: the `Host` allow-list (against DNS rebinding).
//! - [`limit`]: the limiter of admin token guesses.
//! - [`token`]: the admin token and its strength rule.
//! - [`v1`]: the versioned admin JSON API `/admin/v1`, the one admin API.
//! - [`retired`]: the unversioned routes `/admin/v1` replaced
//!   (`/admin/outbox`, `/admin/webhooks…`); each answers `410 Gone` naming
//!   its replacement.
//! - [`outbox`], [`webhooks`]: the JSON shapes of the outbox figures and
//!   webhook deliveries (also printed by `idem stats` and `idem webhooks`).
//! - [`backend`]: [`AdminBackend`], what the routes ask of the store.
//! - [`respond`]: problem+json and JSON answers every route shares.

// Handlers return early with a ready `Response` as their error; it is built
// once per rejected request, so its size does not matter.
#![allow(clippy::result_large_err)]

pub mod auth;
pub mod backend;
pub mod console;
pub mod hosts;
pub mod limit;
pub mod outbox;
pub mod respond;
pub mod retired;
pub mod token;
pub mod v1;
pub mod webhooks;

use std::sync::Arc;

use axum::Router;

pub use auth::{Actor, Auth, PREFIX};
pub use backend::AdminBackend;
pub use hosts::AllowedHosts;
pub use limit::Limits;
pub use token::{AdminToken, MAX_TOKEN_LEN, MIN_TOKEN_LEN};

/// How the admin surface is guarded.
#[derive(Default)]
pub struct AdminConfig {
    /// The admin token; `None` answers every admin request `401
    /// admin-disabled`.
    pub token: Option<AdminToken>,
    /// Host names accepted besides IP addresses and `localhost`.
    pub hosts: AllowedHosts,
    /// The lockout of sources guessing the token.
    pub limits: Limits,
}

impl AdminConfig {
    /// A guard with `token`, no extra host names and the default lockout.
    pub fn new(token: Option<AdminToken>) -> Self {
        Self {
            token,
            ..Self::default()
        }
    }

    /// The guard's state, to share with other guarded routes ([`guarded`]).
    pub fn into_auth(self) -> Arc<Auth> {
        Auth::new(self.token, self.hosts, self.limits)
    }
}

/// `/admin/v1` and `/console` over `store`, behind the guard `config`
/// describes (no relay figures: the relay runs elsewhere; no webhook
/// counters: mount [`v1::webhooks::stats_routes`] beside it where a
/// webhook receiver runs).
pub fn router<S: AdminBackend>(store: S, config: AdminConfig) -> Router {
    guarded(v1::router(store, Default::default()), config.into_auth())
}

/// Puts every path under `/admin` and `/console` behind the guard — routes
/// that exist and routes that do not alike, so the guard reveals nothing —
/// and mounts the console and the [`retired`] routes' `410`s. A request must name an allowed host (`421`, or
/// `400` without one); its `Origin`, if any, must be that host (`403`).
/// Then a bearer token or a console session when a token is configured,
/// `401 admin-disabled` when none is; a source guessing tokens is locked
/// out (`429`). The console's login page and its stylesheet need no
/// credentials.
pub fn guarded(router: Router, auth: Arc<Auth>) -> Router {
    let router = with_console(router, auth.clone());
    auth::layer(router, auth)
}

/// `router` with the console and the [`retired`] routes mounted, and no
/// guard: for a server that puts [`auth::guard`] around the whole of it
/// itself (what [`guarded`] does route by route).
pub fn with_console(router: Router, auth: Arc<Auth>) -> Router {
    router.merge(console::router(auth)).merge(retired::router())
}
