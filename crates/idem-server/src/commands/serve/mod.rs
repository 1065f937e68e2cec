//! `idem serve`: the demo payments API (or, with `--upstream`, a gateway in
//! front of another API), the key GC, and — with their flags — the relay,
//! the ledger consumer and the webhook endpoints. Here: the flags and their
//! validation; [`settings`]: the [`ServerConfig`] they are validated into;
//! `start`: what runs on the backend once the database is open.

use std::net::SocketAddr;
use std::time::Duration;

use super::args::{BrokerArgs, ConsumerArgs, DbArgs, StreamArgs};
use super::checkout::CheckoutArgs;
use crate::config;
use crate::flags;
use crate::shutdown::{self, stopped};
use idem_httpd::{self as http_server, Limits};

pub mod settings;
mod start;

pub use settings::{App, DemoApp, ServerConfig};
use start::Start;

/// `idem serve`'s flags.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to listen on: IP:PORT, or HOST:PORT (resolved once, the
    /// first address is used: `localhost:8080`).
    #[arg(long, env = "IDEM_LISTEN", default_value = "127.0.0.1:8080", value_parser = flags::listen_address, help_heading = "Listening")]
    listen: SocketAddr,
    /// How long a request head may take from its first byte (1s to 60s).
    #[arg(long, env = "IDEM_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration, help_heading = "Listening")]
    header_read_timeout: Duration,
    /// How long an idle keep-alive connection stays open (1s to 1h).
    #[arg(long, env = "IDEM_IDLE_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration, help_heading = "Listening")]
    idle_timeout: Duration,
    /// How long a request body may take after its head (1s to 1h); 408 after.
    #[arg(long, env = "IDEM_BODY_READ_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration, help_heading = "Listening")]
    body_read_timeout: Duration,
    /// Connections served at once (1 to 100000); 503 beyond.
    #[arg(
        long,
        env = "IDEM_MAX_CONNECTIONS",
        default_value_t = 1024,
        help_heading = "Listening"
    )]
    max_connections: usize,
    /// Request body bytes buffered at once over all requests; 503 beyond.
    /// At least the largest body a route accepts (--max-body-bytes, a
    /// webhook endpoint's or a gateway route's limit), at most 16 GiB.
    #[arg(long, env = "IDEM_MAX_BUFFERED_BYTES", default_value_t = 64 << 20, help_heading = "Listening")]
    max_buffered_bytes: usize,
    /// Of those, the most one client address (an IPv4 address, an IPv6
    /// /64) holds at once; 503 beyond. Default: an eighth of
    /// --max-buffered-bytes, at least the largest body accepted.
    #[arg(
        long,
        env = "IDEM_MAX_BUFFERED_BYTES_PER_PEER",
        help_heading = "Listening"
    )]
    max_buffered_bytes_per_peer: Option<usize>,
    /// Largest request body accepted, in bytes (413 above). At most 64 MiB.
    #[arg(long, env = "IDEM_MAX_BODY_BYTES", default_value_t = 1 << 20, help_heading = "Listening")]
    max_body_bytes: usize,
    #[command(flatten)]
    db: DbArgs,
    /// How often the collector deletes expired key, inbox and receipt records
    /// and old sent outbox messages (1s to 24h).
    #[arg(long, env = "IDEM_GC_INTERVAL", default_value = "60s", value_parser = humantime::parse_duration, help_heading = "Database")]
    gc_interval: Duration,
    /// How long key records live: retries after it execute again (the
    /// payment `reference` then still stops a second payment). 1s to 400d.
    #[arg(long, env = "IDEM_KEY_TTL", default_value = "24h", value_parser = humantime::parse_duration, help_heading = "Keys")]
    key_ttl: Duration,
    /// How the demo's payment and refund routes claim a fresh key:
    /// `pessimistic` writes a pending record first (a concurrent duplicate
    /// waits, then replays); `optimistic` writes the completed record once,
    /// at the end, and lets the primary key decide a race (a concurrent
    /// duplicate's writes roll back and it replays the winner). The checkout
    /// demo calls a provider and always claims pessimistically.
    #[arg(long, env = "IDEM_CLAIM_MODE", value_enum, default_value_t = ClaimModeArg::Pessimistic, help_heading = "Keys")]
    claim_mode: ClaimModeArg,
    /// How long a handler may run before it is rolled back with 503
    /// handler-timeout (1s to 10min).
    #[arg(long, env = "IDEM_HANDLER_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration, help_heading = "Keys")]
    handler_timeout: Duration,
    /// Payment events are written to the outbox and relayed to this broker
    /// by this process.
    #[command(flatten)]
    broker: BrokerArgs,
    /// Write payment events to the outbox without relaying them here (run
    /// `idem relay` next to it). `--events=false` turns off a file's `true`.
    #[arg(long, env = "IDEM_EVENTS", num_args = 0..=1, default_value_t = false,
          default_missing_value = "true", action = clap::ArgAction::Set, help_heading = "Events")]
    events: bool,
    #[command(flatten)]
    stream: StreamArgs,
    /// Also run the ledger consumer in this process (needs --broker-url).
    /// `--consume=false` turns off a file's `true`.
    #[arg(long, env = "IDEM_CONSUME", num_args = 0..=1, default_value_t = false,
          default_missing_value = "true", action = clap::ArgAction::Set, help_heading = "Events")]
    consume: bool,
    #[command(flatten)]
    consumer: ConsumerArgs,
    /// Bearer token for `/admin/…` (24 to 1024 visible ASCII characters,
    /// hard to guess: `openssl rand -hex 32`). Without it the admin routes
    /// answer 401; it is required when --listen is not a loopback address.
    #[arg(
        long,
        env = "IDEM_ADMIN_TOKEN",
        hide_env_values = true,
        help_heading = "Admin"
    )]
    admin_token: Option<String>,
    /// Host names the admin routes, the console and a guarded /metrics
    /// answer for, besides IP addresses and `localhost` (against DNS
    /// rebinding): comma-separated `NAME` (any port) or `NAME:PORT`.
    #[arg(
        long,
        env = "IDEM_ADMIN_HOSTS",
        default_value = "",
        help_heading = "Admin"
    )]
    admin_hosts: String,
    /// How long a source is locked out after 5 wrong admin tokens in a row
    /// (console logins and bearer requests); each further one doubles it,
    /// up to 15 min (1s to 1h).
    #[arg(long, env = "IDEM_ADMIN_LOCKOUT", default_value = "10s", value_parser = humantime::parse_duration, help_heading = "Admin")]
    admin_lockout: Duration,
    /// Serve `GET /metrics` (Prometheus text) without the admin token.
    /// Without it `/metrics` needs the token like `/admin`.
    /// `--public-metrics=false` turns off a file's `true`.
    #[arg(long, env = "IDEM_PUBLIC_METRICS", num_args = 0..=1, default_value_t = false,
          default_missing_value = "true", action = clap::ArgAction::Set, help_heading = "Admin")]
    public_metrics: bool,
    #[command(flatten)]
    checkout: CheckoutArgs,
    /// How long an order request waits for its run before `202 Accepted`
    /// (the run goes on) (0s to 60s).
    #[arg(long, env = "IDEM_RESPOND_WITHIN", default_value = "10s", value_parser = humantime::parse_duration, help_heading = "Demo")]
    respond_within: Duration,
    /// Also serve `POST /v1/payments-baseline`: the demo's payment without
    /// the idempotency layer (a retry pays twice), for `idem bench` to
    /// measure the layer against. Not for a real deployment; only as a flag
    /// (neither the environment nor the --config file sets it).
    #[arg(long, help_heading = "Demo")]
    bench_routes: bool,
    /// Serve as an idempotency gateway in front of this HTTP API
    /// (`http://HOST:PORT[/PREFIX]`) instead of the demo: every POST and
    /// PATCH is keyed (the key optional) unless the `--config` file's
    /// `[gateway]` table lists routes; other requests pass through.
    #[arg(long, env = "IDEM_UPSTREAM")]
    upstream: Option<String>,
    /// A TOML file: the gateway's upstream and routes (`[gateway]`),
    /// webhook endpoints (`[webhooks.<name>]`), their workers (`[worker]`)
    /// and defaults for these flags (`[server]`; the environment and the
    /// flags win).
    #[arg(long, env = "IDEM_CONFIG")]
    config: Option<std::path::PathBuf>,
    /// The text of `config`, as [`super::Cli::load`] read it.
    #[arg(skip)]
    pub(super) file_text: Option<String>,
}

