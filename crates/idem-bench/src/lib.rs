//! The benchmark `idem bench` runs ([`run`]): the key engine's fresh and replay paths against a baseline of
//! the same business insert without idempotency, on SQLite and PostgreSQL, at
//! concurrency 1, 8 and 32 — through the library and in-process HTTP
//! ([`keys`]), and in the same run the limits and peers from outside the
//! process: pgbench with the same statements ([`pgbench`]), the real
//! `idem serve` driven by `wrk` ([`wrk`]) and AWS Powertools with Redis
//! ([`peer`]), and the Rust peer, axum-idempotent with Redis, driven by
//! `wrk` too ([`rust_peer`]). Each row has ops/s, p50, p99, the client's CPU and sends per
//! operation ([`sends`]) and a ratio to a bare insert; then come the ratios
//! issue 24 sets targets for ([`report`]). Every case starts with a check
//! that the machine is quiet ([`quiet`]). Then the webhook, steps and
//! messaging tables. The in-process HTTP cases send with [`load`]'s bare
//! client (its module says why it is not `idem-client`).

#![allow(missing_docs)]

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

pub mod keys;
pub mod load;
pub mod measure;
pub mod messaging;
pub mod peer;
pub mod pgbench;
pub mod procs;
pub mod quiet;
pub mod report;
pub mod rust_peer;
pub mod sends;
pub mod steps;
pub mod webhooks;
pub mod wrk;

/// Seconds per case of the webhook and steps tables (at most).
const OTHER_SECS: Duration = Duration::from_secs(2);

/// Removes the scratch directory however the run ends.
struct Scratch;

impl Drop for Scratch {
    fn drop(&mut self) {
        procs::remove_scratch();
    }
}

/// The parts of the run `idem bench --only` can name, in the order they run.
pub const PARTS: &[&str] = &[
    "keys",
    "wrk",
    "pgbench",
    "peer",
    "rust-peer",
    "webhooks",
    "steps",
    "messaging",
];

/// Which parts run: all, or those `--only` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Only(Option<Vec<&'static str>>);

impl Only {
    /// Every part.
    pub fn all() -> Only {
        Only(None)
    }

    /// A comma-separated list of [`PARTS`]; an unknown or empty name is an
    /// error that lists them.
    pub fn parse(list: &str) -> anyhow::Result<Only> {
        let mut parts = Vec::new();
        for name in list.split(',').map(str::trim) {
            let part = PARTS.iter().find(|p| **p == name).with_context(|| {
                format!(
                    "--only {list:?}: {name:?} is not a part of the bench (parts: {})",
                    PARTS.join(", ")
                )
            })?;
            if !parts.contains(part) {
                parts.push(*part);
            }
        }
        Ok(Only(Some(parts)))
    }

    /// Whether `part` runs.
    pub fn has(&self, part: &str) -> bool {
        self.0.as_ref().is_none_or(|p| p.contains(&part))
    }

    /// Whether any of `parts` runs.
    fn any(&self, parts: &[&str]) -> bool {
        parts.iter().any(|p| self.has(p))
    }
}

/// What a run measures, and where.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// The SQLite file of the SQLite half (`sqlite://PATH`).
    pub sqlite_url: String,
    /// The PostgreSQL database of the PostgreSQL half; skipped without.
    pub postgres_url: Option<String>,
    /// The NATS server of the messaging table; skipped without.
    pub nats_url: Option<String>,
    /// Seconds per measured case (at least 1).
    pub secs: u64,
    /// The parts that run.
    pub only: Only,
    /// The `idem` binary the `wrk` cases start as `idem serve`.
    pub idem: PathBuf,
}

/// Runs the benchmarks `config.only` names and prints their tables on
/// stdout; `on_case` is told of each case measured (`idem bench` draws a
/// progress bar on stderr with it).
pub async fn run(config: &BenchConfig, on_case: measure::OnCase) -> anyhow::Result<()> {
    let BenchConfig {
        sqlite_url,
        postgres_url,
        nats_url,
        secs,
        only,
        idem,
    } = config;
    let (sqlite_url, postgres_url, nats_url) = (
        sqlite_url.as_str(),
        postgres_url.as_deref(),
        nats_url.as_deref(),
    );
    measure::on_case(on_case);
    let duration = Duration::from_secs((*secs).max(1));
    let run_id = idem_core::Clock::now_ms(&idem_core::SystemClock) as u64;
    procs::watch_signals();
    let _scratch = Scratch;
    if let Err(why) = sends::perf() {
        report::note(format!("sends/op: not counted because {why}"));
    }
    let key_table = only.any(&["keys", "wrk", "pgbench", "peer", "rust-peer"]);
    if key_table {
        report::header();
    }
    if only.has("keys") {
        keys::sqlite(sqlite_url, duration, run_id).await?;
    }
    if only.has("wrk") {
        let serve_db = procs::scratch()?.join("serve.db");
        wrk::run(
            "sqlite",
            idem,
            &format!("sqlite://{}", serve_db.display()),
            duration,
            run_id,
        )
        .await?;
    }
    if let Some(url) = postgres_url {
        if only.has("keys") {
            keys::postgres(url, duration, run_id).await?;
        } else if only.has("peer") || only.has("pgbench") {
            // The Powertools peer and pgbench's scripts use the key cases'
            // tables.
            keys::postgres_table(url).await?;
        }
        if only.has("pgbench") {
            pgbench::run(url, duration, run_id).await?;
        }
        if only.has("wrk") {
            wrk::run("postgres", idem, url, duration, run_id).await?;
        }
        if only.has("peer") {
            peer::run(url, duration, run_id).await?;
        }
        if only.has("rust-peer") {
            rust_peer::run(url, duration, run_id).await?;
        }
    }
    if key_table {
        report::summary();
    }
    let other = duration.min(OTHER_SECS);
    if only.has("webhooks") {
        webhooks(sqlite_url, postgres_url, other, run_id).await?;
    }
    if only.has("steps") {
        steps(sqlite_url, postgres_url, other, run_id).await?;
    }
    if let Some(url) = nats_url
        && only.has("messaging")
    {
        messaging(sqlite_url, postgres_url, url, run_id).await?;
    }
    println!();
    println!("{}", quiet::verdict());
    Ok(())
}

