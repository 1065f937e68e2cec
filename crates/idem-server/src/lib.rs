//! The library half of the `idem` binary: the wiring of flags and files into
//! the libraries' configs, and every command. What the binary serves or
//! runs besides Idem's own routes lives in libraries: the demo apps in
//! `idem-demo` (re-exported as [`demo`]), the benchmark in `idem-bench`, the
//! bounded HTTP loop in `idem-httpd`.
//!
//! - [`commands`]: one module per command (flags and `run`); `main.rs` only
//!   parses and dispatches.
//! - [`backend`]: the one place the backends are told apart ([`backend::Db`]);
//!   everything else is generic over [`backend::Backend`].
//! - [`config`]: flags and files validated into the libraries' configs
//!   (`idem serve`'s whole [`ServerConfig`](commands::serve::ServerConfig):
//!   the demo apps or a gateway, never both).
//! - [`demo`]: the `idem-demo` crate, re-exported: the payments API, its
//!   ledger consumer, the checkout; `idem serve` mounts
//!   [`demo::Demo::router`].
//! - [`gateway`]: `idem serve --upstream`, the contract in front of any HTTP
//!   API (keys claimed with a lease, forwards with a derived key).
//! - [`admin`]: the `idem-admin` crate (`/admin`, the guard, the console),
//!   re-exported; the binary only wires it.
//! - [`respond`]: responses every route shares (`idem_admin::respond`); [`routes`]: the app around
//!   them (404/405, panics as problem+json); the hyper loop and its limits
//!   are `idem-httpd`'s; [`shutdown`]; [`logging`].
//! - [`messaging`], [`webhooks`]: the demo's routes on the broker
//!   `--broker-url` names (run by `idem-broker`); the webhook configuration
//!   file and workers; [`probe`]: `/healthz`,
//!   `/readyz`, and the side listener of `idem relay` and `idem consume`.
//! - `idem bench` runs `idem_bench::run`; [`drill`]: `idem drill`, the
//!   black-box conformance runner, also callable in-process ([`drill::run`]).
#![allow(missing_docs)]

pub use idem_admin as admin;
pub mod backend;
pub mod commands;
pub mod config;
pub mod config_error;
pub use idem_admin::console;
pub use idem_demo as demo;
pub mod drill;
pub mod flags;
pub mod gateway;
pub mod logging;
pub mod messaging;
pub mod metrics;
pub mod probe;
pub mod progress;
pub use idem_admin::respond;
pub mod routes;
pub mod shutdown;
pub mod webhooks;
