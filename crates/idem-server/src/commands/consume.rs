//! `idem consume`: the ledger consumer alone.

use tokio::sync::watch;

use super::args::{BrokerArgs, ConsumerArgs, DbArgs, SideArgs, StreamArgs};
use crate::backend::{Backend, DemoJob};
use crate::messaging::{self, Broker, BrokerUrl, ConsumeConfig};
use crate::probe::SideListener;
use crate::{config, shutdown};

/// `idem consume`'s flags.
#[derive(clap::Args)]
pub struct ConsumeArgs {
    #[command(flatten)]
    db: DbArgs,
    #[command(flatten)]
    broker: BrokerArgs,
    #[command(flatten)]
    consumer: ConsumerArgs,
    #[command(flatten)]
    stream: StreamArgs,
    #[command(flatten)]
    side: SideArgs,
}

impl ConsumeArgs {
    /// Consumes until Ctrl-C or SIGTERM.
    pub async fn run(self) -> anyhow::Result<()> {
        let broker_url = self.broker.required()?;
        let config = config::consume(self.consumer.ack_wait, self.consumer.max_deliver)?;
        let replicas = config::nats_replicas(self.stream.nats_replicas)?;
        let side = self.side.listener()?;
        let shutdown = shutdown::on_signal();
        let job = Consume {
            broker_url,
            replicas,
            side,
            config,
            shutdown,
        };
        self.db.open_existing().await?.run_demo(job).await?
    }
}

struct Consume {
    broker_url: BrokerUrl,
    replicas: usize,
    side: Option<SideListener>,
    config: ConsumeConfig,
    shutdown: watch::Receiver<bool>,
}

impl DemoJob for Consume {
    type Output = anyhow::Result<()>;
    async fn run<B: Backend + idem_demo::Store>(self, store: B) -> anyhow::Result<()> {
        let (connected, broker) = watch::channel(None);
        if let Some(side) = self.side {
            side.start(
                store.clone(),
                (broker, self.broker_url.name()),
                self.shutdown.clone(),
            )
            .await?;
        }
        let routes = messaging::routes(self.replicas);
        let (url, shutdown) = (&self.broker_url, self.shutdown);
        let connect = Broker::connect(
            url,
            "idem-consume",
            &routes,
            Some(&self.config),
            shutdown.clone(),
        );
        let Some(broker) = connect.await? else {
            return Ok(());
        };
        connected.send_replace(Some(broker.clone()));
        let ledger = idem_demo::Ledger::<B>::new();
        broker
            .consume(store, &routes, ledger, &self.config, shutdown)
            .await
    }
}
