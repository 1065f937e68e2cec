//! `idem bench`: the benchmarks against plain baselines (`idem-bench`).

use crate::progress::Progress;

/// `idem bench`'s flags.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// SQLite file for the SQLite half.
    #[arg(long, default_value = "sqlite://idem-bench.db")]
    sqlite_url: String,
    /// PostgreSQL database for the PostgreSQL half (skipped when absent).
    #[arg(long, env = "IDEM_BENCH_POSTGRES_URL")]
    postgres_url: Option<String>,
    /// NATS server for the relay and consume benchmarks (skipped when absent).
    #[arg(long, env = "IDEM_BENCH_NATS_URL")]
    nats_url: Option<String>,
    /// Seconds per measured case.
    #[arg(long, default_value_t = 2)]
    secs: u64,
    /// Run only these parts, comma-separated: keys, wrk, pgbench, peer,
    /// rust-peer, webhooks, steps, messaging (all when absent).
    #[arg(long, value_name = "PARTS")]
    only: Option<String>,
}

impl BenchArgs {
    /// Runs every benchmark and prints the tables.
    pub async fn run(self) -> anyhow::Result<()> {
        let only = match &self.only {
            Some(list) => idem_bench::Only::parse(list)?,
            None => idem_bench::Only::all(),
        };
        let config = idem_bench::BenchConfig {
            sqlite_url: self.sqlite_url,
            postgres_url: self.postgres_url,
            nats_url: self.nats_url,
            secs: self.secs,
            only,
            // The wrk cases start this binary as `idem serve`.
            idem: std::env::current_exe()
                .map_err(|e| anyhow::anyhow!("where is the idem binary? {e}"))?,
        };
        let mut progress = Progress::stderr("bench", None);
        let on_case = Box::new(move |cases: u64, what: &str| progress.advance(cases, what));
        idem_bench::run(&config, on_case).await
    }
}
