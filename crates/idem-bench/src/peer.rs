//! The peer a Python team would pick: AWS Powertools idempotency with Redis
//! persistence (`@idempotent_function` over `RedisCachePersistenceLayer`)
//! around the same business insert as the library's baseline, in the same
//! PostgreSQL. The script is `crates/idem-bench/peer/powertools_peer.py`
//! (built into this binary, written to the scratch directory at run time);
//! one Python process per case, N threads with a psycopg connection each.
//!
//! It needs a Python with `aws-lambda-powertools[redis]`, `boto3` and
//! `psycopg[binary]` (`IDEM_BENCH_PEER_PYTHON`) and a Redis
//! (`IDEM_BENCH_REDIS_URL`, `redis://127.0.0.1:PORT`); `cargo xtask bench`
//! provisions both, or sets `IDEM_BENCH_PEER_SKIP` to why it could not.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use anyhow::Context;

use super::measure::{after_case, before_case};
use super::procs::{self, Spawned};
use super::report::{self, FRESH, PEER, REPLAY};

/// The script.
pub const SCRIPT: &str = include_str!("../peer/powertools_peer.py");

/// What the script prints at the end of a case.
#[derive(Debug, PartialEq)]
pub struct PeerResult {
    pub ops: u64,
    pub secs: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub cpu_us: f64,
    pub errors: u64,
    pub executed: u64,
    pub first_error: Option<String>,
}

/// Reads the script's JSON line.
pub fn parse_result(line: &str) -> anyhow::Result<PeerResult> {
    let v: serde_json::Value =
        serde_json::from_str(line.trim()).with_context(|| format!("the peer printed {line:?}"))?;
    let num = |k: &str| {
        v.get(k)
            .and_then(serde_json::Value::as_f64)
            .with_context(|| format!("no {k} in {line:?}"))
    };
    Ok(PeerResult {
        ops: num("ops")? as u64,
        secs: num("secs")?,
        p50_us: num("p50_us")?,
        p99_us: num("p99_us")?,
        cpu_us: num("cpu_us")?,
        errors: num("errors")? as u64,
        executed: num("executed")? as u64,
        first_error: v
            .get("first_error")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned),
    })
}

impl PeerResult {
    /// Whether the case measured what it claims: no error, every fresh key
    /// executed once, no replay executed.
    pub fn check(&self, mode: &str) -> anyhow::Result<()> {
        anyhow::ensure!(self.ops > 0, "the peer completed no call");
        anyhow::ensure!(
            self.errors == 0,
            "{} calls failed; the first: {}",
            self.errors,
            self.first_error.as_deref().unwrap_or("?")
        );
        match mode {
            "fresh" => anyhow::ensure!(
                self.executed == self.ops,
                "{} of {} fresh calls executed",
                self.executed,
                self.ops
            ),
            _ => anyhow::ensure!(self.executed == 0, "{} replays executed", self.executed),
        }
        Ok(())
    }
}

/// One case's Python process, ready (connected, threads waiting).
struct Peer {
    child: Spawned,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    err: PathBuf,
}

impl Peer {
    fn line(&mut self) -> anyhow::Result<String> {
        let mut line = String::new();
        let n = self.stdout.read_line(&mut line)?;
        anyhow::ensure!(n > 0, "the peer exited: {}", procs::tail(&self.err, 20));
        Ok(line)
    }
}

