//! `idem consume`: the ledger consumer alone.

use tokio::sync::watch;

use super::{ConsumerArgs, DbArgs};
use crate::backend::{Backend, Db, DemoJob};
use crate::messaging::{self, ConsumeConfig};
use crate::{config, shutdown};

/// `idem consume`'s flags.
#[derive(clap::Args)]
pub struct ConsumeArgs {
    #[command(flatten)]
    db: DbArgs,
    /// NATS server.
    #[arg(long, env = "IDEM_NATS_URL")]
    nats_url: String,
    #[command(flatten)]
    consumer: ConsumerArgs,
}

impl ConsumeArgs {
    /// Consumes until Ctrl-C or SIGTERM.
    pub async fn run(self) -> anyhow::Result<()> {
        crate::flags::nats_url(&self.nats_url)?;
        let config = config::consume(self.consumer.ack_wait, self.consumer.max_deliver)?;
        let shutdown = shutdown::on_signal();
        let Some(js) = messaging::prepare(&self.nats_url, "idem-consume", shutdown.clone()).await
        else {
            return Ok(());
        };
        let job = Consume {
            js,
            config,
            shutdown,
        };
        Db::open_existing(&self.db.database_url)
            .await?
            .run_demo(job)
            .await
    }
}

struct Consume {
    js: idem_nats::Context,
    config: ConsumeConfig,
    shutdown: watch::Receiver<bool>,
}

impl DemoJob for Consume {
    type Output = ();
    async fn run<B: Backend + crate::demo::Store>(self, store: B) {
        let ledger = crate::demo::Ledger::<B>::new();
        messaging::consume(store, self.js, ledger, self.config, self.shutdown).await
    }
}
