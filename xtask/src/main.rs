//! Developer commands: `cargo xtask test` provisions a throwaway PostgreSQL 15
//! and a NATS server with JetStream on loopback (installing the Debian packages
//! `postgresql-15`, `nats-server`, `chromium` and `libfaketime` when root
//! and they are missing, and the browser tests' npm packages with `npm ci`),
//! runs the whole test suite against them, stops them, and runs each fuzz
//! target briefly. `cargo xtask fuzz [TARGET] [--secs N]` runs the fuzz targets of
//! `fuzz/` for longer.

mod dups;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  test [nextest args]      provision PostgreSQL 15, NATS, chromium, libfaketime and the npm packages
                           of the browser tests, run the whole suite (tests, browser tests,
                           doc tests, 20 s per fuzz target), stop them; with nextest args (a filter),
                           only those tests
  bench [idem bench args]  the same servers, pgbench, wrk, perf, a Redis and a Python venv for
                           the Powertools peer, then `idem bench` in release mode (5 s a case)
  fuzz [TARGET] [--secs N] run the fuzz targets of fuzz/ (every target, 180 s each, by default)
  help                     this text";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("test") => test(&args[1..]),
        Some("bench") => bench(&args[1..]),
        Some("fuzz") => fuzz(&args[1..]),
        Some("backend-dups") => dups::run(&args[1..], &workspace_root()),
        Some("help" | "--help" | "-h") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some(other) => Err(format!("unknown command {other:?}\n\n{USAGE}")),
        None => Err(USAGE.into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

type Result<T> = std::result::Result<T, String>;

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Set by Ctrl-C or SIGTERM: the command running is asked to stop, and the
/// servers are stopped on the way out.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Catches Ctrl-C and SIGTERM so the throwaway servers are stopped (the
/// `Drop`s run) instead of outliving xtask. The terminal's Ctrl-C reaches the
/// child commands too; a SIGTERM to xtask alone is passed on to them.
fn catch_interrupts() {
    if let Err(e) = ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst)) {
        eprintln!("xtask: cannot catch Ctrl-C ({e}); an interrupted run may leave its servers");
    }
}

fn run(cmd: &mut Command) -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        return Err("interrupted".into());
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("failed to start {cmd:?}: {e}"))?;
    let mut forwarded = false;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if INTERRUPTED.load(Ordering::SeqCst) && !forwarded {
            forwarded = true;
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if INTERRUPTED.load(Ordering::SeqCst) {
        Err("interrupted; servers stopped".into())
    } else if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} exited with {status}"))
    }
}

