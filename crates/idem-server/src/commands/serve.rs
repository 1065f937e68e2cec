//! `idem serve`: the demo payments API, the key GC, and — with their flags —
//! the relay, the ledger consumer and the webhook endpoints.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::sync::watch;

use super::{CheckoutArgs, ConsumerArgs, DbArgs};
use crate::admin::outbox::RelaySlot;
use crate::backend::{Backend, Db, Job};
use crate::config::{self, ServerConfig};
use crate::flags;
use crate::http_server::{self, Limits};
use crate::messaging::{self, ConsumeConfig};
use crate::shutdown::{self, stopped};
use crate::webhooks::WebhookConfig;

/// `idem serve`'s flags.
#[derive(clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Address to listen on: IP:PORT, or HOST:PORT (resolved once, the
    /// first address is used: `localhost:8080`).
    #[arg(long, env = "IDEM_LISTEN", default_value = "127.0.0.1:8080", value_parser = flags::listen_address)]
    listen: SocketAddr,
    /// Bearer token for `/admin/…` (24 to 1024 visible ASCII characters,
    /// hard to guess: `openssl rand -hex 32`). Without it the admin routes
    /// answer 401; it is required when --listen is not a loopback address.
    #[arg(long, env = "IDEM_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Host names the admin routes, the console and a guarded /metrics
    /// answer for, besides IP addresses and `localhost` (against DNS
    /// rebinding): comma-separated `NAME` (any port) or `NAME:PORT`.
    #[arg(long, env = "IDEM_ADMIN_HOSTS", default_value = "")]
    admin_hosts: String,
    /// How long a source is locked out after 5 wrong admin tokens in a row
    /// (console logins and bearer requests); each further one doubles it,
    /// up to 15 min (1s to 1h).
    #[arg(long, env = "IDEM_ADMIN_LOCKOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    admin_lockout: Duration,
    /// Serve `GET /metrics` (Prometheus text) without the admin token.
    /// Without it `/metrics` needs the token like `/admin`.
    /// `--public-metrics=false` turns off a file's `true`.
    #[arg(long, env = "IDEM_PUBLIC_METRICS", num_args = 0..=1, default_value_t = false,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    public_metrics: bool,
    /// How long a request head may take from its first byte (1s to 60s).
    #[arg(long, env = "IDEM_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    header_read_timeout: Duration,
    /// How long an idle keep-alive connection stays open (1s to 1h).
    #[arg(long, env = "IDEM_IDLE_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    idle_timeout: Duration,
    /// How long a request body may take after its head (1s to 1h); 408 after.
    #[arg(long, env = "IDEM_BODY_READ_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    body_read_timeout: Duration,
    /// Connections served at once (1 to 100000); 503 beyond.
    #[arg(long, env = "IDEM_MAX_CONNECTIONS", default_value_t = 1024)]
    max_connections: usize,
    /// Request body bytes buffered at once over all requests; 503 beyond.
    /// At least --max-body-bytes, at most 16 GiB.
    #[arg(long, env = "IDEM_MAX_BUFFERED_BYTES", default_value_t = 64 << 20)]
    max_buffered_bytes: usize,
    /// How long a handler may run before it is rolled back with 503
    /// handler-timeout (1s to 10min).
    #[arg(long, env = "IDEM_HANDLER_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    handler_timeout: Duration,
    /// How often the collector deletes expired key, inbox and receipt records
    /// and old sent outbox messages (1s to 24h).
    #[arg(long, env = "IDEM_GC_INTERVAL", default_value = "60s", value_parser = humantime::parse_duration)]
    gc_interval: Duration,
    /// How long key records live: retries after it execute again (the
    /// payment `reference` then still stops a second payment). 1s to 400d.
    #[arg(long, env = "IDEM_KEY_TTL", default_value = "24h", value_parser = humantime::parse_duration)]
    key_ttl: Duration,
    /// How the demo's payment and refund routes claim a fresh key:
    /// `pessimistic` writes a pending record first (a concurrent duplicate
    /// waits, then replays); `optimistic` writes the completed record once,
    /// at the end, and lets the primary key decide a race (a concurrent
    /// duplicate's writes roll back and it replays the winner). The checkout
    /// demo calls a provider and always claims pessimistically.
    #[arg(long, env = "IDEM_CLAIM_MODE", value_enum, default_value_t = ClaimModeArg::Pessimistic)]
    claim_mode: ClaimModeArg,
    /// Largest request body accepted, in bytes (413 above). At most 64 MiB.
    #[arg(long, env = "IDEM_MAX_BODY_BYTES", default_value_t = 1 << 20)]
    max_body_bytes: usize,
    /// NATS server: payment events are written to the outbox and relayed
    /// to JetStream by this process.
    #[arg(long, env = "IDEM_NATS_URL")]
    nats_url: Option<String>,
    /// Write payment events to the outbox without relaying them here (run
    /// `idem relay` next to it). `--events=false` turns off a file's `true`.
    #[arg(long, env = "IDEM_EVENTS", num_args = 0..=1, default_value_t = false,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    events: bool,
    /// Also run the ledger consumer in this process (needs --nats-url).
    /// `--consume=false` turns off a file's `true`.
    #[arg(long, env = "IDEM_CONSUME", num_args = 0..=1, default_value_t = false,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    consume: bool,
    #[command(flatten)]
    consumer: ConsumerArgs,
    #[command(flatten)]
    checkout: CheckoutArgs,
    /// How long an order request waits for its run before `202 Accepted`
    /// (the run goes on) (0s to 60s).
    #[arg(long, env = "IDEM_RESPOND_WITHIN", default_value = "10s", value_parser = humantime::parse_duration)]
    respond_within: Duration,
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
        if let Some(url) = &self.nats_url {
            flags::nats_url(url)?;
        }
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
        if self.consume && self.nats_url.is_none() {
            anyhow::bail!("--consume needs --nats-url");
        }
        let consume = config::consume(self.consumer.ack_wait, self.consumer.max_deliver)?;
        let demo = config::demo(
            self.key_ttl,
            self.claim_mode.into(),
            self.max_body_bytes,
            self.events || self.nats_url.is_some(),
            self.handler_timeout,
        )?;
        let gc_interval = config::gc_interval(self.gc_interval)?;
        let checkout = self.checkout.config()?;
        let respond_within = config::respond_within(self.respond_within)?;
        let gateway = crate::gateway::load(self.upstream.as_deref(), file, self.max_body_bytes)?;
        if gateway.is_some() && checkout.is_some() {
            anyhow::bail!(
                "--upstream (a gateway) and --provider-url (the checkout demo) are two different servers; start one of them"
            );
        }
        let limits = Limits {
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
            body_read_timeout: self.body_read_timeout,
            max_connections: self.max_connections,
            max_buffered_bytes: self.max_buffered_bytes,
        };
        limits
            .validate(self.max_body_bytes)
            .map_err(anyhow::Error::msg)?;
        Ok(ServerConfig {
            listen: self.listen,
            limits,
            admin_token: config::admin_token(self.admin_token.as_deref(), self.listen)?,
            admin_hosts: crate::admin::AllowedHosts::parse(&self.admin_hosts)
                .map_err(|e| anyhow::anyhow!("--admin-hosts: {e}"))?,
            admin_lockout: config::admin_lockout(self.admin_lockout)?,
            public_metrics: self.public_metrics,
            demo,
            gc_interval,
            nats_url: self.nats_url.clone(),
            consume: self.consume.then_some(consume),
            webhooks,
            checkout,
            respond_within,
            gateway,
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
        let (api, gateway) = Db::open(&self.db.database_url)
            .await?
            .run(Start {
                config: &config,
                auth: &auth,
                shutdown: &shutdown,
            })
            .await?;
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
        match &config.gateway {
            Some(g) => tracing::info!(
                listen = %bound,
                upstream = %format!("http://{}{}", g.upstream.authority, g.upstream.prefix),
                routes = g.routes.len(),
                "idem serving as a gateway"
            ),
            None => tracing::info!(
                listen = %bound,
                claim_mode = ?config.demo.claim_mode,
                "idem serving the demo payments API"
            ),
        }
        let app = crate::routes::service(api, auth, gateway);
        http_server::serve(listener, app, config.limits.clone(), stopped(shutdown)).await;
        Ok(())
    }
}

