//! `idem stats`: the outbox lag figures as JSON.

use super::args::DbArgs;
use crate::admin::outbox::store_stats_json;
use crate::backend::{Backend, Job};

struct Stats;

impl Job for Stats {
    type Output = anyhow::Result<serde_json::Value>;
    async fn run<B: Backend>(self, store: B) -> Self::Output {
        store_stats_json(&store).await
    }
}

/// `idem stats`.
pub async fn run(db: DbArgs) -> anyhow::Result<()> {
    let v = db.open_existing().await?.run(Stats).await?;
    println!("{v}");
    Ok(())
}