impl ServeArgs {
    /// The flags, validated.
    fn config(&self) -> anyhow::Result<ServerConfig> {
        let broker_url = self.broker.url()?;
        // Read once (by `Cli::load`, or here when built otherwise): the
        // webhooks and the gateway see one version of the file.
        let file = match (&self.config, &self.file_text) {
            (Some(path), Some(text)) => Some((path.as_path(), text.clone())),
            (Some(path), None) => Some((path.as_path(), flags::read_file(path)?)),
            (None, _) => None,
        };
        let file = file.as_ref().map(|(p, t)| (*p, t.as_str()));
        let webhooks = file
            .map(|(path, text)| crate::webhooks::from_text(path, text))
            .transpose()?;
        if self.consume && broker_url.is_none() {
            anyhow::bail!("--consume needs --broker-url");
        }
        let consume = config::consume(self.consumer.ack_wait, self.consumer.max_deliver)?;
        let mut demo = config::demo(
            self.key_ttl,
            self.claim_mode.into(),
            self.max_body_bytes,
            self.events || broker_url.is_some(),
            self.handler_timeout,
        )?;
        demo.bench_routes = self.bench_routes;
        let gc_interval = config::gc_interval(self.gc_interval)?;
        let checkout = self.checkout.config()?;
        let respond_within = config::respond_within(self.respond_within)?;
        let gateway = crate::gateway::load(self.upstream.as_deref(), file, self.max_body_bytes)?;
        let app = match gateway {
            Some(_) if checkout.is_some() => anyhow::bail!(
                "--upstream (a gateway) and --provider-url (the checkout demo) are two different servers; start one of them"
            ),
            // The demo's flags were validated all the same: a bad one is
            // refused whichever app it would configure.
            Some(_) if self.consume => anyhow::bail!(
                "--consume runs the demo's ledger consumer, which a gateway (--upstream) does not have; consume the events with your own service"
            ),
            Some(_) if self.bench_routes => anyhow::bail!(
                "--bench-routes mounts a route of the demo, which a gateway (--upstream) does not serve"
            ),
            Some(gateway) => App::Gateway(gateway),
            None => App::Demo(DemoApp {
                demo: idem_demo::Demo {
                    routes: demo,
                    checkout,
                    respond_within,
                },
                consume: self.consume.then_some(consume),
            }),
        };
        let largest = settings::largest_body(&app, webhooks.as_ref());
        let limits = Limits {
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
            body_read_timeout: self.body_read_timeout,
            max_connections: self.max_connections,
            max_buffered_bytes: self.max_buffered_bytes,
            max_buffered_bytes_per_peer: self
                .max_buffered_bytes_per_peer
                .unwrap_or(Limits::default_share(self.max_buffered_bytes, largest)),
        };
        limits.validate(largest).map_err(anyhow::Error::msg)?;
        Ok(ServerConfig {
            listen: self.listen,
            limits,
            admin_token: config::admin_token(self.admin_token.as_deref(), self.listen)?,
            admin_hosts: crate::admin::AllowedHosts::parse(&self.admin_hosts)
                .map_err(|e| anyhow::anyhow!("--admin-hosts: {e}"))?,
            admin_lockout: config::admin_lockout(self.admin_lockout)?,
            public_metrics: self.public_metrics,
            gc_interval,
            broker_url,
            nats_replicas: config::nats_replicas(self.stream.nats_replicas)?,
            webhooks,
            app,
        })
    }

