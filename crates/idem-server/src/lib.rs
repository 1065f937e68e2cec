//! The library half of the `idem` binary: the demo payments API, so tests and
//! benchmarks can run it in-process, and every command.
//!
//! - [`commands`]: one module per command (flags and `run`); `main.rs` only
//!   parses and dispatches.
//! - [`backend`]: the one place the backends are told apart ([`backend::Db`]);
//!   everything else is generic over [`backend::Backend`].
//! - [`config`]: flags and files validated into the libraries' configs
//!   (`idem serve`'s whole [`ServerConfig`](commands::serve::ServerConfig):
//!   the demo apps or a gateway, never both).
//! - [`demo`]: the payments API and its ledger consumer.
//! - [`gateway`]: `idem serve --upstream`, the contract in front of any HTTP
//!   API (keys claimed with a lease, forwards with a derived key).
//! - [`admin`]: the `idem-admin` crate (`/admin`, the guard, the console),
//!   re-exported; the binary only wires it.
//! - [`respond`]: responses every route shares (`idem_admin::respond`); [`routes`]: the app around
//!   them (404/405, panics as problem+json); [`http_server`]: the hyper loop
//!   and its limits; [`shutdown`]; [`logging`].
//! - [`messaging`], [`webhooks`]: NATS streams, the relay and consumer; the
//!   webhook configuration file and workers; [`probe`]: `/healthz`,
//!   `/readyz`, and the side listener of `idem relay` and `idem consume`.
//! - [`bench`](mod@bench): `idem bench`; [`drill`]: `idem drill`, the
//!   black-box conformance runner, also callable in-process ([`drill::run`]).
#![allow(missing_docs)]
// Demo handlers return early with a ready `Response` as their error; it is built
// once per rejected request, so its size does not matter.
#![allow(clippy::result_large_err)]

pub use idem_admin as admin;
pub mod backend;
pub mod bench;
pub mod commands;
pub mod config;
pub mod config_error;
pub use idem_admin::console;
pub mod demo;
pub mod drill;
pub mod flags;
pub mod gateway;
pub mod http_server;
pub mod logging;
pub mod messaging;
pub mod metrics;
pub mod probe;
pub mod progress;
pub use idem_admin::respond;
pub mod routes;
pub mod shutdown;
pub mod webhooks;