/// Removes what runs killed without a chance to clean up left in `root`: a
/// `pg-<pid>`, `nats-<pid>` or `redis-<pid>` directory whose xtask is gone,
/// stopping its server first.
fn sweep(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("pg-")
            .or_else(|| name.strip_prefix("nats-"))
            .or_else(|| name.strip_prefix("redis-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let dir = entry.path();
        if name.starts_with("pg-") && dir.join("data/postmaster.pid").exists() {
            eprintln!("xtask: stopping a PostgreSQL left by an interrupted run ({name})");
            if let Ok(bindir) = postgres_bindir() {
                let pg = Postgres {
                    bindir,
                    dir: dir.clone(),
                    as_postgres_user: is_root(),
                    port: 0,
                };
                drop(pg);
            }
        }
        for (file, server) in [("nats.pid", "nats-server"), ("redis.pid", "redis-server")] {
            if let Ok(pid) = std::fs::read_to_string(dir.join(file)) {
                let pid = pid.trim();
                if Path::new(&format!("/proc/{pid}")).exists() {
                    eprintln!("xtask: stopping a {server} left by an interrupted run ({name})");
                    let _ = Command::new("kill").args(["-KILL", pid]).status();
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Installs a Debian package with apt-get (root only).
fn apt_install(package: &str) -> Result<()> {
    apt_install_with(package, false)
}

/// Installs a Debian package whose service must not start (a packaged
/// `redis-server` would listen on 6379 and keep running): a
/// `policy-rc.d` refusing every start is in place during the install.
fn apt_install_no_start(package: &str) -> Result<()> {
    apt_install_with(package, true)
}

fn apt_install_with(package: &str, no_start: bool) -> Result<()> {
    if !is_root() {
        return Err(format!(
            "{package} is missing: install the Debian package {package} \
             (or run as root to let xtask install it)"
        ));
    }
    eprintln!("xtask: installing {package} with apt-get");
    let policy = Path::new("/usr/sbin/policy-rc.d");
    let made = no_start
        && !policy.exists()
        && std::fs::write(policy, "#!/bin/sh\nexit 101\n").is_ok()
        && Command::new("chmod")
            .args(["+x", "/usr/sbin/policy-rc.d"])
            .status()
            .is_ok_and(|s| s.success());
    let result = run(Command::new("apt-get").args(["update", "-q"])).and_then(|()| {
        run(Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends", package])
            .env("DEBIAN_FRONTEND", "noninteractive"))
    });
    if made {
        let _ = std::fs::remove_file(policy);
    }
    result
}

/// Finds PostgreSQL 15's server binaries, installing `postgresql-15` if root.
fn postgres_bindir() -> Result<PathBuf> {
    let candidate = PathBuf::from("/usr/lib/postgresql/15/bin");
    if !candidate.join("initdb").exists() {
        apt_install("postgresql-15")?;
    }
    if candidate.join("initdb").exists() {
        Ok(candidate)
    } else {
        Err("postgresql-15 installed but initdb is missing".into())
    }
}

/// Finds `nats-server`, installing the Debian package if root.
fn nats_binary() -> Result<PathBuf> {
    let find = || {
        [
            "/usr/sbin/nats-server",
            "/usr/bin/nats-server",
            "/usr/local/bin/nats-server",
        ]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
    };
    if let Some(p) = find() {
        return Ok(p);
    }
    apt_install("nats-server")?;
    find().ok_or_else(|| "nats-server installed but its binary is missing".into())
}

/// Finds libfaketime's preload library (the clock tests start a process
/// whose wall clock is off), installing the Debian package `libfaketime` if
/// root.
fn libfaketime() -> Result<PathBuf> {
    let find = || {
        let multiarch = std::fs::read_dir("/usr/lib")
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path().join("faketime/libfaketime.so.1"));
        [
            PathBuf::from("/usr/lib/faketime/libfaketime.so.1"),
            PathBuf::from("/usr/local/lib/faketime/libfaketime.so.1"),
        ]
        .into_iter()
        .chain(multiarch)
        .find(|p| p.exists())
    };
    if let Some(p) = find() {
        return Ok(p);
    }
    apt_install("libfaketime")?;
    find().ok_or_else(|| "libfaketime installed but libfaketime.so.1 is missing".into())
}

/// Finds Debian's `chromium` for the browser tests, installing it if root.
fn chromium_binary() -> Result<PathBuf> {
    let path = PathBuf::from("/usr/bin/chromium");
    if !path.exists() {
        apt_install("chromium")?;
    }
    if path.exists() {
        Ok(path)
    } else {
        Err("chromium installed but /usr/bin/chromium is missing".into())
    }
}

/// The browser tests' npm packages (`crates/idem-server/tests/browser`):
/// `npm ci` when `node_modules` is missing or older than `package-lock.json`.
fn browser_packages() -> Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/idem-server/tests/browser");
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let lock = modified(&dir.join("package-lock.json"));
    let installed = modified(&dir.join("node_modules/.package-lock.json"));
    let fresh = matches!((lock, installed), (Some(l), Some(i)) if i >= l);
    if fresh {
        return Ok(());
    }
    let has_npm = Command::new("npm")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_npm {
        return Err(
            "node and npm are needed for the browser tests: install Node.js 18 or newer \
             (Debian: apt-get install nodejs npm)"
                .into(),
        );
    }
    eprintln!("xtask: npm ci in {}", dir.display());
    run(Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(&dir))
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// A throwaway PostgreSQL server; stopped when dropped.
struct Postgres {
    bindir: PathBuf,
    dir: PathBuf,
    as_postgres_user: bool,
    port: u16,
}

impl Postgres {
    fn cmd(&self, program: &str) -> Command {
        let path = self.bindir.join(program);
        if self.as_postgres_user {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    fn start(root: &Path) -> Result<Self> {
        let bindir = postgres_bindir()?;
        let as_postgres_user = is_root();
        let dir = root.join(format!("pg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("failed to create {dir:?}: {e}"))?;
        if as_postgres_user {
            // Postgres refuses to run as root: hand the directory to `postgres`.
            run(Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir))?;
        }
        let pg = Self {
            bindir,
            dir: dir.clone(),
            as_postgres_user,
            port: free_port()?,
        };
        let data = dir.join("data");
        run(pg
            .cmd("initdb")
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "-D"])
            .arg(&data)
            .stdout(Stdio::null()))?;
        let opts = format!(
            "-c listen_addresses=127.0.0.1 -p {} -k {} -c max_connections=300 \
             -c fsync=on -c synchronous_commit=on",
            pg.port,
            dir.display()
        );
        run(pg
            .cmd("pg_ctl")
            .args(["-w", "-t", "60", "-D"])
            .arg(&data)
            .args(["-l"])
            .arg(dir.join("log"))
            .args(["-o", &opts, "start"])
            .stdout(Stdio::null()))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", pg.port)).is_err() {
            if Instant::now() > deadline {
                return Err("PostgreSQL did not start listening in 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(pg)
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = self
            .cmd("pg_ctl")
            .args(["-w", "-m", "fast", "-D"])
            .arg(self.dir.join("data"))
            .arg("stop")
            .stdout(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A throwaway server on a free loopback port: its files in
/// `root/<name>-<pid>`, its pid in `<name>.pid` there (for [`sweep`]);
/// killed when dropped.
struct Server {
    child: std::process::Child,
    dir: PathBuf,
    port: u16,
    name: &'static str,
}

impl Server {
    /// Starts `binary` with the arguments `args(port, dir)` gives, and waits
    /// until it listens.
    fn start(
        root: &Path,
        name: &'static str,
        binary: &Path,
        args: impl FnOnce(u16, &Path) -> Vec<std::ffi::OsString>,
    ) -> Result<Self> {
        let dir = root.join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("failed to create {dir:?}: {e}"))?;
        let port = free_port()?;
        let child = Command::new(binary)
            .args(args(port, &dir))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("failed to start {binary:?}: {e}"))?;
        let _ = std::fs::write(dir.join(format!("{name}.pid")), child.id().to_string());
        let server = Self {
            child,
            dir,
            port,
            name,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err(format!("{binary:?} did not start listening in 30 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(server)
    }

    /// `<name>://127.0.0.1:<port>`.
    fn url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.name, self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A throwaway NATS server with JetStream.
fn start_nats(root: &Path, binary: &Path) -> Result<Server> {
    Server::start(root, "nats", binary, |port, dir| {
        let mut args: Vec<std::ffi::OsString> =
            ["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"]
                .iter()
                .map(Into::into)
                .collect();
        args.push(dir.into());
        args
    })
}

/// A throwaway Redis for the bench's peer: loopback, no persistence.
fn start_redis(root: &Path, binary: &Path) -> Result<Server> {
    Server::start(root, "redis", binary, |port, dir| {
        let port = port.to_string();
        let mut args: Vec<std::ffi::OsString> = [
            "--bind",
            "127.0.0.1",
            "--port",
            &port,
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "yes",
            "--dir",
        ]
        .iter()
        .map(Into::into)
        .collect();
        args.push(dir.into());
        args
    })
}

fn test(extra: &[String]) -> Result<()> {
    if extra.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "{USAGE}\n\nOther arguments go to `cargo nextest run` (e.g. -E 'test(/webhook/)')."
        );
        return Ok(());
    }
    // Checked before the suite, not after six minutes of it.
    let fuzz_secs = fuzz_secs_in_test()?;
    catch_interrupts();
    let root = std::env::temp_dir().join("idem-xtask");
    sweep(&root);
    let pg = Postgres::start(&root)?;
    eprintln!("xtask: PostgreSQL 15 on 127.0.0.1:{}", pg.port);
    let nats_bin = nats_binary()?;
    let nats = start_nats(&root, &nats_bin)?;
    eprintln!("xtask: nats-server with JetStream on {}", nats.url());
    let have_nextest = Command::new("cargo")
        .args(["nextest", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    let chromium = chromium_binary()?;
    let faketime = libfaketime()?;
    browser_packages()?;
    let python = venv("test-clients", CLIENT_PACKAGES, "the real HTTP clients")?;
    let mut cmd = Command::new("cargo");
    if have_nextest {
        cmd.args(["nextest", "run", "--workspace", "--no-fail-fast"]);
    } else {
        cmd.args(["test", "--workspace", "--no-fail-fast"]);
    }
    cmd.args(extra)
        .env("IDEM_TEST_POSTGRES_URL", pg.url())
        .env("IDEM_TEST_NATS_URL", nats.url())
        .env("IDEM_TEST_NATS_SERVER", &nats_bin)
        .env("IDEM_TEST_CHROMIUM", &chromium)
        .env("IDEM_TEST_PYTHON", &python)
        .env("IDEM_TEST_LIBFAKETIME", &faketime);
    let result = run(&mut cmd);
    if !extra.is_empty() || INTERRUPTED.load(Ordering::SeqCst) {
        // A filtered run is a developer's loop: the doc tests and the fuzz
        // targets belong to the whole suite. An interrupted one stops here.
        if !INTERRUPTED.load(Ordering::SeqCst) {
            eprintln!("xtask: filtered run; doc tests and fuzzing skipped");
        }
        drop(nats);
        drop(pg);
        return result;
    }
    // Doc tests are not run by nextest.
    let docs = if have_nextest {
        run(Command::new("cargo").args(["test", "--workspace", "--doc"]))
    } else {
        Ok(())
    };
    // The trace exporter is a feature of its own: its tests need a build
    // with it (and the plain build tests that it is refused without).
    let otlp = run(Command::new("cargo")
        .args([
            "test",
            "-p",
            "idem-server",
            "--features",
            "otlp",
            "--test",
            "it",
            "otlp",
        ])
        .env("IDEM_TEST_POSTGRES_URL", pg.url())
        .env("IDEM_TEST_NATS_URL", nats.url())
        .env("IDEM_TEST_NATS_SERVER", &nats_bin));
    drop(nats);
    drop(pg);
    let fuzzing = match fuzz_secs {
        0 => Ok(()),
        secs => fuzz_targets(FUZZ_TARGETS, secs),
    };
    result.and(docs).and(otlp).and(fuzzing)
}

/// Runs `idem bench` (release build) on SQLite, a throwaway PostgreSQL and a
/// throwaway NATS server, with what its external cases need: pgbench, wrk,
/// perf (sends per operation), and for the Powertools peer a throwaway
/// Redis and a Python venv (cached in `target/bench-peer`). A tool that
/// cannot be provisioned skips its cases (the bench says why); it does not
/// fail the run. Cases run 5 s unless `--secs` says otherwise.
fn bench(extra: &[String]) -> Result<()> {
    catch_interrupts();
    let root = std::env::temp_dir().join("idem-xtask");
    sweep(&root);
    let pg = Postgres::start(&root)?;
    let nats = start_nats(&root, &nats_binary()?)?;
    bench_tools(&pg.bindir);
    let peer = Peer::provision(&root);
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
    let result = run(&mut cmd);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", sqlite.display()));
    }
    drop(peer);
    drop(nats);
    drop(pg);
    result
}

/// Seconds per key-engine case in `cargo xtask bench` (the webhook and
/// steps tables take at most 2).
const BENCH_SECS: u64 = 5;

/// pgbench, wrk and perf, installed when missing (as root); what cannot be
/// installed is reported and its cases are skipped by the bench.
fn bench_tools(pg_bindir: &Path) {
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
struct Peer {
    redis: Server,
    python: PathBuf,
}

/// The peer's Python packages (`crates/idem-server/bench/powertools_peer.py`;
/// boto3 because Powertools' idempotency package imports its DynamoDB layer).
const PEER_PACKAGES: &[&str] = &[
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

/// The real clients the tests drive (`IDEM_TEST_PYTHON`): for the gateway,
/// requests with urllib3's `Retry` and Stripe's own library; for webhooks,
/// the providers' signing libraries (Svix's, Standard Webhooks', Slack's
/// SDK). Pinned, so a run tests the clients a previous one did.
const CLIENT_PACKAGES: &[&str] = &[
    "requests==2.34.2",
    "urllib3==2.8.0",
    "stripe==16.1.0",
    "svix==2.9.1",
    "standardwebhooks==1.3.0",
    "slack_sdk==3.48.0",
];

/// `target/<name>/venv`, made with `python3 -m venv` and filled with
/// pip once; reused while its package list is the same. Its python.
fn venv(name: &str, packages: &[&str], purpose: &str) -> Result<PathBuf> {
    let venv = workspace_root().join(format!("target/{name}/venv"));
    let python = venv.join("bin/python");
    let stamp = venv.join("idem-packages.txt");
    let wanted = packages.join("\n");
    if python.exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        return Ok(python);
    }
    let quiet = |cmd: &mut Command| {
        cmd.stdout(Stdio::null())
            .status()
            .map_err(|e| e.to_string())
            .and_then(|s| {
                if s.success() {
                    Ok(())
                } else {
                    Err(format!("exited with {s}"))
                }
            })
    };
    eprintln!(
        "xtask: making a Python venv for {purpose} in {}",
        venv.display()
    );
    let make = || {
        let _ = std::fs::remove_dir_all(&venv);
        quiet(Command::new("python3").args(["-m", "venv"]).arg(&venv))
    };
    // Debian ships venv apart from python3: installed when missing, as root.
    make()
        .or_else(|e| {
            if is_root() && apt_install("python3-venv").is_ok() {
                make()
            } else {
                Err(e)
            }
        })
        .map_err(|e| {
            format!(
                "python3 -m venv failed ({e}): Python 3.9 or newer with venv is needed \
                 (Debian: python3-venv)"
            )
        })?;
    quiet(
        Command::new(venv.join("bin/pip"))
            .args(["install", "-q", "--disable-pip-version-check"])
            .args(packages),
    )
    .map_err(|e| {
        format!(
            "pip install {} failed ({e}); is PyPI reachable?",
            packages.join(" ")
        )
    })?;
    std::fs::write(&stamp, wanted).map_err(|e| e.to_string())?;
    Ok(python)
}

/// The targets in `fuzz/fuzz_targets`, each a `[[bin]]` of `fuzz/Cargo.toml`.
const FUZZ_TARGETS: &[&str] = &["idempotency_key", "webhook_signature", "canonical_json"];

/// Seconds per target for `cargo xtask fuzz` unless `--secs` says otherwise.
const FUZZ_SECS_DEFAULT: u64 = 180;

/// Seconds per target within `cargo xtask test`; `XTASK_FUZZ_SECS` overrides
/// it, and 0 leaves fuzzing out.
const FUZZ_SECS_IN_TEST: u64 = 20;

const FUZZ_SECS_MAX: u64 = 24 * 3600;

fn fuzz_secs_in_test() -> Result<u64> {
    match std::env::var("XTASK_FUZZ_SECS") {
        Ok(v) => v
            .parse()
            .ok()
            .filter(|s| *s <= FUZZ_SECS_MAX)
            .ok_or_else(|| format!("XTASK_FUZZ_SECS={v:?}: expected 0 to {FUZZ_SECS_MAX}")),
        Err(_) => Ok(FUZZ_SECS_IN_TEST),
    }
}

/// `cargo xtask fuzz [TARGET] [--secs N]`: one target or all, N seconds each.
fn fuzz(args: &[String]) -> Result<()> {
    let mut target = None;
    let mut secs = FUZZ_SECS_DEFAULT;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--secs" => {
                secs = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .filter(|s| (1..=FUZZ_SECS_MAX).contains(s))
                    .ok_or_else(|| format!("--secs takes 1 to {FUZZ_SECS_MAX}"))?;
            }
            "--help" | "-h" => {
                println!(
                    "usage: cargo xtask fuzz [TARGET] [--secs N]\n\ntargets: {}\n\
                     default: every target, {FUZZ_SECS_DEFAULT} s each",
                    FUZZ_TARGETS.join(", ")
                );
                return Ok(());
            }
            t if target.is_none() && FUZZ_TARGETS.contains(&t) => target = Some(t),
            other => {
                return Err(format!(
                    "unknown argument {other:?}; targets: {}",
                    FUZZ_TARGETS.join(", ")
                ));
            }
        }
    }
    match target {
        Some(t) => fuzz_targets(&[t], secs),
        None => fuzz_targets(FUZZ_TARGETS, secs),
    }
}

fn workspace_root() -> PathBuf {
    // xtask/ sits at the root of the workspace.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

fn host_triple() -> Result<String> {
    let out = Command::new("rustc")
        .arg("-vV")
        .output()
        .map_err(|e| format!("failed to run rustc -vV: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_owned)
        .ok_or_else(|| "rustc -vV printed no host triple".into())
}

/// Builds the fuzz targets and runs each for `secs` seconds, printing the
/// executions libFuzzer reports.
///
/// The build uses cargo-fuzz's instrumentation flags (SanitizerCoverage for
/// libFuzzer, `--cfg fuzzing`, debug assertions, release mode) without a
/// sanitizer: those flags are all stable, so this works with the one stable
/// toolchain of a fresh machine, needing neither nightly nor an installed
/// `cargo-fuzz`. The code fuzzed is safe Rust (`unsafe_code = "forbid"`),
/// where AddressSanitizer would find little; for it, use
/// `cargo +nightly fuzz run TARGET` in the same directory.
fn fuzz_targets(targets: &[&str], secs: u64) -> Result<()> {
    let fuzz_dir = workspace_root().join("fuzz");
    let triple = host_triple()?;
    let mut rustflags = String::from(
        "-Cpasses=sancov-module \
         -Cllvm-args=-sanitizer-coverage-level=4 \
         -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
         -Cllvm-args=-sanitizer-coverage-pc-table \
         -Cllvm-args=-sanitizer-coverage-trace-compares \
         -Cllvm-args=-simplifycfg-branch-fold-threshold=0 \
         --cfg fuzzing -Clink-dead-code -Cdebug-assertions -Ccodegen-units=1",
    );
    if triple.contains("-linux-") {
        rustflags.push_str(" -Cllvm-args=-sanitizer-coverage-stack-depth");
    }
    if let Ok(extra) = std::env::var("RUSTFLAGS") {
        rustflags.push(' ');
        rustflags.push_str(&extra);
    }
    eprintln!("xtask: building the fuzz targets ({triple}, release, instrumented)");
    let started = Instant::now();
    // `--target` keeps RUSTFLAGS away from build scripts, as cargo-fuzz does.
    run(Command::new("cargo")
        .args(["build", "--release", "--bins", "--manifest-path"])
        .arg(fuzz_dir.join("Cargo.toml"))
        .args(["--target", &triple])
        .env("RUSTFLAGS", rustflags))?;
    eprintln!(
        "xtask: fuzz targets built in {} s",
        started.elapsed().as_secs()
    );
    let bin_dir = fuzz_dir.join("target").join(&triple).join("release");
    let mut failed = Vec::new();
    for target in targets {
        if let Err(e) = fuzz_run(&fuzz_dir, &bin_dir, target, secs) {
            eprintln!("xtask: fuzz {target}: {e}");
            failed.push(*target);
        }
    }
    // A closing line in the form test-result readers know.
    eprintln!(
        "fuzz: {} passed, {} failed",
        targets.len() - failed.len(),
        failed.len()
    );
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("fuzz targets failed: {}", failed.join(", ")))
    }
}

/// Runs one target over its committed seeds and a scratch corpus (both under
/// `fuzz/`, the corpus and any crash artifact git-ignored).
fn fuzz_run(fuzz_dir: &Path, bin_dir: &Path, target: &str, secs: u64) -> Result<()> {
    let corpus = fuzz_dir.join("corpus").join(target);
    let artifacts = fuzz_dir.join("artifacts").join(target);
    for dir in [&corpus, &artifacts] {
        std::fs::create_dir_all(dir).map_err(|e| format!("failed to create {dir:?}: {e}"))?;
    }
    let mut cmd = Command::new(bin_dir.join(target));
    cmd.arg(format!("-max_total_time={secs}"))
        .arg("-timeout=10")
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        // libFuzzer adds new inputs to the first directory only.
        .arg(&corpus);
    let seeds = fuzz_dir.join("seeds").join(target);
    if seeds.is_dir() {
        cmd.arg(&seeds);
    }
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("failed to start {cmd:?}: {e}"))?;
    let log = String::from_utf8_lossy(&out.stderr);
    let seed = log
        .lines()
        .find_map(|l| l.split("Seed: ").nth(1))
        .unwrap_or("?");
    if !out.status.success() {
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        for line in tail.into_iter().rev() {
            eprintln!("  {line}");
        }
        return Err(format!(
            "{} (libFuzzer seed {seed}; reproduce with `{} <artifact>` from {})",
            out.status,
            bin_dir.join(target).display(),
            artifacts.display()
        ));
    }
    // "Done 581930 runs in 21 second(s)"
    let done = log
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("Done "))
        .and_then(|l| {
            let mut words = l.split_whitespace();
            let runs = words.next()?.to_owned();
            let secs = words.nth(2)?.to_owned();
            Some((runs, secs))
        });
    match done {
        Some((runs, secs)) => {
            eprintln!("xtask: fuzz {target}: {runs} executions in {secs} s (seed {seed})");
            Ok(())
        }
        None => Err("libFuzzer printed no \"Done N runs\" line".into()),
    }
}