/// The SQLite store at `sqlite_url` and, given a URL, the PostgreSQL one
/// (40 connections), both migrated: what the webhook and step benchmarks
/// run on.
async fn stores(
    sqlite_url: &str,
    postgres_url: Option<&str>,
) -> anyhow::Result<(idem_sqlite::SqliteStore, Option<idem_postgres::PgStore>)> {
    let sqlite =
        idem_sqlite::SqliteStore::connect(sqlite_url, idem_sqlite::SqliteConfig::default()).await?;
    sqlite.migrate().await?;
    let Some(url) = postgres_url else {
        return Ok((sqlite, None));
    };
    let config = idem_postgres::PgConfig {
        max_connections: 40,
        ..Default::default()
    };
    let pg = idem_postgres::PgStore::connect(url, config).await?;
    pg.migrate().await?;
    Ok((sqlite, Some(pg)))
}

async fn webhooks(
    sqlite_url: &str,
    postgres_url: Option<&str>,
    duration: Duration,
    run_id: u64,
) -> anyhow::Result<()> {
    use self::webhooks as w;
    println!();
    w::header();
    let (sqlite, pg) = stores(sqlite_url, postgres_url).await?;
    w::run("sqlite", sqlite, duration, run_id).await?;
    if let Some(pg) = pg {
        w::run("postgres", pg, duration, run_id).await?;
    }
    Ok(())
}

async fn steps(
    sqlite_url: &str,
    postgres_url: Option<&str>,
    duration: Duration,
    run_id: u64,
) -> anyhow::Result<()> {
    use self::steps as s;
    println!();
    s::header();
    let (sqlite, pg) = stores(sqlite_url, postgres_url).await?;
    s::run("sqlite", sqlite, duration, run_id).await?;
    if let (Some(pg), Some(url)) = (pg, postgres_url) {
        s::run("postgres", pg, duration, run_id).await?;
        println!();
        s::costs(url, run_id, 200).await?;
    }
    Ok(())
}

/// Messages per messaging case.
const MESSAGES: usize = 5000;

const LEDGER: &str = "CREATE TABLE IF NOT EXISTS bench_ledger (message_id TEXT NOT NULL)";

async fn messaging(
    sqlite_url: &str,
    postgres_url: Option<&str>,
    nats_url: &str,
    run_id: u64,
) -> anyhow::Result<()> {
    use self::messaging::{self as m, LedgerHandler};
    let js = idem_nats::connect(nats_url, "idem-bench", false).await?;
    println!();
    m::header();
    let store =
        idem_sqlite::SqliteStore::connect(sqlite_url, idem_sqlite::SqliteConfig::default()).await?;
    store.migrate().await?;
    sqlx::raw_sql(LEDGER).execute(store.pool()).await?;
    m::run(
        "sqlite",
        store,
        |tx, msg, now| Box::pin(idem_sqlite::outbox::enqueue(tx, msg, now)),
        LedgerHandler::<idem_sqlite::SqliteDialect>::new(),
        &js,
        MESSAGES,
        run_id,
    )
    .await?;
    if let Some(url) = postgres_url {
        let store =
            idem_postgres::PgStore::connect(url, idem_postgres::PgConfig::default()).await?;
        store.migrate().await?;
        sqlx::raw_sql(LEDGER).execute(store.pool()).await?;
        m::run(
            "postgres",
            store,
            |tx, msg, now| Box::pin(idem_postgres::outbox::enqueue(tx, msg, now)),
            LedgerHandler::<idem_postgres::PgDialect>::new(),
            &js,
            MESSAGES,
            run_id,
        )
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_parts_and_refuses_others() {
        let all = Only::all();
        assert!(PARTS.iter().all(|p| all.has(p)));
        let some = Only::parse("keys, rust-peer,keys").unwrap();
        assert_eq!(some, Only(Some(vec!["keys", "rust-peer"])));
        assert!(some.has("keys") && some.has("rust-peer"));
        assert!(!some.has("wrk") && !some.has("peer") && !some.has("messaging"));
        assert!(some.any(&["wrk", "keys"]));
        assert!(!some.any(&["wrk", "steps"]));
        for bad in ["", "keys,", "rust_peer", "Keys", "all"] {
            let err = Only::parse(bad).unwrap_err().to_string();
            assert!(err.contains("rust-peer"), "{bad:?}: {err}");
        }
    }
}
