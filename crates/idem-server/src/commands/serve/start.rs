//! What `idem serve` starts once the database is open: the key GC, the
//! relay, the webhook workers and Idem's own routes on every backend
//! ([`Own`]); then what it serves besides — the gateway ([`GatewayStart`])
//! or the demo apps with their ledger consumer ([`DemoStart`], the only
//! part that makes the demo's tables).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::sync::watch;

use super::settings::{App, DemoApp, ServerConfig};
use crate::admin::outbox::RelaySlot;
use crate::backend::{Backend, Db, DemoJob, Job};
use crate::messaging;
use crate::shutdown::stopped;
use crate::webhooks::WebhookConfig;

/// The broker's context once the relay has connected, for the consumer.
type BrokerWatch = crate::probe::Broker;
use crate::messaging::Broker;

/// Starts the background work on the backend and returns the routes.
pub(super) struct Start<'a> {
    pub(super) config: &'a ServerConfig,
    pub(super) auth: &'a Arc<crate::admin::Auth>,
    pub(super) shutdown: &'a watch::Receiver<bool>,
}

impl Start<'_> {
    /// Idem's own routes and the demo's, or Idem's own routes and the
    /// gateway's fallback.
    pub(super) async fn routes(self, db: Db) -> anyhow::Result<(Router, Option<Router>)> {
        let (own, broker) = db.clone().run(Own(&self)).await?;
        match &self.config.app {
            App::Gateway(gateway) => {
                let gateway = db.run(GatewayStart(gateway)).await?;
                Ok((own, Some(gateway)))
            }
            App::Demo(demo) => {
                let start = DemoStart {
                    config: demo,
                    broker,
                    broker_url: self.config.broker_url.as_ref(),
                    replicas: self.config.nats_replicas,
                    shutdown: self.shutdown,
                };
                Ok((db.run_demo(start).await??.merge(own), None))
            }
        }
    }
}

/// The GC, the relay, the webhook workers; the admin, metrics and webhook
/// routes.
struct Own<'a>(&'a Start<'a>);

impl Job for Own<'_> {
    type Output = anyhow::Result<(Router, BrokerWatch)>;
    async fn run<B: Backend>(self, store: B) -> Self::Output {
        let Start {
            config,
            auth,
            shutdown,
        } = self.0;
        let access = match config.public_metrics {
            true => crate::metrics::Access::Public,
            false => crate::metrics::Access::Token((*auth).clone()),
        };
        let metrics = crate::metrics::router(store.clone(), access, crate::metrics::install());
        crate::commands::gc::spawn(store.clone(), config.gc_interval, shutdown)?;
        let (relay, broker) = start_messaging(
            &store,
            config.broker_url.as_ref(),
            config.nats_replicas,
            shutdown,
        );
        let ready = crate::probe::router(
            store.clone(),
            config
                .broker_url
                .as_ref()
                .map(|u| (broker.clone(), u.name())),
            false,
        );
        // The task API's paths are /v1/…: a gateway's /v1 is its upstream's.
        let tasks = match &config.app {
            App::Gateway(_) => axum::Router::new(),
            App::Demo(demo) => {
                let tasks =
                    idem_tasks::Tasks::new(store.clone(), idem_tasks::TasksConfig::default())
                        .await?;
                let mut http = idem_tasks::http::HttpConfig::new(trusted_tenant());
                // Bounded like the demo's routes (`--max-body-bytes`).
                http.max_body_bytes = demo.demo.routes.max_body_bytes;
                idem_tasks::http::router(tasks, http)?
            }
        };
        let own = crate::admin::v1::router(store.clone(), relay)
            .merge(tasks)
            .merge(start_webhooks(
                &store,
                config.webhooks.as_ref(),
                matches!(config.app, App::Gateway(_)),
                shutdown,
            ))
            .merge(metrics)
            .merge(ready);
        Ok((own, broker))
    }
}

/// The tenant of a request to Idem's own APIs: the `X-Tenant-Id` header
/// (set by a trusted proxy), `default` without one.
fn trusted_tenant() -> idem_http::TenantSource {
    idem_http::TenantSource::TrustedHeader {
        name: axum::http::HeaderName::from_static("x-tenant-id"),
        default: idem_core::Tenant::new("default").ok(),
    }
}

