//! `idem relay`: the outbox relay alone.

use std::sync::Arc;
use std::time::Duration;

use idem_outbox::{DispatcherConfig, RelayFigures};
use tokio::sync::watch;

use super::args::{BrokerArgs, DbArgs, SideArgs, StreamArgs};
use crate::backend::{Backend, Job};
use crate::messaging::{self, Broker, BrokerUrl};
use crate::probe::SideListener;
use crate::{config, shutdown};

/// `idem relay`'s flags.
#[derive(clap::Args)]
pub struct RelayArgs {
    #[command(flatten)]
    db: DbArgs,
    #[command(flatten)]
    broker: BrokerArgs,
    /// How long claimed messages are hidden from other relays; a relay
    /// that dies holding some publishes them again after it (1s to 1h,
    /// shorter than the stream's 5 min duplicate window).
    #[arg(long, env = "IDEM_RELAY_LEASE", default_value = "30s", value_parser = humantime::parse_duration,
          help_heading = "Events")]
    lease: Duration,
    #[command(flatten)]
    stream: StreamArgs,
    #[command(flatten)]
    side: SideArgs,
}

impl RelayArgs {
    /// Relays until Ctrl-C or SIGTERM.
    pub async fn run(self) -> anyhow::Result<()> {
        let broker_url = self.broker.required()?;
        let lease = config::relay_lease(self.lease)?;
        let replicas = config::nats_replicas(self.stream.nats_replicas)?;
        let side = self.side.listener()?;
        let shutdown = shutdown::on_signal();
        let relay = Relay {
            broker_url,
            lease,
            replicas,
            side,
            shutdown,
        };
        self.db.open_existing().await?.run(relay).await
    }
}

struct Relay {
    broker_url: BrokerUrl,
    lease: Duration,
    replicas: usize,
    side: Option<SideListener>,
    shutdown: watch::Receiver<bool>,
}

impl Job for Relay {
    type Output = anyhow::Result<()>;
    async fn run<B: Backend>(self, store: B) -> anyhow::Result<()> {
        let wake = store.outbox_wake().await;
        let shutdown = self.shutdown;
        let (connected, broker) = watch::channel(None);
        if let Some(side) = self.side {
            side.start(
                store.clone(),
                (broker, self.broker_url.name()),
                shutdown.clone(),
            )
            .await?;
        }
        let routes = messaging::routes(self.replicas);
        let connect = Broker::connect(
            &self.broker_url,
            "idem-relay",
            &routes,
            None,
            shutdown.clone(),
        );
        let Some(broker) = connect.await? else {
            return Ok(());
        };
        connected.send_replace(Some(broker.clone()));
        let config = DispatcherConfig {
            poll_interval: B::RELAY_POLL,
            lease: self.lease,
            ..DispatcherConfig::default()
        };
        let (reporter, started) = tokio::sync::oneshot::channel();
        let report = tokio::spawn(report_figures(started));
        let started = move |figures| {
            let _ = reporter.send(figures);
        };
        let relayed = broker
            .relay(store, &routes, config, wake, started, shutdown)
            .await;
        report.abort();
        relayed
    }
}

/// Logs the relay's figures every 30 s once it has started.
async fn report_figures(started: tokio::sync::oneshot::Receiver<Arc<dyn RelayFigures>>) {
    let Ok(figures) = started.await else {
        return;
    };
    let mut tick = tokio::time::interval(Duration::from_secs(30));
    tick.tick().await;
    loop {
        tick.tick().await;
        if let Ok(s) = figures.stats().await {
            tracing::info!(figures = %crate::admin::outbox::stats_json(&s), "outbox");
        }
    }
}
