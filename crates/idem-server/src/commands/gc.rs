//! `idem gc`, and the periodic GC `idem serve` runs: expired key records
//! deleted in bounded batches.

use std::time::Duration;

use anyhow::Context;
use idem_core::{Engine, KeyStore};

use super::DbArgs;
use crate::backend::{Backend, Db, Job};

/// Records deleted per batch, and the most batches per run: bounded work per
/// tick.
const BATCH: u32 = 1000;
const MAX_BATCHES: u32 = 100;

async fn once<S: KeyStore>(store: &S) -> anyhow::Result<u64> {
    Engine::new(store.clone())
        .purge_expired(BATCH, MAX_BATCHES)
        .await
        .context("failed to delete expired key records")
}

/// Deletes expired records every `every`, in the background.
pub fn spawn<S: KeyStore>(store: S, every: Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every.max(Duration::from_secs(1)));
        loop {
            tick.tick().await;
            match once(&store).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(deleted = n, "expired key records deleted"),
                Err(e) => tracing::warn!(error = %format!("{e:#}"), "gc failed; will retry"),
            }
        }
    });
}

struct Gc;

impl Job for Gc {
    type Output = anyhow::Result<u64>;
    async fn run<B: Backend>(self, store: B) -> anyhow::Result<u64> {
        once(&store).await
    }
}

/// `idem gc`.
pub async fn run(db: DbArgs) -> anyhow::Result<()> {
    let n = Db::open_existing(&db.database_url).await?.run(Gc).await?;
    println!("deleted {n} expired key records");
    Ok(())
}