/// The peer's cases, or a note saying why they were skipped.
pub async fn run(postgres_url: &str, duration: Duration, run_id: u64) -> anyhow::Result<()> {
    if let Ok(reason) = std::env::var("IDEM_BENCH_PEER_SKIP") {
        report::note(format!("peer: skipped because {reason}"));
        return Ok(());
    }
    let (Some(python), Some(redis)) = (
        std::env::var_os("IDEM_BENCH_PEER_PYTHON"),
        std::env::var("IDEM_BENCH_REDIS_URL").ok(),
    ) else {
        report::note(
            "peer: skipped because IDEM_BENCH_PEER_PYTHON and IDEM_BENCH_REDIS_URL are not set \
             (`cargo xtask bench` provisions a Redis and a Python with Powertools)"
                .into(),
        );
        return Ok(());
    };
    let dir = procs::scratch()?.join("peer");
    std::fs::create_dir_all(&dir)?;
    let script = dir.join("powertools_peer.py");
    std::fs::write(&script, SCRIPT)?;
    for c in [1, 8, 32] {
        for (path, mode) in [(FRESH, "fresh"), (REPLAY, "replay")] {
            let mut cmd = Command::new(&python);
            cmd.arg(&script)
                .args(["--postgres-url", postgres_url, "--redis-url", &redis])
                .args(["--mode", mode, "--threads", &c.to_string()])
                .arg("--secs")
                .arg(duration.as_secs_f64().to_string())
                .args(["--run-id", &run_id.to_string()]);
            let err = dir.join(format!("{mode}-{c}.err"));
            let mut peer = procs::blocking(move || start(cmd, err)).await?;
            let pid = peer.child.id();
            let counter = procs::blocking(move || super::sends::Counter::attach(pid)).await?;
            before_case(c).await;
            let (result, sends) = procs::blocking(move || {
                let mut counter = counter;
                if let Some(c) = counter.as_mut() {
                    c.enable()?;
                }
                writeln!(peer.stdin, "go")?;
                peer.stdin.flush()?;
                let line = peer.line()?;
                let sends = counter.map(|c| c.finish()).transpose()?;
                writeln!(peer.stdin, "exit")?;
                peer.stdin.flush()?;
                let (status, _) = peer.child.wait_with_cpu(Duration::from_secs(30))?;
                anyhow::ensure!(
                    status.success(),
                    "the peer exited with {status}: {}",
                    procs::tail(&peer.err, 20)
                );
                Ok((parse_result(&line)?, sends))
            })
            .await
            .with_context(|| format!("peer ({mode}, {c} threads)"))?;
            result
                .check(mode)
                .with_context(|| format!("peer ({mode}, {c} threads)"))?;
            let ops = result.ops as f64;
            let per_sec = ops / result.secs.max(f64::MIN_POSITIVE);
            after_case(c, per_sec);
            report::row(report::Row {
                backend: "postgres".into(),
                via: PEER,
                path,
                concurrency: c,
                ops_per_sec: per_sec,
                p50: Duration::from_secs_f64(result.p50_us / 1e6),
                p99: Duration::from_secs_f64(result.p99_us / 1e6),
                cpu_us: Some(result.cpu_us / ops),
                sends: sends.map(|s| s.sockets() as f64 / ops),
            });
        }
    }
    Ok(())
}

/// Starts the script and waits until it is ready.
fn start(mut cmd: Command, err: PathBuf) -> anyhow::Result<Peer> {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&err)?);
    let mut child = Spawned::spawn(&mut cmd, "the Powertools peer")?;
    let stdin = child.child_mut().stdin.take().context("the peer's stdin")?;
    let stdout = BufReader::new(
        child
            .child_mut()
            .stdout
            .take()
            .context("the peer's stdout")?,
    );
    let mut peer = Peer {
        child,
        stdin,
        stdout,
        err,
    };
    let line = peer.line()?;
    let versions = line
        .trim()
        .strip_prefix("ready")
        .with_context(|| format!("the peer said {line:?}"))?;
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| report::note(format!("peer: runs on {}", versions.trim())));
    Ok(peer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_lines_parse_and_check() {
        // Captured: the script, 4 threads for 1 s, fresh keys.
        let fresh = r#"{"ops": 2537, "secs": 1.0019631959949038, "p50_us": 1455.4459994542412, "p99_us": 3281.961995526217, "cpu_us": 932101.0, "errors": 0, "executed": 2537, "first_error": null}"#;
        let r = parse_result(fresh).unwrap();
        assert_eq!(r.ops, 2537);
        assert_eq!(r.first_error, None);
        r.check("fresh").unwrap();
        assert!(r.check("replay").is_err());
        // The same, replays.
        let replay = r#"{"ops": 2424, "secs": 1.0013338400021894, "p50_us": 1510.2170000318438, "p99_us": 3732.7129975892603, "cpu_us": 1141153.0, "errors": 0, "executed": 0, "first_error": null}"#;
        parse_result(replay).unwrap().check("replay").unwrap();
        let failed = fresh
            .replace(r#""errors": 0"#, r#""errors": 2"#)
            .replace("null", r#""ConnectionError: refused""#);
        let err = parse_result(&failed).unwrap().check("fresh").unwrap_err();
        assert!(err.to_string().contains("refused"), "{err}");
        assert!(parse_result("Traceback (most recent call last):").is_err());
    }
}
