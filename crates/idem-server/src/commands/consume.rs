//! `idem consume`: the ledger consumer alone.

use tokio::sync::watch;

use super::args::{ConsumerArgs, DbArgs, SideArgs, StreamArgs};
use crate::backend::{Backend, DemoJob};
use crate::messaging::{self, ConsumeConfig};
use crate::probe::SideListener;
use crate::{config, shutdown};

/// `idem consume`'s flags.
#[derive(clap::Args)]
pub struct ConsumeArgs {
    #[command(flatten)]
    db: DbArgs,
    /// NATS server.
    #[arg(long, env = "IDEM_NATS_URL", help_heading = "Events")]
    nats_url: String,
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
        crate::flags::nats_url(&self.nats_url)?;
        let config = config::consume(self.consumer.ack_wait, self.consumer.max_deliver)?;
        let replicas = config::nats_replicas(self.stream.nats_replicas)?;
        let side = self.side.listener()?;
        let shutdown = shutdown::on_signal();
        let job = Consume {
            nats_url: self.nats_url,
            replicas,
            side,
            config,
            shutdown,
        };
        self.db.open_existing().await?.run_demo(job).await?
    }
}

struct Consume {
    nats_url: String,
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
            side.start(store.clone(), broker, self.shutdown.clone())
                .await?;
        }
        let Some(js) = messaging::prepare(
            &self.nats_url,
            "idem-consume",
            self.replicas,
            self.shutdown.clone(),
        )
        .await?
        else {
            return Ok(());
        };
        connected.send_replace(Some(js.clone()));
        let ledger = idem_demo::Ledger::<B>::new();
        messaging::consume(store, js, ledger, self.config, self.shutdown).await;
        Ok(())
    }
}
