//! What `idem serve` starts on the backend once the database is open: the
//! key GC, the relay and the ledger consumer, the webhook workers, and the
//! routes of what it serves (the demo apps or the gateway).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::sync::watch;

use super::settings::{App, DemoApp, ServerConfig};
use crate::admin::outbox::RelaySlot;
use crate::backend::{Backend, Job};
use crate::messaging::{self, ConsumeConfig};
use crate::shutdown::stopped;
use crate::webhooks::WebhookConfig;

/// Starts the background work on the backend and returns the routes.
pub(super) struct Start<'a> {
    pub(super) config: &'a ServerConfig,
    pub(super) auth: &'a Arc<crate::admin::Auth>,
    pub(super) shutdown: &'a watch::Receiver<bool>,
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
        crate::commands::gc::spawn(store.clone(), config.gc_interval, shutdown)?;
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
                matches!(config.app, App::Gateway(_)),
                shutdown,
            ))
            .merge(metrics);
        match &config.app {
            App::Gateway(gateway) => {
                // The upstream's paths are the upstream's: no demo routes.
                let namespace = store.namespace().await?;
                // Several gateways on one database judge each other's leases
                // by one clock: the store's.
                // On the store's clock: the database's on PostgreSQL.
                let gateway = idem_gateway::Gateway::new(store.clone(), namespace, gateway.clone());
                Ok((own, Some(gateway.into_router())))
            }
            App::Demo(demo) => Ok((
                crate::demo::router(store.clone(), &demo.demo)
                    .merge(start_checkout(&store, demo, shutdown)?)
                    .merge(own),
                None,
            )),
        }
    }
}

/// The stock routes, and with `--provider-url` the order routes and the
/// recovery worker that resumes orders whose process died.
fn start_checkout<B: Backend>(
    store: &B,
    config: &DemoApp,
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
