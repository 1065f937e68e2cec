//! HTTP from outside: the real `idem serve` (the `idem` binary that runs
//! the bench, [`BenchConfig::idem`](crate::BenchConfig::idem), a child process
//! on a free loopback port, `RUST_LOG=warn`, `--bench-routes`) driven by
//! `wrk` (`-t min(C, 2) -c C -d secs`) with `POST /v1/payments`, the demo
//! route with one business insert (`INSERT_PAYMENT` of
//! `demo/sql/statements.rs`) under the idempotency layer, and `POST
//! /v1/payments-baseline`, the same handler in a plain transaction without
//! the layer: the demo's own work (HTTP, JSON, the insert) apart from
//! Idem's. A Lua script gives each request a new `Idempotency-Key` (fresh),
//! one stored key (replay) or none (baseline), and counts what came back:
//! any answer but 201, a socket error, a fresh key or a baseline request
//! replayed or a replay executed fails the case — figures of error answers
//! are worthless.
//!
//! wrk's CPU and sends are the client's; `idem serve`'s, read over the same
//! window, go to a table of their own.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::measure::{after_case, before_case};
use super::procs::{self, Spawned};
use super::report::{self, BASELINE, FRESH, FRESH_OPTIMISTIC, REPLAY, WRK};

pub(super) mod script;

use script::{BODY, LUA, parse_result};

pub(super) fn wrk_binary() -> Option<PathBuf> {
    match std::env::var_os("IDEM_BENCH_WRK") {
        Some(p) => Some(PathBuf::from(p)),
        None => procs::find_program("wrk", &[]),
    }
}

/// A running server under test (`idem serve` or a peer), killed when
/// dropped.
pub(super) struct Server {
    pub(super) child: Spawned,
    pub(super) addr: SocketAddr,
    log: PathBuf,
    name: &'static str,
}

/// A free loopback address.
pub(super) fn free_addr() -> anyhow::Result<SocketAddr> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    Ok(SocketAddr::from(([127, 0, 0, 1], port)))
}

impl Server {
    /// `idem serve` (the binary `idem`) on `database_url`.
    fn start(
        idem: &Path,
        database_url: &str,
        claim_mode: &str,
        log: PathBuf,
    ) -> anyhow::Result<Server> {
        let addr = free_addr()?;
        let mut cmd = Command::new(idem);
        cmd.args([
            "serve",
            "--listen",
            &addr.to_string(),
            "--claim-mode",
            claim_mode,
            "--bench-routes",
        ])
        .arg("--database-url")
        .arg(database_url)
        .env("RUST_LOG", "warn")
        .env_remove("IDEM_CONFIG")
        .env_remove("IDEM_NATS_URL")
        .env_remove("IDEM_UPSTREAM")
        .env_remove("IDEM_PROVIDER_URL")
        .env_remove("IDEM_EVENTS")
        .env_remove("IDEM_CONSUME");
        Server::launch(cmd, "idem serve", addr, log)
    }

