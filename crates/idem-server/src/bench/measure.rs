//! Measuring one case: `concurrency` tasks running an operation for a
//! duration, and a table of cases against their baseline.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::progress::Progress;

pub type BoxFut = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;
pub type Op = Arc<dyn Fn(u64) -> BoxFut + Send + Sync>;

/// One measured case.
pub struct Stats {
    pub ops_per_sec: f64,
    pub p50: Duration,
    pub p99: Duration,
}

/// Runs `op` from `concurrency` tasks for `duration`.
pub async fn measure(op: Op, concurrency: usize, duration: Duration) -> anyhow::Result<Stats> {
    // One sequence for the whole run, so ids never repeat across cases.
    static SEQ: AtomicU64 = AtomicU64::new(0);
    report(0, &format!("measuring at concurrency {concurrency} …"));
    if let Some(busy) = super::quiet::sample().await
        && busy > super::quiet::BUSY_LIMIT
    {
        report(
            0,
            &format!("other processes use {busy:.2} cores before this case"),
        );
        tracing::warn!(busy_cores = %format_args!("{busy:.2}"), concurrency, "the machine is not quiet before this case");
    }
    let deadline = Instant::now() + duration;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                op(SEQ.fetch_add(1, Ordering::Relaxed)).await?;
                lat.push(t.elapsed());
            }
            anyhow::Ok(lat)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    let stats = Stats {
        ops_per_sec: all.len() as f64 / elapsed,
        p50: pct(0.50),
        p99: pct(0.99),
    };
    report(
        1,
        &format!(
            "cases measured; the last at concurrency {concurrency}: {:.0} ops/s",
            stats.ops_per_sec
        ),
    );
    Ok(stats)
}

/// The run's progress on stderr (stdout holds the tables): one count of
/// the cases measured, over every table.
fn report(cases: u64, what: &str) {
    static PROGRESS: std::sync::OnceLock<std::sync::Mutex<Progress>> = std::sync::OnceLock::new();
    let progress = PROGRESS.get_or_init(|| std::sync::Mutex::new(Progress::stderr("bench", None)));
    if let Ok(mut p) = progress.lock() {
        p.advance(cases, what);
    }
}

/// Prints one table: for each concurrency, the baseline, the fresh key and
/// the replayed key, with their ratio to the baseline measured just before.
pub async fn table(
    backend: &str,
    via: &str,
    (baseline, fresh, replay): (Op, Op, Op),
    duration: Duration,
) -> anyhow::Result<()> {
    for c in [1, 8, 32] {
        let base = measure(baseline.clone(), c, duration).await?;
        for (name, op) in [
            ("baseline insert", None),
            ("fresh key", Some(&fresh)),
            ("replay", Some(&replay)),
        ] {
            let s = match op {
                None => Stats {
                    ops_per_sec: base.ops_per_sec,
                    p50: base.p50,
                    p99: base.p99,
                },
                Some(op) => measure(op.clone(), c, duration).await?,
            };
            println!(
                "| {backend} | {via} | {name} | {c} | {:.0} | {:.2} ms | {:.2} ms | {:.2} |",
                s.ops_per_sec,
                s.p50.as_secs_f64() * 1e3,
                s.p99.as_secs_f64() * 1e3,
                s.ops_per_sec / base.ops_per_sec.max(f64::MIN_POSITIVE)
            );
        }
    }
    Ok(())
}
