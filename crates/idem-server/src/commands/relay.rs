//! `idem relay`: the outbox relay alone.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::args::{DbArgs, SideArgs, StreamArgs};
use crate::admin::outbox::stats_json;
use crate::backend::{Backend, Job};
use crate::probe::SideListener;
use crate::{config, messaging, shutdown};

/// `idem relay`'s flags.
#[derive(clap::Args)]
pub struct RelayArgs {
    #[command(flatten)]
    db: DbArgs,
    /// NATS server.
    #[arg(long, env = "IDEM_NATS_URL", help_heading = "Events")]
    nats_url: String,
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
        crate::flags::nats_url(&self.nats_url)?;
        let lease = config::relay_lease(self.lease)?;
        let replicas = config::nats_replicas(self.stream.nats_replicas)?;
        let side = self.side.listener()?;
        let shutdown = shutdown::on_signal();
        let relay = Relay {
            nats_url: self.nats_url,
            lease,
            replicas,
            side,
            shutdown,
        };
        self.db.open_existing().await?.run(relay).await
    }
}

struct Relay {
    nats_url: String,
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
            side.start(store.clone(), broker, shutdown.clone()).await?;
        }
        let Some(js) = messaging::prepare(
            &self.nats_url,
            "idem-relay",
            self.replicas,
            shutdown.clone(),
        )
        .await?
        else {
            return Ok(());
        };
        connected.send_replace(Some(js.clone()));
        let clock = store.clock();
        let d = Arc::new(messaging::dispatcher(
            store,
            clock,
            js,
            B::RELAY_POLL,
            self.lease,
        )?);
        let reporter = {
            let d = d.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(30));
                tick.tick().await;
                loop {
                    tick.tick().await;
                    if let Ok(s) = d.stats().await {
                        tracing::info!(figures = %stats_json(&s), "outbox");
                    }
                }
            })
        };
        messaging::relay(d, wake, shutdown).await;
        reporter.abort();
        Ok(())
    }
}
