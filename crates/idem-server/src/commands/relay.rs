//! `idem relay`: the outbox relay alone.

use std::time::Duration;

use tokio::sync::watch;

use super::args::{BrokerArgs, DbArgs, SideArgs, StreamArgs};
use crate::admin::outbox::RelaySlot;
use crate::backend::{Backend, Job};
use crate::messaging::{self, BrokerUrl};
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
        let Some(broker) = messaging::connect(
            &self.broker_url,
            "idem-relay",
            self.replicas,
            shutdown.clone(),
        )
        .await?
        else {
            return Ok(());
        };
        connected.send_replace(Some(broker.clone()));
        let slot = RelaySlot::default();
        messaging::relay(
            store,
            broker,
            B::RELAY_POLL,
            self.lease,
            wake,
            slot,
            true,
            shutdown,
        )
        .await
    }
}
