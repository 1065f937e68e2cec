//! Recorded steps against the same work unrecorded: a three-step run — a
//! local phase, a call to a provider, a send through a relay (both fakes on
//! loopback answering at once) — through `idem-steps`, against the same
//! insert, the same two HTTP calls and nothing recorded; and, on
//! PostgreSQL, the commits (transaction ids consumed) and round trips
//! (counted on the wire by a proxy) each costs.

use std::time::Duration;

use idem_core::steps::RunStore;
use idem_sql::patterns::PatternExec;

use crate::measure::measure;

mod calls;
mod costs;
mod workload;

pub use costs::costs;

/// Prints the header of the step table.
pub fn header() {
    println!("| backend | path | concurrency | runs/s | p50 | p99 | ratio to unrecorded |");
    println!("|---|---|---:|---:|---:|---:|---:|");
}

/// One backend's rows at concurrency 1, 8 and 32.
pub async fn run<S: RunStore<Tx: PatternExec>>(
    backend: &str,
    store: S,
    duration: Duration,
    run_id: u64,
) -> anyhow::Result<()> {
    workload::sqlx_table(&store).await?;
    let (p, r) = workload::fakes().await?;
    let (provider, mail) = workload::clients(p, r)?;
    let base = workload::baseline(store.clone(), provider.clone(), mail.clone(), run_id);
    let rec = workload::recorded(workload::runs(store, provider, mail)?, run_id);
    for c in [1, 8, 32] {
        let b = measure(base.clone(), c, duration).await?;
        let s = measure(rec.clone(), c, duration).await?;
        for (name, st) in [
            ("unrecorded: insert + 2 calls", &b),
            ("recorded run: 3 steps", &s),
        ] {
            println!(
                "| {backend} | {name} | {c} | {:.0} | {:.2} ms | {:.2} ms | {:.2} |",
                st.ops_per_sec,
                st.p50.as_secs_f64() * 1e3,
                st.p99.as_secs_f64() * 1e3,
                st.ops_per_sec / b.ops_per_sec.max(f64::MIN_POSITIVE)
            );
        }
    }
    Ok(())
}
