//! The server's settings, loaded from the built-in defaults, the `[server]`
//! table of the `--config` TOML file, the environment and the flags — each
//! over the one before ([`crate::flags::file_defaults`] turns the file's values into the
//! flags' defaults) — and validated here into the libraries' configs, which
//! each command assembles (`idem serve`'s in its `ServerConfig`). Every
//! bound a flag has is stated in this module (the HTTP limits' in
//! [`Limits::validate`](idem_httpd::Limits::validate), the webhook
//! file's in [`crate::webhooks`]).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::bail;
use idem_core::Policy;

use crate::admin::AdminToken;
pub use crate::flags::{
    HttpBase, MAX_BODY_BYTES_LIMIT, file_defaults, listen_address, nats_url, read_file,
};
use crate::flags::{check, within};
use crate::messaging::{ConsumeConfig, DUPLICATE_WINDOW};
use idem_demo::DemoConfig;

/// `--gc-interval`.
pub fn gc_interval(every: Duration) -> anyhow::Result<Duration> {
    let day = Duration::from_secs(24 * 3600);
    check(within("--gc-interval", every, Duration::from_secs(1), day))
}

/// `--lease` of `idem relay`: shorter than the broker's duplicate window, so
/// a message republished after a relay crash is still dropped as a
/// duplicate.
pub fn relay_lease(lease: Duration) -> anyhow::Result<Duration> {
    if lease < Duration::from_secs(1) || lease >= DUPLICATE_WINDOW {
        bail!("--lease must be at least 1s and shorter than the 5 min duplicate window");
    }
    Ok(lease)
}

/// `--nats-replicas`: what JetStream accepts.
pub fn nats_replicas(n: usize) -> anyhow::Result<usize> {
    let max = idem_nats::StreamSettings::MAX_REPLICAS;
    if !(1..=max).contains(&n) {
        bail!("--nats-replicas must be 1 to {max} (3 in a three-node JetStream cluster), got {n}");
    }
    Ok(n)
}

/// The demo routes' settings from their flags.
pub fn demo(
    key_ttl: Duration,
    claim_mode: idem_core::ClaimMode,
    max_body_bytes: usize,
    events: bool,
    handler_timeout: Duration,
) -> anyhow::Result<DemoConfig> {
    let second = Duration::from_secs(1);
    check(within("--key-ttl", key_ttl, second, Policy::MAX_TTL))?;
    if max_body_bytes == 0 || max_body_bytes > MAX_BODY_BYTES_LIMIT {
        bail!(
            "--max-body-bytes must be between 1 and {MAX_BODY_BYTES_LIMIT}, got {max_body_bytes}"
        );
    }
    let ten_minutes = Duration::from_secs(600);
    check(within(
        "--handler-timeout",
        handler_timeout,
        second,
        ten_minutes,
    ))?;
    Ok(DemoConfig {
        key_ttl,
        claim_mode,
        max_body_bytes,
        events,
        handler_timeout,
        ..DemoConfig::default()
    })
}

/// `--respond-within`.
pub fn respond_within(wait: Duration) -> anyhow::Result<Duration> {
    check(within(
        "--respond-within",
        wait,
        Duration::ZERO,
        Duration::from_secs(60),
    ))
}

/// The ledger consumer's settings from `--ack-wait` and `--max-deliver`.
pub fn consume(ack_wait: Duration, max_deliver: u32) -> anyhow::Result<ConsumeConfig> {
    let twelve_hours = Duration::from_secs(12 * 3600);
    check(within(
        "--ack-wait",
        ack_wait,
        Duration::from_secs(1),
        twelve_hours,
    ))?;
    if !(1..=100).contains(&max_deliver) {
        bail!("--max-deliver must be between 1 and 100, got {max_deliver}");
    }
    Ok(crate::messaging::ledger(ack_wait, max_deliver))
}

/// `--admin-lockout`.
pub fn admin_lockout(first: Duration) -> anyhow::Result<Duration> {
    check(within(
        "--admin-lockout",
        first,
        Duration::from_secs(1),
        Duration::from_secs(3600),
    ))
}

/// The admin token, required off loopback.
pub fn admin_token(token: Option<&str>, listen: SocketAddr) -> anyhow::Result<Option<AdminToken>> {
    match token {
        Some(t) => Ok(Some(
            AdminToken::new(t).map_err(|e| anyhow::anyhow!("--admin-token: {e}"))?,
        )),
        None if !listen.ip().is_loopback() => bail!(
            "--listen {listen} is not a loopback address: set --admin-token (or \
             IDEM_ADMIN_TOKEN; generate one with: {}) so the admin API, the console \
             and /metrics are not open to the network",
            crate::admin::token::GENERATE
        ),
        None => Ok(None),
    }
}