/// The gateway in front of the upstream: its routes are the upstream's.
struct GatewayStart<'a>(&'a idem_gateway::GatewayConfig);

impl Job for GatewayStart<'_> {
    type Output = anyhow::Result<Router>;
    async fn run<B: Backend>(self, store: B) -> Self::Output {
        let namespace = store.namespace().await?;
        // Several gateways on one database judge each other's leases by one
        // clock: the store's (the database's on PostgreSQL).
        let gateway = idem_gateway::Gateway::new(store, namespace, self.0.clone());
        Ok(gateway.into_router())
    }
}

/// The demo payments API, the stock and order routes, the checkout's
/// recovery, and with `--consume` the ledger consumer.
struct DemoStart<'a> {
    config: &'a DemoApp,
    broker: BrokerWatch,
    broker_url: Option<&'a messaging::BrokerUrl>,
    replicas: usize,
    shutdown: &'a watch::Receiver<bool>,
}

impl DemoJob for DemoStart<'_> {
    type Output = anyhow::Result<Router>;
    async fn run<B: Backend + idem_demo::Store>(self, store: B) -> Self::Output {
        let DemoStart {
            config,
            mut broker,
            broker_url,
            replicas,
            shutdown,
        } = self;
        if let (Some(consume), Some(url)) = (config.consume.clone(), broker_url.cloned()) {
            let (store, shutdown) = (store.clone(), shutdown.clone());
            tokio::spawn(async move {
                let connected = tokio::select! {
                    _ = stopped(shutdown.clone()) => return,
                    b = broker.wait_for(Option::is_some) => match b {
                        Ok(b) => b.clone(),
                        // The relay gave up (bad settings, said so): no broker.
                        Err(_) => return,
                    },
                };
                if connected.is_none() {
                    return;
                }
                // Its own connection: on RabbitMQ, the link that declares
                // its queue.
                let routes = messaging::routes(replicas);
                let url = &url;
                let connect = Broker::connect(
                    url,
                    "idem-serve-consumer",
                    &routes,
                    Some(&consume),
                    shutdown.clone(),
                );
                let consumed = match connect.await {
                    Ok(Some(b)) => {
                        let ledger = idem_demo::Ledger::<B>::new();
                        b.consume(store, &routes, ledger, &consume, shutdown).await
                    }
                    Ok(None) => Ok(()),
                    Err(e) => Err(e),
                };
                if let Err(e) = consumed {
                    tracing::error!(error = %format!("{e:#}"), "consumer stopped");
                }
            });
        }
        config.demo.router(store, stopped(shutdown.clone()))
    }
}

/// Starts the relay in the background when a broker URL is given. The
/// relay needs the broker's streams or exchange; until they are there the
/// API works and events wait in the outbox. Returns the slot the relay is
/// put in once it runs, and the broker once connected.
fn start_messaging<B: Backend>(
    store: &B,
    broker_url: Option<&messaging::BrokerUrl>,
    replicas: usize,
    shutdown: &watch::Receiver<bool>,
) -> (RelaySlot<B>, BrokerWatch) {
    let slot = RelaySlot::<B>::default();
    let (connected, broker) = watch::channel(None);
    let Some(url) = broker_url else {
        return (slot, broker);
    };
    let (url, store, shutdown, filled) =
        (url.clone(), store.clone(), shutdown.clone(), slot.clone());
    tokio::spawn(async move {
        let routes = messaging::routes(replicas);
        let connect = Broker::connect(&url, "idem-serve", &routes, None, shutdown.clone());
        let b = match connect.await {
            Ok(Some(b)) => b,
            Ok(None) => return,
            // The API goes on; the events wait in the outbox for a relay.
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "relay not started");
                return;
            }
        };
        connected.send_replace(Some(b.clone()));
        let config = idem_outbox::DispatcherConfig {
            poll_interval: B::RELAY_POLL,
            ..idem_outbox::DispatcherConfig::default()
        };
        let wake = store.outbox_wake().await;
        let started = move |figures| {
            let _ = filled.set(figures);
        };
        let relay = b.relay(store, &routes, config, wake, started, shutdown);
        if let Err(e) = relay.await {
            tracing::error!(error = %format!("{e:#}"), "relay not started");
        }
    });
    (slot, broker)
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
