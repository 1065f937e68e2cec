//! What `idem serve` runs with, validated from its flags and file by
//! `ServeArgs::config`: the server's own settings, and what it serves
//! besides its own routes — the demo apps or a gateway, never both, so a
//! gateway's configuration carries nothing of the demo.

use std::net::SocketAddr;
use std::time::Duration;

use crate::admin::{AdminToken, AllowedHosts};
use crate::messaging::ConsumeConfig;
use crate::webhooks::WebhookConfig;
use idem_httpd::Limits;

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
    pub admin_hosts: AllowedHosts,
    /// `--admin-lockout`: a guessing source's first lockout.
    pub admin_lockout: Duration,
    /// `--public-metrics`: `/metrics` without the admin token.
    pub public_metrics: bool,
    /// How often expired records are deleted.
    pub gc_interval: Duration,
    /// `--broker-url`: relay the outbox there.
    pub broker_url: Option<crate::messaging::BrokerUrl>,
    /// `--nats-replicas`: copies of each stream it creates.
    pub nats_replicas: usize,
    /// `--config`: webhook endpoints and workers.
    pub webhooks: Option<WebhookConfig>,
    /// The demo apps, or the gateway.
    pub app: App,
}

/// What the server serves besides its own routes (admin, metrics,
/// webhooks).
#[derive(Debug)]
pub enum App {
    /// The demo payments API, the stock routes and, with `--provider-url`,
    /// the checkout's orders.
    Demo(DemoApp),
    /// `--upstream` and the file's `[gateway]`: the gateway in front of
    /// that API instead of the demo.
    Gateway(idem_gateway::GatewayConfig),
}

/// The largest request body a route of this server accepts: the demo's and
/// the task API's `--max-body-bytes`, or the gateway's largest; every
/// webhook endpoint's `max_body_bytes`; and the admin API's 64 KiB. One
/// peer's share of the buffered bytes is at least this.
pub fn largest_body(app: &App, webhooks: Option<&WebhookConfig>) -> usize {
    let app = match app {
        App::Demo(d) => d.demo.routes.max_body_bytes,
        App::Gateway(g) => g.largest_body(),
    }
    .max(idem_admin::v1::MAX_BODY);
    webhooks
        .into_iter()
        .flat_map(|w| &w.endpoints)
        .map(|e| e.max_body_bytes)
        .fold(app, usize::max)
}

/// The demo apps' settings.
#[derive(Debug)]
pub struct DemoApp {
    /// The demo routes and the checkout ([`idem_demo::Demo`]).
    pub demo: idem_demo::Demo,
    /// `--consume`: the demo ledger consumer's settings.
    pub consume: Option<ConsumeConfig>,
}
