//! The library half of the `idem` binary: the demo payments API, so tests and
//! benchmarks can run it in-process, and every command.
//!
//! - [`commands`]: one module per command (flags and `run`); `main.rs` only
//!   parses and dispatches.
//! - [`backend`]: the one place the backends are told apart ([`backend::Db`]);
//!   everything else is generic over [`backend::Backend`].
//! - [`config`]: flags and files validated into the libraries' configs.
//! - [`demo`]: the payments API and its ledger consumer.
//! - [`gateway`]: `idem serve --upstream`, the contract in front of any HTTP
//!   API (keys claimed with a lease, forwards with a derived key).
//! - [`admin`]: `/admin` — the guard, the routes and their JSON shapes;
//!   [`console`]: the web console at `/console` (login, sessions, assets).
//! - [`respond`]: responses every route shares; [`routes`]: the app around
//!   them (404/405, panics as problem+json); [`http_server`]: the hyper loop
//!   and its limits; [`shutdown`]; [`logging`].
//! - [`messaging`], [`webhooks`]: NATS streams, the relay and consumer; the
//!   webhook configuration file and workers.
//! - [`bench`](mod@bench): `idem bench`; [`drill`]: `idem drill`, the
//!   black-box conformance runner, also callable in-process ([`drill::run`]).
#![allow(missing_docs)]
// Demo handlers return early with a ready `Response` as their error; it is built
// once per rejected request, so its size does not matter.
#![allow(clippy::result_large_err)]

pub mod admin;
pub mod backend;
pub mod bench;
pub mod commands;
pub mod config;
pub mod config_error;
pub mod console;
pub mod demo;
pub mod drill;
pub mod flags;
pub mod gateway;
pub mod http_server;
pub mod logging;
pub mod messaging;
pub mod metrics;
pub mod progress;
pub mod respond;
pub mod routes;
pub mod shutdown;
pub mod webhooks;

/// A duration as an operator types it (`0s`, `250ms`, `90s`, `400days`),
/// for error messages.
pub fn duration_text(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) {
        return format!("{ms}ms");
    }
    let s = d.as_secs();
    match s {
        0 => "0s".into(),
        s if s % 86_400 == 0 && s > 86_400 => format!("{}days", s / 86_400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 && s >= 60 => format!("{}min", s / 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn durations_read_as_typed() {
        let t = |ms: u64| super::duration_text(Duration::from_millis(ms));
        assert_eq!(t(0), "0s");
        assert_eq!(t(250), "250ms");
        assert_eq!(t(1500), "1500ms");
        assert_eq!(t(90_000), "90s");
        assert_eq!(t(120_000), "2min");
        assert_eq!(t(3_600_000), "1h");
        assert_eq!(t(86_400_000), "24h");
        assert_eq!(t(400 * 86_400_000), "400days");
        for ms in [250, 90_000, 120_000, 3_600_000, 400 * 86_400_000] {
            assert_eq!(
                humantime::parse_duration(&t(ms)).unwrap(),
                Duration::from_millis(ms)
            );
        }
    }
}
