//! `idem webhooks list|show|replay`: stored deliveries, as the admin routes
//! show them.

use anyhow::{Context, bail};
use clap::Subcommand;
use idem_core::webhooks::{ReceiptState, Requeue};
use idem_webhooks::{find_receipt, replay_receipt};

use super::DbArgs;
use crate::admin::webhooks::{receipt_json, replay_json};
use crate::backend::{Backend, Db, Job};

/// `idem webhooks`'s subcommands.
#[derive(Subcommand)]
pub enum WebhookAction {
    /// List deliveries, newest first, as JSON lines.
    List {
        #[command(flatten)]
        db: DbArgs,
        /// Only this endpoint.
        #[arg(long)]
        endpoint: Option<String>,
        /// Only this state: received, processed, failed, dead or stale.
        #[arg(long)]
        state: Option<String>,
        /// At most this many (1 to 1000).
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Show one delivery with its headers and body.
    Show {
        #[command(flatten)]
        db: DbArgs,
        endpoint: String,
        delivery_id: String,
    },
    /// Run a failed or dead delivery again (a processed one is left alone).
    Replay {
        #[command(flatten)]
        db: DbArgs,
        endpoint: String,
        delivery_id: String,
    },
}

impl WebhookAction {
    /// Runs the subcommand.
    pub async fn run(self) -> anyhow::Result<()> {
        let (WebhookAction::List { db, .. }
        | WebhookAction::Show { db, .. }
        | WebhookAction::Replay { db, .. }) = &self;
        Db::open_existing(&db.database_url).await?.run(self).await
    }
}

impl Job for WebhookAction {
    type Output = anyhow::Result<()>;
    async fn run<B: Backend>(self, store: B) -> anyhow::Result<()> {
        match self {
            WebhookAction::List {
                endpoint,
                state,
                limit,
                ..
            } => {
                let state = match state.as_deref() {
                    None => None,
                    Some(s) => Some(ReceiptState::parse(s).with_context(|| {
                        format!("--state {s}: expected received, processed, failed, dead or stale")
                    })?),
                };
                if !(1..=1000).contains(&limit) {
                    bail!("--limit must be between 1 and 1000");
                }
                for r in store
                    .list_receipts(endpoint.as_deref(), state, limit)
                    .await?
                {
                    println!("{}", receipt_json(&r, false));
                }
            }
            WebhookAction::Show {
                endpoint,
                delivery_id,
                ..
            } => match find_receipt(&store, &endpoint, &delivery_id).await? {
                Some(r) => println!("{}", receipt_json(&r, true)),
                None => bail!("no delivery {delivery_id} on endpoint {endpoint}"),
            },
            WebhookAction::Replay {
                endpoint,
                delivery_id,
                ..
            } => {
                let now = idem_core::Clock::now_ms(&idem_core::SystemClock);
                let (delivery_id, outcome) =
                    replay_receipt(&store, &endpoint, &delivery_id, now).await?;
                let (_, v) = replay_json(&endpoint, &delivery_id, outcome);
                println!("{v}");
                if outcome == Requeue::NotFound {
                    bail!("no delivery {delivery_id} on endpoint {endpoint}");
                }
            }
        }
        Ok(())
    }
}
