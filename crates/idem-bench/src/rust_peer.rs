//! The peer a Rust team would pick: `axum-idempotent` (direct-key mode on
//! `Idempotency-Key`) over `ruts` sessions in Redis, around the demo's
//! payment insert in PostgreSQL — the standalone server
//! `bench/rust-peer/` (not a workspace member), driven by `wrk` with the
//! same script, body and concurrencies as the cases against `idem serve`.
//!
//! `axum-idempotent` caches an answer in the caller's session only, so the
//! bench opens one session (`POST /v1/session`) and sends its cookie with
//! every request: one client, as `wrk`'s connections are against `idem
//! serve`. Before the cases, two checks whose figures go to the notes: the
//! contract (a new key executes, the same key replays) and the
//! in-progress case (8 concurrent requests with one new key: how many
//! inserts ran). After each replay case, the rows the peer inserted during
//! it are counted (want 0).
//!
//! It needs the peer's binary (`IDEM_BENCH_RUST_PEER_BIN`) and a Redis 7.4
//! or newer (`IDEM_BENCH_RUST_PEER_REDIS_URL`: ruts' `RedisStore` uses
//! `HEXPIRE`); `cargo xtask bench` builds and provisions both or sets
//! `IDEM_BENCH_RUST_PEER_SKIP` to why it could not. A failure of the peer
//! stops its cases with a note; it does not fail the run.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::Context;

use super::measure::{after_case, before_case};
use super::procs;
use super::report::{self, FRESH, REPLAY, RUST_PEER};
use super::wrk::script::{BODY, LUA};
use super::wrk::{Server, free_addr, one, wrk_binary};
use idem_demo::sql::DemoSql;

/// The tenant of the peer's rows (`bench/rust-peer/src/main.rs`).
const TENANT: &str = "rust-peer";

/// Requests of the in-progress check.
const RACERS: usize = 8;

/// The peer's cases, or a note saying why they were skipped or stopped.
pub async fn run(postgres_url: &str, duration: Duration, run_id: u64) -> anyhow::Result<()> {
    if let Ok(reason) = std::env::var("IDEM_BENCH_RUST_PEER_SKIP") {
        report::note(format!("rust peer: skipped because {reason}"));
        return Ok(());
    }
    let (Some(bin), Some(redis)) = (
        std::env::var_os("IDEM_BENCH_RUST_PEER_BIN"),
        std::env::var("IDEM_BENCH_RUST_PEER_REDIS_URL").ok(),
    ) else {
        report::note(
            "rust peer: skipped because IDEM_BENCH_RUST_PEER_BIN and \
             IDEM_BENCH_RUST_PEER_REDIS_URL are not set (`cargo xtask bench` builds \
             bench/rust-peer and provisions a Redis 7.4 or newer)"
                .into(),
        );
        return Ok(());
    };
    let Some(wrk) = wrk_binary() else {
        report::note("rust peer: skipped because no wrk was found".into());
        return Ok(());
    };
    if let Err(e) = cases(postgres_url, duration, run_id, bin.into(), &redis, wrk).await {
        report::note(format!("rust peer: stopped because {e:#}"));
    }
    Ok(())
}