    /// Serves until Ctrl-C or SIGTERM.
    pub async fn run(self) -> anyhow::Result<()> {
        let config = self.config()?;
        let shutdown = shutdown::on_signal();
        let auth = crate::admin::Auth::new(
            config.admin_token.clone(),
            config.admin_hosts.clone(),
            crate::admin::limit::Limits::with_first_lock(config.admin_lockout),
        );
        let db = self.db.open().await?;
        let start = Start {
            config: &config,
            auth: &auth,
            shutdown: &shutdown,
        };
        let (api, gateway) = start.routes(db).await?;
        let (listener, bound) = http_server::bind(config.listen).await?;
        if config.admin_token.is_none() {
            tracing::info!(
                "admin routes disabled: start with --admin-token (or IDEM_ADMIN_TOKEN) to use /admin"
            );
        } else if !bound.ip().is_loopback() && config.admin_hosts.is_empty() {
            tracing::info!(
                "admin routes and the console answer requests addressed to an IP address or \
                 localhost; to reach them by a name, list it in --admin-hosts (IDEM_ADMIN_HOSTS)"
            );
        }
        match &config.app {
            App::Gateway(g) => tracing::info!(
                listen = %bound,
                upstream = %format!("http://{}{}", g.upstream.authority, g.upstream.prefix),
                routes = g.routes.len(),
                "idem serving as a gateway"
            ),
            App::Demo(d) => {
                tracing::info!(
                    listen = %bound,
                    claim_mode = ?d.demo.routes.claim_mode,
                    "idem serving the demo payments API"
                );
                if d.demo.routes.bench_routes {
                    tracing::warn!(
                        "--bench-routes: POST {} pays without an idempotency key (a retry pays \
                         twice); for benchmarks only",
                        idem_demo::BASELINE_PATH
                    );
                }
            }
        }
        let app = crate::routes::service(api, auth, gateway);
        http_server::serve(listener, app, config.limits.clone(), stopped(shutdown)).await;
        Ok(())
    }
}

/// `--claim-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ClaimModeArg {
    /// A pending record first; duplicates wait.
    Pessimistic,
    /// The completed record once, at the end; the primary key decides.
    Optimistic,
}

impl From<ClaimModeArg> for idem_core::ClaimMode {
    fn from(mode: ClaimModeArg) -> Self {
        match mode {
            ClaimModeArg::Pessimistic => Self::Pessimistic,
            ClaimModeArg::Optimistic => Self::Optimistic,
        }
    }
}