/// Starts the background work on the backend and returns the routes.
struct Start<'a> {
    config: &'a ServerConfig,
    auth: &'a Arc<crate::admin::Auth>,
    shutdown: &'a watch::Receiver<bool>,
}

impl Job for Start<'_> {
    /// Idem's own routes, and the gateway's fallback when there is one.
    type Output = anyhow::Result<(Router, Option<Router>)>;
    async fn run<B: Backend>(self, store: B) -> Self::Output {
        let Start {
            config,
            auth,
            shutdown,
        } = self;
        let access = match config.public_metrics {
            true => crate::metrics::Access::Public,
            false => crate::metrics::Access::Token(auth.clone()),
        };
        let metrics = crate::metrics::router(store.clone(), access, crate::metrics::install());
        super::gc::spawn(store.clone(), config.gc_interval, shutdown)?;
        let relay = start_messaging(
            &store,
            config.nats_url.as_deref(),
            config.consume.clone(),
            shutdown,
        );
        let own = crate::admin::v1::router(store.clone(), relay)
            .merge(start_webhooks(
                &store,
                config.webhooks.as_ref(),
                config.gateway.is_some(),
                shutdown,
            ))
            .merge(metrics);
        if let Some(gateway) = &config.gateway {
            // The upstream's paths are the upstream's: no demo routes.
            let namespace = store.namespace().await?;
            // Several gateways on one database judge each other's leases
            // by one clock: the store's.
            // On the store's clock: the database's on PostgreSQL.
            let gateway = idem_gateway::Gateway::new(store.clone(), namespace, gateway.clone());
            return Ok((own, Some(gateway.into_router())));
        }
        Ok((
            crate::demo::router(store.clone(), &config.demo)
                .merge(start_checkout(&store, config, shutdown)?)
                .merge(own),
            None,
        ))
    }
}

