//! `idem gc`, and the collection `idem serve` runs: expired key records,
//! inbox records and webhook receipts, and sent outbox messages past their
//! retention, deleted in bounded batches by [`idemkit::Collector`].

use std::time::Duration;

use anyhow::Context;
use idemkit::{Collector, CollectorConfig};
use tokio::sync::watch;

use super::args::DbArgs;
use crate::backend::{Backend, Job};
use crate::progress::Progress;
use crate::shutdown::stopped;

/// The collector with its default batches: 1000 rows per statement, at most
/// 100 statements per kind per run.
fn collector<B: Backend>(store: B) -> anyhow::Result<Collector<B>> {
    Collector::new(store, CollectorConfig::default()).context("invalid collector settings")
}

/// Collects every `every` in the background until `shutdown`.
pub fn spawn<B: Backend>(
    store: B,
    every: Duration,
    shutdown: &watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let collector = collector(store)?;
    let shutdown = shutdown.clone();
    tokio::spawn(async move { collector.run(every, stopped(shutdown)).await });
    Ok(())
}

struct Gc;

impl Job for Gc {
    type Output = anyhow::Result<idemkit::Collected>;
    async fn run<B: Backend>(self, store: B) -> Self::Output {
        let mut progress = Progress::stderr("gc", None);
        let collected = collector(store)?
            .collect_once_reporting(|kind, rows| progress.advance(rows, kind))
            .await;
        match &collected {
            Ok(c) => progress.finish(&format!("{} rows deleted", c.total())),
            Err(_) => progress.abandon(),
        }
        collected.context("failed to delete expired records")
    }
}

/// `idem gc`.
pub async fn run(db: DbArgs) -> anyhow::Result<()> {
    let c = db.open_existing().await?.run(Gc).await?;
    println!(
        "deleted {} expired key records, {} inbox records, {} webhook receipts, {} sent outbox messages, {} finished runs, {} send-once entries, {} finished tasks",
        c.keys, c.inbox, c.receipts, c.sent, c.runs, c.messages, c.tasks
    );
    Ok(())
}