async fn cases(
    postgres_url: &str,
    duration: Duration,
    run_id: u64,
    bin: PathBuf,
    redis: &str,
    wrk: PathBuf,
) -> anyhow::Result<()> {
    // The demo's table, as `idem serve` migrates it.
    let store =
        idem_postgres::PgStore::connect(postgres_url, idem_postgres::PgConfig::default()).await?;
    store.migrate().await?;
    store
        .migrate_demo()
        .await
        .context("migrating the demo's tables")?;
    let pool = store.pool().clone();
    let rows = move || {
        let pool = pool.clone();
        async move {
            let n: i64 =
                sqlx::query_scalar("SELECT count(*) FROM demo_payments WHERE tenant_id = $1")
                    .bind(TENANT)
                    .fetch_one(&pool)
                    .await?;
            anyhow::Ok(n)
        }
    };
    let dir = procs::scratch()?.join("rust-peer");
    std::fs::create_dir_all(&dir)?;
    let script = dir.join("post.lua");
    std::fs::write(&script, LUA)?;
    let addr = free_addr()?;
    let mut cmd = Command::new(&bin);
    cmd.arg("--listen")
        .arg(addr.to_string())
        .arg("--database-url")
        .arg(postgres_url)
        .arg("--redis-url")
        .arg(redis);
    let log = dir.join("peer.log");
    let server = procs::blocking(move || Server::launch(cmd, "the Rust peer", addr, log)).await?;
    let cookie = open_session(addr).await?;
    let versions = std::fs::read_to_string(dir.join("peer.log")).unwrap_or_default();
    report::note(format!("rust peer: {}", versions.trim()));
    // The contract first: a new key executes, the same key replays.
    let replay_key = format!("r{run_id}-replay");
    let first = post(addr, &replay_key, &cookie).await?;
    let again = post(addr, &replay_key, &cookie).await?;
    anyhow::ensure!(
        first == (201, false) && again == (201, true),
        "the peer does not answer as the bench expects: a new key gave {first:?}, the same key \
         again {again:?} (want 201 executed, 201 replayed); {}",
        server.log_tail()
    );
    // No in-progress lock: concurrent requests with one new key.
    let before = rows().await?;
    let race_key = format!("r{run_id}-race");
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(RACERS));
    let racers: Vec<_> = (0..RACERS)
        .map(|_| {
            let (key, cookie, start) = (race_key.clone(), cookie.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                post(addr, &key, &cookie).await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for r in racers {
        answers.push(r.await??);
    }
    let ran = rows().await? - before;
    let replayed = answers.iter().filter(|a| a.1).count();
    report::note(format!(
        "rust peer: {RACERS} concurrent requests with one new key (one session) ran the insert \
         {ran} times; {replayed} were answered from the cache (statuses {:?})",
        answers.iter().map(|a| a.0).collect::<Vec<_>>()
    ));
    let mut server = Some(server);
    for c in [1, 8, 32] {
        for (path, mode) in [(FRESH, "fresh"), (REPLAY, "replay")] {
            let prefix = match mode {
                "fresh" => format!("r{run_id}-c{c}"),
                _ => replay_key.clone(),
            };
            let s = server.take().context("the peer")?;
            let pid = s.child.id();
            let counter = procs::blocking(move || super::sends::Counter::attach(pid)).await?;
            let rows_before = rows().await?;
            before_case(c).await;
            let (wrk, script, dir, cookie) =
                (wrk.clone(), script.clone(), dir.clone(), cookie.clone());
            let (s, out) = procs::blocking(move || {
                let case = ("/v1/payments", mode, prefix.as_str(), Some(cookie.as_str()));
                let out = one(&wrk, &script, &dir, &s, counter, c, case, duration);
                Ok((s, out))
            })
            .await?;
            let out = out.with_context(|| format!("wrk against the Rust peer ({mode}, c={c})"))?;
            server = Some(s);
            after_case(c, out.requests_per_sec);
            report::row(report::Row {
                backend: "postgres".into(),
                via: RUST_PEER,
                path,
                concurrency: c,
                ops_per_sec: out.requests_per_sec,
                p50: out.p50,
                p99: out.p99,
                cpu_us: out.client_cpu_us,
                sends: out.client_sends,
            });
            let inserted = rows().await? - rows_before;
            let check = match mode {
                "replay" if inserted == 0 => "every replay was answered from the cache".to_owned(),
                "replay" => format!("{inserted} replays ran the insert again"),
                _ => format!("{inserted} payments inserted (requests in flight at the end too)"),
            };
            report::note(format!(
                "rust peer ({mode}, c={c}): {} requests, {check}; peer CPU {} µs/request",
                out.requests,
                out.server_cpu_us
                    .map_or_else(|| "—".to_owned(), |v| format!("{v:.0}"))
            ));
        }
    }
    Ok(())
}

/// `POST /v1/session`: the session cookie (`name=value`).
async fn open_session(addr: SocketAddr) -> anyhow::Result<String> {
    use http_body_util::BodyExt;
    let req = axum::http::Request::post(format!("http://{addr}/v1/session"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))?;
    let res = super::load::client().request(req).await?;
    let status = res.status();
    let cookie = res
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(str::to_owned);
    res.into_body().collect().await?;
    anyhow::ensure!(status == 201, "POST /v1/session answered {status}");
    cookie.context("POST /v1/session set no cookie")
}

/// One payment with `key` in the session of `cookie`: the status and
/// whether it was a replay.
async fn post(addr: SocketAddr, key: &str, cookie: &str) -> anyhow::Result<(u16, bool)> {
    let req = axum::http::Request::post(format!("http://{addr}/v1/payments"))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .header("cookie", cookie)
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            BODY.as_bytes(),
        )))?;
    super::load::status_and_replay(req).await
}