/// The stock routes, and with `--provider-url` the order routes and the
/// recovery worker that resumes orders whose process died.
fn start_checkout<B: Backend>(
    store: &B,
    config: &ServerConfig,
    shutdown: &watch::Receiver<bool>,
) -> anyhow::Result<Router> {
    let runs = match &config.checkout {
        Some(checkout) => {
            let runs = checkout.runs(store.clone())?;
            tokio::spawn(runs.recovery().run(stopped(shutdown.clone())));
            tracing::info!(
                provider = checkout.provider_url,
                mail = checkout.mail_url.as_deref().unwrap_or("none"),
                holder = runs.holder(),
                "orders enabled at /v1/orders; recovering their runs"
            );
            Some(runs)
        }
        None => None,
    };
    crate::demo::checkout::routes::router(store.clone(), runs, &config.demo, config.respond_within)
}

/// Starts the relay (and the consumer) in the background when a NATS URL is
/// given. The relay needs the streams, hence the server; until it is up the
/// API works and events wait in the outbox. Returns the slot the relay is put
/// in once it runs.
fn start_messaging<B: Backend>(
    store: &B,
    nats_url: Option<&str>,
    consume: Option<ConsumeConfig>,
    shutdown: &watch::Receiver<bool>,
) -> RelaySlot<B> {
    let slot = RelaySlot::<B>::default();
    let Some(url) = nats_url else {
        return slot;
    };
    let (url, store, shutdown, filled) = (
        url.to_owned(),
        store.clone(),
        shutdown.clone(),
        slot.clone(),
    );
    tokio::spawn(async move {
        let Some(js) = messaging::prepare(&url, "idem-serve", shutdown.clone()).await else {
            return;
        };
        if let Some(config) = consume {
            let ledger = crate::demo::Ledger::<B>::new();
            let task =
                messaging::consume(store.clone(), js.clone(), ledger, config, shutdown.clone());
            tokio::spawn(task);
        }
        let lease = idem_outbox::DispatcherConfig::default().lease;
        match messaging::dispatcher(store.clone(), store.clock(), js, B::RELAY_POLL, lease) {
            Ok(d) => {
                let d = Arc::new(d);
                let _ = filled.set(d.clone());
                messaging::relay(d, store.outbox_wake().await, shutdown).await
            }
            Err(e) => tracing::error!(error = %format!("{e:#}"), "relay not started"),
        }
    });
    slot
}

/// Mounts the webhook routes and starts the workers, when a configuration
/// declares endpoints.
fn start_webhooks<B: Backend>(
    store: &B,
    config: Option<&WebhookConfig>,
    gateway: bool,
    shutdown: &watch::Receiver<bool>,
) -> Router {
    use crate::admin::v1::webhooks as admin;
    // `/admin/v1/webhooks/stats` answers without endpoints too (`{}`).
    let stored_only = || {
        let receiver = Arc::new(idem_webhooks::Receiver::with_clock(
            store.clone(),
            vec![],
            store.clock(),
        ));
        admin::stats_routes(receiver)
    };
    let Some(config) = config else {
        return stored_only();
    };
    if config.endpoints.is_empty() {
        // A file for the gateway alone needs no webhooks.
        if gateway {
            return stored_only();
        }
        tracing::warn!(
            "--config: no webhook endpoints are configured (no [webhooks.<name>] table); no webhooks are received"
        );
        return stored_only();
    }
    let receiver = Arc::new(idem_webhooks::Receiver::with_clock(
        store.clone(),
        config.endpoints.clone(),
        store.clock(),
    ));
    match crate::webhooks::processor(store.clone(), store.clock(), config) {
        Ok(processor) => {
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                processor
                    .run(Duration::from_secs(3600), stopped(shutdown))
                    .await
            });
        }
        // Not reached: the worker settings were validated when the file was read.
        Err(e) => tracing::error!(error = %e, "webhook workers not started"),
    }
    let names: Vec<&str> = config.endpoints.iter().map(|e| e.name.as_str()).collect();
    tracing::info!(endpoints = ?names, "receiving webhooks at /webhooks/{{endpoint}}");
    idem_webhooks::route::router(receiver.clone()).merge(admin::stats_routes(receiver))
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
