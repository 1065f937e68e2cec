//! `idem webhooks list|show|replay`: stored deliveries, as the admin routes
//! show them.

use anyhow::{Context, bail};
use clap::Subcommand;
use idem_core::webhooks::{ReceiptState, Requeue, WebhookStore};
use idem_webhooks::{find_receipt, replay_receipt};

use super::args::DbArgs;
use crate::admin::webhooks::{receipt_json, replay_json};
use crate::backend::{Backend, Job};
use crate::progress::Progress;

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
    /// Run a failed or dead delivery again (a processed one is left alone);
    /// with --all, every dead delivery (of ENDPOINT when given), showing
    /// progress on stderr and printing one JSON line per delivery.
    Replay {
        #[command(flatten)]
        db: DbArgs,
        /// The endpoint (with --all: only its deliveries; every endpoint's
        /// when omitted).
        #[arg(required_unless_present = "all")]
        endpoint: Option<String>,
        /// The delivery (not with --all).
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        delivery_id: Option<String>,
        /// Replay every delivery in --state (dead by default).
        #[arg(long)]
        all: bool,
        /// With --all: the state replayed, dead or failed.
        #[arg(long, requires = "all", default_value = "dead")]
        state: String,
    },
}

impl WebhookAction {
    /// Runs the subcommand.
    pub async fn run(self) -> anyhow::Result<()> {
        let (WebhookAction::List { db, .. }
        | WebhookAction::Show { db, .. }
        | WebhookAction::Replay { db, .. }) = &self;
        db.open_existing().await?.run(self).await
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
                all: true,
                state,
                ..
            } => replay_all(&store, endpoint.as_deref(), &state).await?,
            WebhookAction::Replay {
                endpoint: Some(endpoint),
                delivery_id: Some(delivery_id),
                ..
            } => {
                // Requeued by the clock the workers' claims are judged by.
                let now = idem_core::Clock::now_ms(&store.clock());
                let (delivery_id, outcome) =
                    replay_receipt(&store, &endpoint, &delivery_id, now).await?;
                let (_, v) = replay_json(&endpoint, &delivery_id, outcome);
                println!("{v}");
                if outcome == Requeue::NotFound {
                    bail!("no delivery {delivery_id} on endpoint {endpoint}");
                }
            }
            // Not reached: clap requires both without --all.
            WebhookAction::Replay { .. } => bail!("give ENDPOINT and DELIVERY_ID, or --all"),
        }
        Ok(())
    }
}

/// Deliveries read per page by `replay --all`.
const REPLAY_PAGE: u32 = 500;

/// `idem webhooks replay --all`: requeues every delivery in `state` (of
/// `endpoint`), a page at a time. A requeued delivery leaves the state, so
/// each page is read afresh; a page that requeues nothing ends the run (a
/// worker may be failing deliveries as fast as they are replayed: the run
/// never chases them for ever).
async fn replay_all<S: WebhookStore + idem_core::KeyStore>(
    store: &S,
    endpoint: Option<&str>,
    state: &str,
) -> anyhow::Result<()> {
    let state = match ReceiptState::parse(state) {
        Some(s @ (ReceiptState::Dead | ReceiptState::Failed)) => s,
        _ => bail!("--state {state}: expected dead or failed"),
    };
    let mut progress: Option<Progress> = None;
    let mut requeued = 0u64;
    let mut seen = std::collections::HashSet::new();
    loop {
        let page = store
            .list_receipts(endpoint, Some(state), REPLAY_PAGE)
            .await?;
        let progress = progress.get_or_insert_with(|| {
            // The first page is the whole set when it is short.
            let total = (page.len() < REPLAY_PAGE as usize).then_some(page.len() as u64);
            Progress::stderr("replay", total)
        });
        let mut moved = 0;
        for r in &page {
            let (e, d) = (&r.receipt.endpoint, &r.receipt.delivery_id);
            if !seen.insert((e.clone(), d.clone())) {
                continue;
            }
            let now = idem_core::Clock::now_ms(&store.clock());
            let outcome = store.replay_receipt(e, d, now).await?;
            if outcome == Requeue::Requeued {
                moved += 1;
                requeued += 1;
            }
            let (_, v) = replay_json(e, d, outcome);
            println!("{v}");
            progress.advance(1, e);
        }
        if moved == 0 {
            progress.finish(&format!(
                "{requeued} {} deliveries requeued",
                state.as_str()
            ));
            return Ok(());
        }
    }
}