    /// Starts `cmd` (stdout to `log`, stderr beside it) and waits until
    /// it listens on `addr`.
    pub(super) fn launch(
        mut cmd: Command,
        name: &'static str,
        addr: SocketAddr,
        log: PathBuf,
    ) -> anyhow::Result<Server> {
        cmd.stdin(Stdio::null())
            .stdout(std::fs::File::create(&log)?)
            .stderr(std::fs::File::create(log.with_extension("err"))?);
        let mut server = Server {
            child: Spawned::spawn(&mut cmd, name)?,
            addr,
            log,
            name,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Some(status) = server.child.exited() {
                anyhow::bail!("{name} exited with {status}: {}", server.log_tail());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{name} did not listen on {addr} within 60 s: {}",
                server.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(server)
    }

    pub(super) fn log_tail(&self) -> String {
        procs::tail(&self.log.with_extension("err"), 20)
    }
}

/// The path a case's mode posts to.
fn path_of(mode: &str) -> &'static str {
    match mode {
        "baseline" => idem_demo::BASELINE_PATH,
        _ => "/v1/payments",
    }
}

/// One POST to the path of `mode`, with `key` if any: the status and
/// whether it was a replay.
async fn post(addr: SocketAddr, mode: &str, key: Option<&str>) -> anyhow::Result<(u16, bool)> {
    let mut req = axum::http::Request::post(format!("http://{addr}{}", path_of(mode)))
        .header("content-type", "application/json");
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    let req = req.body(http_body_util::Full::new(bytes::Bytes::from_static(
        BODY.as_bytes(),
    )))?;
    super::load::status_and_replay(req).await
}

/// The `wrk` cases against `idem serve` on `database_url`: fresh keys,
/// replays and the baseline route with pessimistic claims, then fresh keys
/// with `--claim-mode optimistic` (a replay reads the same way in both
/// modes; the baseline claims nothing).
pub async fn run(
    backend: &str,
    idem: &Path,
    database_url: &str,
    duration: Duration,
    run_id: u64,
) -> anyhow::Result<()> {
    let pessimistic: &[(&'static str, &'static str)] =
        &[(FRESH, "fresh"), (REPLAY, "replay"), (BASELINE, "baseline")];
    let optimistic: &[(&'static str, &'static str)] = &[(FRESH_OPTIMISTIC, "fresh")];
    for (claim_mode, cases) in [("pessimistic", pessimistic), ("optimistic", optimistic)] {
        run_mode(
            backend,
            idem,
            database_url,
            duration,
            run_id,
            claim_mode,
            cases,
        )
        .await?;
    }
    Ok(())
}

async fn run_mode(
    backend: &str,
    idem: &Path,
    database_url: &str,
    duration: Duration,
    run_id: u64,
    claim_mode: &'static str,
    cases: &[(&'static str, &'static str)],
) -> anyhow::Result<()> {
    let Some(wrk) = wrk_binary() else {
        report::note(format!(
            "wrk ({backend}): skipped because no wrk was found (Debian: wrk; or set IDEM_BENCH_WRK)"
        ));
        return Ok(());
    };
    let dir = procs::scratch()?.join(format!("wrk-{backend}-{claim_mode}"));
    std::fs::create_dir_all(&dir)?;
    let script = dir.join("post.lua");
    std::fs::write(&script, LUA)?;
    let (url, log) = (database_url.to_owned(), dir.join("serve.log"));
    let idem = idem.to_owned();
    let server = procs::blocking(move || Server::start(&idem, &url, claim_mode, log)).await?;
    // The contract first: a new key executes, the same key replays.
    let replay_key = format!("w{run_id}-{backend}-{claim_mode}-replay");
    let first = post(server.addr, "fresh", Some(&replay_key)).await?;
    let again = post(server.addr, "replay", Some(&replay_key)).await?;
    let bare = post(server.addr, "baseline", None).await?;
    anyhow::ensure!(
        first == (201, false) && again == (201, true) && bare == (201, false),
        "idem serve ({backend}) does not answer as the bench expects: a new key gave {first:?}, \
         the same key again {again:?}, the baseline route {bare:?} (want 201 executed, 201 \
         replayed, 201 executed); {}",
        server.log_tail()
    );
    let mut server = Some(server);
    for c in [1, 8, 32] {
        for &(path, mode) in cases {
            let prefix = match mode {
                "fresh" => format!("w{run_id}-{backend}-{claim_mode}-c{c}"),
                _ => replay_key.clone(),
            };
            let s = server.take().context("the server")?;
            let pid = s.child.id();
            let counter = procs::blocking(move || super::sends::Counter::attach(pid)).await?;
            before_case(c).await;
            let (wrk, script, dir) = (wrk.clone(), script.clone(), dir.clone());
            let (s, out) = procs::blocking(move || {
                let case = (path_of(mode), mode, prefix.as_str(), None);
                let out = one(&wrk, &script, &dir, &s, counter, c, case, duration);
                Ok((s, out))
            })
            .await?;
            let out =
                out.with_context(|| format!("wrk against idem serve ({backend}, {mode}, c={c})"))?;
            server = Some(s);
            after_case(c, out.requests_per_sec);
            report::row(report::Row {
                backend: backend.to_owned(),
                via: WRK,
                path,
                concurrency: c,
                ops_per_sec: out.requests_per_sec,
                p50: out.p50,
                p99: out.p99,
                cpu_us: out.client_cpu_us,
                sends: out.client_sends,
            });
            report::server(report::ServerRow {
                backend: backend.to_owned(),
                path,
                concurrency: c,
                requests_per_sec: out.requests_per_sec,
                cpu_us: out.server_cpu_us,
                sends: out.server_sends,
            });
        }
    }
    Ok(())
}

/// What one `wrk` case measured.
pub(super) struct Outcome {
    pub(super) requests: u64,
    pub(super) requests_per_sec: f64,
    pub(super) p50: Duration,
    pub(super) p99: Duration,
    pub(super) client_cpu_us: Option<f64>,
    pub(super) client_sends: Option<f64>,
    pub(super) server_cpu_us: Option<f64>,
    pub(super) server_sends: Option<f64>,
}

/// One `wrk` case against `server` at `path`: `mode` and `prefix` as the
/// script takes them, and `cookie`, if any, sent with every request.
#[allow(clippy::too_many_arguments)]
pub(super) fn one(
    wrk: &Path,
    script: &Path,
    dir: &Path,
    server: &Server,
    counter: Option<super::sends::Counter>,
    c: usize,
    (path, mode, prefix, cookie): (&str, &str, &str, Option<&str>),
    duration: Duration,
) -> anyhow::Result<Outcome> {
    let stdout = dir.join(format!("{mode}-{c}.out"));
    let (mut cmd, counted) = match super::sends::wrap(wrk)? {
        Some((cmd, out)) => (cmd, Some(out)),
        None => (Command::new(wrk), None),
    };
    cmd.args(["-t", &c.min(2).to_string(), "-c", &c.to_string()])
        .arg("-d")
        .arg(format!("{}s", duration.as_secs().max(1)))
        .args(["--timeout", "10s", "-s"])
        .arg(script)
        .arg(format!("http://{}{path}", server.addr))
        .args(["--", mode, prefix])
        .args(cookie)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout)?)
        .stderr(Stdio::null());
    let mut counter = counter;
    if let Some(c) = counter.as_mut() {
        c.enable()?;
    }
    let server_before = procs::read_stat(server.child.id()).map(|s| s.cpu.own);
    let child = Spawned::spawn(&mut cmd, "wrk")?;
    let (status, cpu) = child.wait_with_cpu(duration + Duration::from_secs(60))?;
    let server_after = procs::read_stat(server.child.id()).map(|s| s.cpu.own);
    let server_sends = counter.map(|c| c.finish()).transpose()?;
    let text = std::fs::read_to_string(&stdout).unwrap_or_default();
    anyhow::ensure!(status.success(), "wrk exited with {status}: {text}");
    let r = parse_result(&text)?;
    r.check(mode)
        .with_context(|| format!("{}\n{}: {}", text.trim(), server.name, server.log_tail()))?;
    let n = r.requests as f64;
    let client_cpu_us = cpu.map(|cpu| {
        let ticks = match counted {
            Some(_) => cpu.children,
            None => cpu.own + cpu.children,
        };
        procs::Cpu::micros(ticks) / n
    });
    let client_sends = match &counted {
        // wrk writes its sockets with write(2).
        Some(out) => Some(super::sends::wrapped_count(out)?.write as f64 / n),
        None => None,
    };
    Ok(Outcome {
        requests: r.requests,
        requests_per_sec: n / (r.duration_us.max(1) as f64 / 1e6),
        p50: Duration::from_micros(r.p50_us),
        p99: Duration::from_micros(r.p99_us),
        client_cpu_us,
        client_sends,
        server_cpu_us: server_before
            .zip(server_after)
            .map(|(a, b)| procs::Cpu::micros(b.saturating_sub(a)) / n),
        server_sends: server_sends.map(|s| s.sockets() as f64 / n),
    })
}
