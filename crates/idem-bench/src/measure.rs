//! Measuring one case: `concurrency` tasks running an operation for a
//! duration, and a table of cases against their baseline.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub type BoxFut = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;
pub type Op = Arc<dyn Fn(u64) -> BoxFut + Send + Sync>;

/// One measured case.
pub struct Stats {
    pub ops_per_sec: f64,
    pub p50: Duration,
    pub p99: Duration,
    /// CPU this process used per operation, in µs (all its threads).
    pub cpu_us: Option<f64>,
    /// Write-family system calls this process made per operation.
    pub sends: Option<f64>,
}

/// What every case does first, in process or not: says so on stderr and
/// checks that the machine is quiet (see [`super::quiet`]).
pub async fn before_case(concurrency: usize) {
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
}

/// What every case does last: counts it on stderr.
pub fn after_case(concurrency: usize, ops_per_sec: f64) {
    report(
        1,
        &format!("cases measured; the last at concurrency {concurrency}: {ops_per_sec:.0} ops/s"),
    );
}

/// Runs `op` from `concurrency` tasks for `duration`, with this process's
/// CPU per operation (`/proc/self/stat`).
pub async fn measure(op: Op, concurrency: usize, duration: Duration) -> anyhow::Result<Stats> {
    run(op, concurrency, duration, false).await
}

/// [`measure`], with the sends per operation too ([`super::sends`]).
pub async fn measure_counted(
    op: Op,
    concurrency: usize,
    duration: Duration,
) -> anyhow::Result<Stats> {
    run(op, concurrency, duration, true).await
}

async fn run(
    op: Op,
    concurrency: usize,
    duration: Duration,
    count_sends: bool,
) -> anyhow::Result<Stats> {
    // One sequence for the whole run, so ids never repeat across cases.
    static SEQ: AtomicU64 = AtomicU64::new(0);
    // perf starts before the quiet check, so its start is not counted as
    // other load, nor measured.
    let mut counter = match count_sends {
        true => {
            super::procs::blocking(|| super::sends::Counter::attach(std::process::id())).await?
        }
        false => None,
    };
    before_case(concurrency).await;
    if let Some(c) = counter.as_mut() {
        c.enable()?;
    }
    let cpu_before = super::procs::self_ticks();
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
    let cpu_after = super::procs::self_ticks();
    let sends = match counter {
        Some(c) => Some(super::procs::blocking(move || c.finish()).await?),
        None => None,
    };
    let ops = all.len().max(1) as f64;
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
        cpu_us: cpu_before
            .zip(cpu_after)
            .map(|(a, b)| super::procs::Cpu::micros(b.saturating_sub(a)) / ops),
        sends: sends.map(|s| s.sockets() as f64 / ops),
    };
    after_case(concurrency, stats.ops_per_sec);
    Ok(stats)
}

/// The run's progress on stderr (stdout holds the tables): one count of
/// the cases measured, over every table.
fn report(cases: u64, what: &str) {
    if let Some(progress) = PROGRESS.get()
        && let Ok(mut p) = progress.lock()
    {
        p(cases, what);
    }
}

/// What is told of each case measured: how many so far, and which.
pub type OnCase = Box<dyn FnMut(u64, &str) + Send>;

static PROGRESS: std::sync::OnceLock<std::sync::Mutex<OnCase>> = std::sync::OnceLock::new();

/// Where the run's progress goes (`idem bench`: a bar on stderr); set once
/// per process, the first call wins.
pub(crate) fn on_case(progress: OnCase) {
    let _ = PROGRESS.set(std::sync::Mutex::new(progress));
}

/// Prints one table: for each concurrency, the baseline, then each case
/// (the ratio column: each against the baseline measured just before).
pub async fn table(
    backend: &str,
    via: &'static str,
    cases: &[(&'static str, Op)],
    duration: Duration,
) -> anyhow::Result<()> {
    use super::report;
    for c in [1, 8, 32] {
        for (path, op) in cases {
            let s = measure_counted(op.clone(), c, duration).await?;
            report::row(report::Row {
                backend: backend.to_owned(),
                via,
                path,
                concurrency: c,
                ops_per_sec: s.ops_per_sec,
                p50: s.p50,
                p99: s.p99,
                cpu_us: s.cpu_us,
                sends: s.sends,
            });
        }
    }
    Ok(())
}
