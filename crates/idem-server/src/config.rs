//! The server's settings, loaded from the built-in defaults, the `[server]`
//! table of the `--config` TOML file, the environment and the flags — each
//! over the one before ([`crate::flags::file_defaults`] turns the file's values into the
//! flags' defaults) — and validated here once into a [`ServerConfig`] of the
//! libraries' configs. Every bound a flag has is stated in this module (the
//! HTTP limits' in [`Limits::validate`], the webhook file's in
//! [`crate::webhooks`]).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::bail;
use idem_core::Policy;

use crate::admin::AdminToken;
use crate::flags::{check, within};

// Kept where the drill and the admin code (being moved out of the binary)
// still look for them.
use crate::demo::DemoConfig;
use crate::demo::checkout::CheckoutConfig;
pub use crate::flags::{
    HttpBase, MAX_BODY_BYTES_LIMIT, file_defaults, listen_address, nats_url, read_file,
};
use crate::http_server::Limits;
use crate::messaging::{ConsumeConfig, DUPLICATE_WINDOW};
use crate::webhooks::WebhookConfig;

/// Everything `idem serve` runs with, validated.
#[derive(Debug)]
pub struct ServerConfig {
    /// `--listen`.
    pub listen: SocketAddr,
    /// The HTTP server's limits.
    pub limits: Limits,
    /// `--admin-token`; `None` disables the admin routes.
    pub admin_token: Option<AdminToken>,
    /// `--admin-hosts`: the host names admin requests may name.
    pub admin_hosts: crate::admin::AllowedHosts,
    /// `--admin-lockout`: a guessing source's first lockout.
    pub admin_lockout: Duration,
    /// `--public-metrics`: `/metrics` without the admin token.
    pub public_metrics: bool,
    /// The demo routes.
    pub demo: DemoConfig,
    /// How often expired records are deleted.
    pub gc_interval: Duration,
    /// `--nats-url`: relay the outbox here.
    pub nats_url: Option<String>,
    /// `--consume`: the ledger consumer's settings.
    pub consume: Option<ConsumeConfig>,
    /// `--config`: webhook endpoints and workers.
    pub webhooks: Option<WebhookConfig>,
    /// `--provider-url` and the checkout's other flags.
    pub checkout: Option<CheckoutConfig>,
    /// `--respond-within`: how long an order request waits for its run.
    pub respond_within: Duration,
    /// `--upstream` and the file's `[gateway]`: serve as a gateway in front
    /// of that API instead of the demo.
    pub gateway: Option<idem_gateway::GatewayConfig>,
}

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
    Ok(ConsumeConfig {
        ack_wait,
        max_deliver,
    })
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
