//! The `idem` binary as a real process: the README tour, `kill -9` and
//! restart, `idem gc` and `idem migrate`, and clear errors for bad settings.

use std::net::SocketAddr;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use idem_core::ManualClock;

use crate::fixture::{self, TempDir};
use crate::{DemoConfig, PAY, call, create, payments_of, try_call};

fn idem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_idem"))
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An `idem` subcommand running as a child process; SIGKILLed on drop. Its
/// log goes to a file, printed only when the test fails: a passing run shows
/// the test's own summary lines, not hundreds of child log lines.
pub struct Proc {
    child: Child,
    pub args: Vec<String>,
    log: std::path::PathBuf,
    _dir: TempDir,
}

/// The logs of processes that ended earlier in this test (a restarted
/// server, a killed relay), kept for the failure report. Bounded.
static RETIRED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn tail(path: &std::path::Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Proc {
    /// Starts `idem ARGS` with `IDEM_FAILPOINTS` set to `failpoints` (if any).
    pub fn spawn(args: &[String], failpoints: Option<&str>) -> Self {
        Self::spawn_with_env(args, failpoints, &[])
    }

    /// Starts `idem ARGS` with extra environment variables.
    pub fn spawn_with_env(args: &[String], failpoints: Option<&str>, env: &[(&str, &str)]) -> Self {
        let mut cmd = idem();
        cmd.envs(env.iter().copied());
        match failpoints {
            Some(f) => cmd.env(idem_core::failpoint::ENV, f),
            None => cmd.env_remove(idem_core::failpoint::ENV),
        };
        Self::from_command(cmd, args)
    }

    /// Starts `program ARGS` with these environment variables: a line of a
    /// process-manager file (`idem`, `nats-server`).
    pub fn spawn_program(
        program: &std::path::Path,
        args: &[String],
        env: &[(String, String)],
    ) -> Self {
        let mut cmd = Command::new(program);
        cmd.envs(env.iter().map(|(k, v)| (k, v)))
            .env_remove(idem_core::failpoint::ENV);
        Self::from_command(cmd, args)
    }

    fn from_command(mut cmd: Command, args: &[String]) -> Self {
        let dir = TempDir::new("proc-log");
        let log = dir.path().join("stderr.log");
        cmd.args(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        Self {
            child: cmd.spawn().unwrap(),
            args: args.to_vec(),
            log,
            _dir: dir,
        }
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Waits up to `max` for it to exit by itself; whether it did.
    pub async fn exited_within(&mut self, max: Duration) -> bool {
        for _ in 0..(max.as_millis() / 20).max(1) {
            if !self.alive() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        !self.alive()
    }

    /// SIGKILL: no shutdown hook, no flush, no graceful anything.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
        let report = format!(
            "--- idem {} (last 200 lines of stderr) ---\n{}",
            self.args.join(" "),
            tail(&self.log, 200)
        );
        let mut retired = RETIRED.lock().unwrap_or_else(|e| e.into_inner());
        if std::thread::panicking() {
            for earlier in retired.drain(..) {
                eprintln!("{earlier}");
            }
            eprintln!("{report}");
        } else {
            if retired.len() >= 8 {
                retired.remove(0);
            }
            retired.push(report);
        }
    }
}

/// `idem serve` running as a child process.
pub struct Server {
    proc: Proc,
    pub addr: SocketAddr,
}

impl Server {
    pub async fn start(database_url: &str, extra: &[&str]) -> Self {
        Self::start_with(database_url, extra, None).await
    }

    pub async fn start_with(database_url: &str, extra: &[&str], failpoints: Option<&str>) -> Self {
        Self::start_env(database_url, extra, failpoints, &[]).await
    }

    /// With extra environment variables (`RUST_LOG`, …).
    pub async fn start_env(
        database_url: &str,
        extra: &[&str],
        failpoints: Option<&str>,
        env: &[(&str, &str)],
    ) -> Self {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let mut args: Vec<String> = [
            "serve",
            "--listen",
            &addr.to_string(),
            "--database-url",
            database_url,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut proc = Proc::spawn_with_env(&args, failpoints, env);
        Self::wait_healthy(&mut proc, addr).await;
        Self { proc, addr }
    }

    async fn wait_healthy(proc: &mut Proc, addr: SocketAddr) {
        for _ in 0..600 {
            if let Ok(r) = try_call(addr, "GET", "/healthz", None, "").await {
                assert_eq!(r.status, 200);
                return;
            }
            assert!(proc.alive(), "idem serve exited early");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("idem serve did not answer /healthz within 30 s");
    }

    /// SIGKILL: no shutdown hook, no flush, no graceful anything.
    pub fn kill9(mut self) {
        self.proc.kill9();
    }

    /// The server's process.
    pub fn proc(&mut self) -> &mut Proc {
        &mut self.proc
    }

    /// Kills it and starts the same command again on the same port.
    pub async fn restart(&mut self) {
        self.proc.kill9();
        self.proc = Proc::spawn(&self.proc.args.clone(), None);
        Self::wait_healthy(&mut self.proc, self.addr).await;
    }
}

fn run(args: &[&str]) -> Output {
    idem().args(args).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_tour_on_sqlite() {
    let dir = TempDir::new("tour");
    let server = Server::start(&dir.sqlite_url(), &[]).await;
    let a = server.addr;
    let b = r#"{"amount":1000,"currency":"EUR","customer":"cus_1","reference":"order-1"}"#;
    let created = create(a, "k-1", b).await;
    assert_eq!(created.status, 201);
    let id = created.json()["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("pay_"));
    assert_eq!(
        created.header("location"),
        Some(format!("/v1/payments/{id}"))
    );
    assert_eq!(created.json()["status"], "succeeded");
    let retry = create(a, "k-1", b).await;
    assert_eq!((retry.status, retry.replayed()), (201, true));
    assert_eq!(retry.body, created.body);
    let mismatch = create(
        a,
        "k-1",
        r#"{"amount":5,"currency":"EUR","customer":"cus_1"}"#,
    )
    .await;
    assert_eq!(mismatch.status, 422);
    assert_eq!(
        mismatch.problem_type(),
        "https://idem.dev/problems/idempotency-key-reused"
    );
    let missing = call(a, "POST", "/v1/payments", None, b).await;
    assert_eq!(missing.status, 400);
    assert_eq!(
        missing.problem_type(),
        "https://idem.dev/problems/missing-idempotency-key"
    );
    assert_eq!(payments_of(a, "cus_1").await.len(), 1);
    let path = format!("/v1/payments/{id}/refunds");
    let refund = call(a, "POST", &path, Some("r-1"), r#"{"amount":300}"#).await;
    assert_eq!(refund.status, 201);
    let location = refund.header("location").unwrap();
    assert!(location.starts_with(&format!("{path}/re_")), "{location}");
    let over = call(a, "POST", &path, Some("r-2"), r#"{"amount":800}"#).await;
    assert_eq!(over.status, 422);
    let over_again = call(a, "POST", &path, Some("r-2"), r#"{"amount":800}"#).await;
    assert_eq!((over_again.status, over_again.replayed()), (422, true));
    let shown = call(a, "GET", &format!("/v1/payments/{id}"), None, "").await;
    assert_eq!(shown.json()["amount_refunded"], 300);
}

async fn crash_and_restart(url: &str) {
    let server = Server::start(url, &[]).await;
    let body = |i: usize| {
        format!(
            r#"{{"amount":{},"currency":"EUR","customer":"cus_crash"}}"#,
            100 + i
        )
    };
    // Acknowledged before the crash.
    let mut acked = Vec::new();
    for i in 0..5 {
        let r = create(server.addr, &format!("a-{i}"), &body(i)).await;
        assert_eq!(r.status, 201);
        acked.push(r.body);
    }
    // Eight clients keep creating payments while the process is killed: the
    // outcomes of the requests in flight are unknown to them.
    let addr = server.addr;
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(5));
    let mut clients = Vec::new();
    for _ in 0..8 {
        let next = next.clone();
        clients.push(tokio::spawn(async move {
            let (mut answered, mut lost) = (0, 0);
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                match try_call(
                    addr,
                    "POST",
                    "/v1/payments",
                    Some(&format!("a-{i}")),
                    &body(i),
                )
                .await
                {
                    Ok(r) if r.status == 201 => answered += 1,
                    Ok(r) => panic!("unexpected status {} before the kill", r.status),
                    Err(_) => {
                        lost += 1;
                        return (answered, lost);
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.kill9();
    let (mut answered, mut lost) = (0, 0);
    for c in clients {
        let (a, l) = c.await.unwrap();
        answered += a;
        lost += l;
    }
    // Every index handed out was sent (or tried): each is an intent to settle.
    let attempted = next.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(lost, 8, "every client saw the server die");
    // Restarted on the same database, every client retries with its key.
    let server = Server::start(url, &[]).await;
    for (i, first) in acked.iter().enumerate() {
        let r = create(server.addr, &format!("a-{i}"), &body(i)).await;
        assert!(r.replayed(), "an acknowledged payment survives kill -9");
        assert_eq!(&r.body, first);
    }
    for i in 5..attempted {
        let r = create(server.addr, &format!("a-{i}"), &body(i)).await;
        assert_eq!(r.status, 201);
    }
    let mut amounts: Vec<i64> = payments_of(server.addr, "cus_crash")
        .await
        .iter()
        .map(|p| p["amount"].as_i64().unwrap())
        .collect();
    amounts.sort();
    let expected: Vec<i64> = (0..attempted).map(|i| 100 + i as i64).collect();
    assert_eq!(
        amounts, expected,
        "every intent has exactly one payment ({answered} answered, {lost} lost in the kill)"
    );
    eprintln!(
        "crash drill: {attempted} intents, {answered} answered before kill -9, {lost} unanswered; one payment each after retries"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_and_restart_on_sqlite_keeps_one_payment_per_key() {
    let dir = TempDir::new("crash");
    crash_and_restart(&dir.sqlite_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_and_restart_on_postgres_keeps_one_payment_per_key() {
    let db = idem_testkit::PgDatabase::create("idem_crash").await;
    crash_and_restart(&db.url).await;
}

/// Records written 25 h ago (by an in-process server on a clock set back) are
/// expired in real time; `idem gc` deletes them and nothing else.
async fn gc_as_a_process(url: &str) {
    let past = ManualClock::starting_now();
    let old = fixture::serve_demo(
        url,
        ManualClock::new(idem_core::Clock::now_ms(&past) - 25 * 3600 * 1000),
        DemoConfig::default(),
    )
    .await;
    for i in 0..3 {
        let b = format!(
            r#"{{"amount":{},"currency":"EUR","customer":"cus_gc"}}"#,
            i + 1
        );
        assert_eq!(create(old.addr, &format!("old-{i}"), &b).await.status, 201);
    }
    let live = fixture::serve_demo(url, past, DemoConfig::default()).await;
    let b = r#"{"amount":9,"currency":"EUR","customer":"cus_gc"}"#;
    assert_eq!(create(live.addr, "live", b).await.status, 201);
    let out = run(&["gc", "--database-url", url]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).trim(),
        "deleted 3 expired key records, 0 inbox records, 0 webhook receipts, 0 sent outbox messages, 0 finished runs, 0 send-once entries, 0 finished tasks"
    );
    let out = run(&["gc", "--database-url", url]);
    assert_eq!(
        text(&out.stdout).trim(),
        "deleted 0 expired key records, 0 inbox records, 0 webhook receipts, 0 sent outbox messages, 0 finished runs, 0 send-once entries, 0 finished tasks"
    );
    // The live key still replays; the payments themselves are untouched.
    assert!(create(live.addr, "live", b).await.replayed());
    assert_eq!(payments_of(live.addr, "cus_gc").await.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_command_deletes_expired_records_on_sqlite() {
    let dir = TempDir::new("gc");
    gc_as_a_process(&dir.sqlite_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_command_deletes_expired_records_on_postgres() {
    let db = idem_testkit::PgDatabase::create("idem_gc").await;
    gc_as_a_process(&db.url).await;
}

#[test]
fn migrate_command_is_idempotent() {
    let dir = TempDir::new("migrate");
    for _ in 0..2 {
        let out = run(&["migrate", "--database-url", &dir.sqlite_url()]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout).trim(), "migrations applied");
    }
}

#[test]
fn bad_settings_are_clear_errors_and_nothing_starts() {
    let dir = TempDir::new("bad");
    let db = dir.sqlite_url();
    let cases: &[(&[&str], &str)] = &[
        (
            &["serve", "--database-url", &db, "--key-ttl", "0s"],
            "--key-ttl must be between",
        ),
        (
            &["serve", "--database-url", &db, "--key-ttl", "soon"],
            "invalid value 'soon'",
        ),
        (
            &["serve", "--database-url", &db, "--max-body-bytes", "0"],
            "--max-body-bytes must be between",
        ),
        (
            &["serve", "--database-url", "mysql://x/y"],
            "unsupported database URL",
        ),
        (
            &["serve", "--database-url", "sqlite::memory:"],
            "not durable",
        ),
        (
            &["serve", "--database-url", &db, "--listen", "nowhere"],
            "invalid value 'nowhere'",
        ),
        (
            &["serve", "--database-url", &db, "--gc-interval", "0s"],
            "--gc-interval must be between 1s and 1d, got 0s",
        ),
        (
            &[
                "serve",
                "--database-url",
                &db,
                "--header-read-timeout",
                "5min",
            ],
            "--header-read-timeout must be between 1s and 1min, got 5min",
        ),
        (
            &["serve", "--database-url", &db, "--max-connections", "0"],
            "--max-connections must be between 1 and 100000",
        ),
        (
            &[
                "serve",
                "--database-url",
                &db,
                "--max-buffered-bytes",
                "1000",
            ],
            "--max-buffered-bytes must be between the largest body accepted (1048576)",
        ),
        (
            // The admin API takes bodies of 64 KiB whatever --max-body-bytes
            // says: a budget that cannot hold one is refused.
            &[
                "serve",
                "--database-url",
                &db,
                "--max-body-bytes",
                "1000",
                "--max-buffered-bytes",
                "4000",
            ],
            "--max-buffered-bytes must be between the largest body accepted (65536)",
        ),
        (
            &[
                "serve",
                "--database-url",
                &db,
                "--max-buffered-bytes-per-peer",
                "1000",
            ],
            "--max-buffered-bytes-per-peer must be between the largest body accepted (1048576) \
             and --max-buffered-bytes (67108864), got 1000",
        ),
        (
            &[
                "serve",
                "--database-url",
                &db,
                "--max-buffered-bytes-per-peer",
                "67108865",
            ],
            "--max-buffered-bytes-per-peer must be between the largest body accepted (1048576) \
             and --max-buffered-bytes (67108864), got 67108865",
        ),
        (
            &["serve", "--database-url", &db, "--handler-timeout", "0s"],
            "--handler-timeout must be between 1s and 10min, got 0s",
        ),
        (
            &[
                "serve",
                "--database-url",
                &db,
                "--upstream",
                "http://127.0.0.1:9",
                "--nats-url",
                "nats://127.0.0.1:4222",
                "--consume",
            ],
            "--consume runs the demo's ledger consumer, which a gateway (--upstream) does not have",
        ),
    ];
    for (args, expected) in cases {
        let out = run(args);
        assert!(!out.status.success(), "{args:?} must fail");
        let err = text(&out.stderr);
        assert!(
            err.contains(expected),
            "{args:?}: expected {expected:?} in {err}"
        );
    }
    assert!(
        !dir.path().join("idem.db").exists(),
        "settings are checked before the database is touched"
    );
}

/// The `[server]` table of `--config` sets `idem serve`'s defaults; the
/// environment beats the file and a flag beats both. Each case is told apart
/// by which bound the command refuses (settings are checked in flag order),
/// and a running server shows the file's value in effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_file_sets_defaults_that_environment_and_flags_override() {
    let dir = TempDir::new("file");
    let db = dir.sqlite_url();
    let file = dir.path().join("idem.toml");
    let serve = |contents: &str, args: &[&str], env: &[(&str, &str)]| {
        std::fs::write(&file, contents).unwrap();
        let mut cmd = idem();
        cmd.args(["serve", "--database-url", &db, "--config"])
            .arg(&file)
            .args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(!out.status.success(), "{contents} {args:?} must fail");
        text(&out.stderr)
    };
    let err = serve("[server]\nkey_ttl = \"0s\"\n", &[], &[]);
    assert!(
        err.contains("--key-ttl must be between"),
        "the file applies: {err}"
    );
    let err = serve(
        "[server]\nkey_ttl = \"0s\"\ngc_interval = \"0s\"\n",
        &["--key-ttl", "24h"],
        &[],
    );
    assert!(
        err.contains("--gc-interval must be between"),
        "a flag beats the file: {err}"
    );
    let err = serve(
        "[server]\ngc_interval = \"0s\"\nmax_body_bytes = 0\n",
        &[],
        &[("IDEM_GC_INTERVAL", "60s")],
    );
    assert!(
        err.contains("--max-body-bytes must be between"),
        "the environment beats the file: {err}"
    );
    let err = serve("[server]\nconsume = true\n", &[], &[]);
    assert!(
        err.contains("--consume needs --broker-url"),
        "a switch: {err}"
    );
    let err = serve("[server]\nnope = 1\n", &[], &[]);
    assert!(err.contains("server.nope: unknown setting"), "{err}");
    let err = serve("[server]\nkey_ttl = [1]\n", &[], &[]);
    assert!(err.contains("server.key_ttl: expected a string"), "{err}");
    assert!(
        !dir.path().join("idem.db").exists(),
        "settings are checked before the database is touched"
    );

    std::fs::write(&file, "[server]\nmax_body_bytes = 16\n").unwrap();
    let path = file.to_string_lossy().into_owned();
    let server = Server::start(&db, &["--config", &path]).await;
    let r = create(server.addr, "k-file", PAY).await;
    assert_eq!(r.status, 413, "the file's body limit is in effect");
}

/// `POST /v1/payments-baseline` — the payment handler without the
/// idempotency layer, for `idem bench` — exists only with
/// `--bench-routes`, typed on the command line: no file sets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_baseline_route_is_mounted_only_by_the_bench_flag() {
    const BASELINE: &str = "/v1/payments-baseline";
    let dir = TempDir::new("bench-routes");
    let db = dir.sqlite_url();
    let plain = Server::start(&db, &[]).await;
    let r = call(plain.addr, "POST", BASELINE, None, PAY).await;
    assert_eq!(r.status, 404, "not mounted without the flag");
    drop(plain);

    let mut bench = Server::start(&db, &["--bench-routes", "--max-body-bytes", "256"]).await;
    let a = bench.addr;
    // No key, no layer: each call pays, the same body twice is two payments.
    let first = call(a, "POST", BASELINE, None, PAY).await;
    let again = call(a, "POST", BASELINE, None, PAY).await;
    assert_eq!((first.status, again.status), (201, 201));
    assert!(!first.replayed() && !again.replayed());
    assert_ne!(first.json()["id"], again.json()["id"]);
    assert!(
        first
            .header("location")
            .is_some_and(|l| l.starts_with("/v1/payments/pay_")),
        "the payment route's answer"
    );
    // The payment route's rules and the layer's bounds still hold.
    let declined = r#"{"amount":100,"currency":"EUR","customer":"cus_decline_1"}"#;
    assert_eq!(call(a, "POST", BASELINE, None, declined).await.status, 402);
    let r = call(a, "POST", BASELINE, None, r#"{"amount":0}"#).await;
    assert_eq!(r.status, 400);
    let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(300));
    let r = call(a, "POST", BASELINE, None, &big).await;
    assert_eq!(r.status, 413);
    assert_eq!(r.problem_type(), "https://idem.dev/problems/body-too-large");
    let r = call(a, "POST", "/v1/payments", None, PAY).await;
    assert_eq!(r.status, 400, "the keyed route still wants its key");
    let customer = serde_json::from_str::<serde_json::Value>(PAY).unwrap()["customer"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        payments_of(a, &customer).await.len(),
        2,
        "only the two 201s paid"
    );
    assert!(
        bench.proc().log().contains("--bench-routes"),
        "warned at start"
    );

    // Only the flag: the file's [server] table cannot hold it.
    let file = dir.path().join("idem.toml");
    std::fs::write(&file, "[server]\nbench_routes = true\n").unwrap();
    let out = idem()
        .args(["serve", "--database-url", &db, "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("server.bench_routes: unknown setting"),
        "{}",
        text(&out.stderr)
    );
    // Nor does a gateway take it.
    let out = run(&[
        "serve",
        "--database-url",
        &db,
        "--upstream",
        "http://127.0.0.1:9",
        "--bench-routes",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--bench-routes"),
        "{}",
        text(&out.stderr)
    );
}

/// `--database-pool N` bounds the sessions one `idem serve` opens on
/// PostgreSQL to 3 × N (the pool, the key transactions, their read-first
/// step), under more concurrent requests than that; 0 is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_pool_bounds_the_sessions_of_a_server_on_postgres() {
    let db = idem_testkit::PgDatabase::create("idem_pool").await;
    let server = Server::start(&db.url, &["--database-pool", "2"]).await;
    let addr = server.addr;
    // One connection: the query's own is the one left out of the count (a
    // pool could hand the next query a second connection while the first
    // goes back, and count it as the server's).
    let watcher = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.url)
        .await
        .unwrap();
    let sessions = || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND pid <> pg_backend_pid()",
        )
        .fetch_one(&watcher)
        .await
        .unwrap();
        n
    };
    let mut clients = Vec::new();
    for c in 0..16 {
        clients.push(tokio::spawn(async move {
            for i in 0..15 {
                let body = format!(
                    r#"{{"amount":{},"currency":"EUR","customer":"cus_pool"}}"#,
                    i + 1
                );
                let r = create(addr, &format!("pool-{c}-{i}"), &body).await;
                assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
            }
        }));
    }
    let mut most = 0;
    while clients.iter().any(|c| !c.is_finished()) {
        most = most.max(sessions().await);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for c in clients {
        c.await.unwrap();
    }
    assert!(most >= 1, "the server had sessions open");
    assert!(
        most <= 6,
        "{most} sessions with --database-pool 2 (at most 6)"
    );
    assert_eq!(payments_of(addr, "cus_pool").await.len(), 16 * 15);
    let out = run(&["serve", "--database-url", &db.url, "--database-pool", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--database-pool"),
        "{}",
        text(&out.stderr)
    );
    println!(
        "database pool: 16 clients, 240 payments, at most {most} sessions with --database-pool 2"
    );
}

/// After the database went away and came back, the pool's idle connections
/// are dead. `/readyz` says ready at the first probe once it is back (each
/// dead connection it meets is dropped and the next tried) instead of
/// failing one probe per dead connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_ready_at_the_first_probe_after_the_database_returns() {
    let db = idem_testkit::PgDatabase::create("idem_ready").await;
    let proxy = idem_testkit::Proxy::start(idem_testkit::url_addr(&db.url)).await;
    let url = idem_testkit::url_via(&db.url, proxy.addr);
    let server = Server::start(&url, &[]).await;
    let addr = server.addr;
    // Several pooled connections, idle afterwards.
    let mut clients = Vec::new();
    for c in 0..8 {
        clients.push(tokio::spawn(async move {
            let r = call(
                addr,
                "GET",
                &format!("/v1/payments?customer=cus_r{c}"),
                None,
                "",
            )
            .await;
            assert_eq!(r.status, 200);
            let r = call(addr, "GET", "/readyz", None, "").await;
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        }));
    }
    for c in clients {
        c.await.unwrap();
    }
    let ready = call(addr, "GET", "/readyz", None, "").await;
    assert_eq!(
        String::from_utf8_lossy(&ready.body),
        r#"{"broker":"none","database":"ok","status":"ready"}"#
    );
    // (An answer is reused for a second: each probe below comes after it.)
    let past_reuse = Duration::from_millis(1100);
    proxy.cut().await;
    tokio::time::sleep(past_reuse).await;
    proxy.restore();
    let r = call(addr, "GET", "/readyz", None, "").await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    // While it is gone: not ready, and why, without the cause's text.
    proxy.cut().await;
    tokio::time::sleep(past_reuse).await;
    let r = call(addr, "GET", "/readyz", None, "").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.problem_type(), "https://idem.dev/problems/not-ready");
    let v = r.json();
    assert!(
        matches!(v["database"].as_str(), Some("unavailable" | "no answer")),
        "{v}"
    );
    assert!(
        !String::from_utf8_lossy(&r.body).contains("127.0.0.1"),
        "{v}"
    );
    assert_eq!(call(addr, "GET", "/healthz", None, "").await.status, 200);
    proxy.restore();
}

/// Runs `idem args` for at most `within`: its exit status and stderr, or
/// `None` for the status when it was still running then (it is killed).
fn run_within(args: &[&str], within: Duration) -> (Option<std::process::ExitStatus>, String) {
    let mut child = idem()
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + within;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    (status, err)
}

/// A NATS server list that cannot be used (an empty entry, another scheme
/// than nats:// or tls:// after the first, a port out of range) is refused
/// like any other bad flag: a non-zero exit and one `error:` line — not an
/// ERROR log line followed by exit status 0 (which a process manager or a
/// Procfile runner takes for a clean stop), nor a server that runs on
/// without its relay. And a password in the list is never printed, even
/// one with a comma in it.
#[test]
fn a_bad_nats_server_list_is_refused_with_a_failing_exit_status() {
    let dir = TempDir::new("bad-nats-list");
    let db = dir.sqlite_url();
    let out = run(&["migrate", "--database-url", &db]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lists = [
        "nats://127.0.0.1:1,",
        "nats://127.0.0.1:1,,nats://127.0.0.1:2",
        "nats://127.0.0.1:1,http://127.0.0.1:2",
        "nats://127.0.0.1:1,nats://127.0.0.1:99999",
        "nats://alice:s3cr,etPW@127.0.0.1:1",
    ];
    let mut wrong = Vec::new();
    for list in lists {
        for command in ["relay", "consume"] {
            let (status, err) = run_within(
                &[command, "--database-url", &db, "--nats-url", list],
                Duration::from_secs(20),
            );
            let refused = status.is_some_and(|s| !s.success());
            if !refused || !err.contains("error:") || err.contains("s3cr") {
                wrong.push(format!(
                    "idem {command} --nats-url {list:?}: exit {status:?}, stderr: {}",
                    err.trim()
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// `--broker-url` with an unknown scheme or a URL of a known broker that
/// does not parse: one line on stderr that does not repeat the password,
/// exit status 1, on every command that takes it.
#[test]
fn a_bad_broker_url_is_one_line_without_its_password_and_exit_1() {
    let dir = TempDir::new("bad-broker-url");
    let db = dir.sqlite_url();
    let out = run(&["migrate", "--database-url", &db]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let urls = [
        "redis://alice:s3cretPW@127.0.0.1:6379",
        "amqp://alice:s3cretPW@127.0.0.1:notaport/%2f",
        "kafka://alice:s3cretPW@127.0.0.1:9092",
        "kafka://127.0.0.1",
        "s3cretPW",
    ];
    let mut wrong = Vec::new();
    for url in urls {
        for command in ["relay", "consume", "serve"] {
            let (status, err) = run_within(
                &[command, "--database-url", &db, "--broker-url", url],
                Duration::from_secs(20),
            );
            let lines = err.trim().lines().count();
            if status.and_then(|s| s.code()) != Some(1)
                || lines != 1
                || !err.contains("--broker-url")
                || err.contains("s3cretPW")
            {
                wrong.push(format!(
                    "idem {command} --broker-url {url:?}: exit {status:?}, stderr: {}",
                    err.trim()
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// An API with `--nats-url` reports NATS in `/readyz` but stays ready
/// without it (it serves; its events wait in the outbox); a relay is not
/// ready without it. And `--nats-replicas 3` against a server that is not
/// in a cluster is a setting to change: the relay exits 1 saying so,
/// instead of retrying for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_with_nats_down_and_replicas_a_single_server_cannot_hold() {
    let dir = TempDir::new("ready-nats");
    let db = dir.sqlite_url();
    let mut nats = idem_testkit::NatsServer::start();
    let server = Server::start(&db, &["--nats-url", &nats.url()]).await;
    let side = free_port();
    let relay_args: Vec<String> = [
        "relay",
        "--database-url",
        &db,
        "--nats-url",
        &nats.url(),
        "--metrics-listen",
        &format!("127.0.0.1:{side}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let _relay = Proc::spawn(&relay_args, None);
    let relay: SocketAddr = format!("127.0.0.1:{side}").parse().unwrap();
    let ready_body = |r: &crate::Reply| String::from_utf8_lossy(&r.body).into_owned();
    let mut both_ready = false;
    for _ in 0..200 {
        let api = try_call(server.addr, "GET", "/readyz", None, "").await;
        let rel = try_call(relay, "GET", "/readyz", None, "").await;
        if matches!((&api, &rel), (Ok(a), Ok(r)) if a.status == 200 && r.status == 200 && a.json()["nats"] == "ok")
        {
            both_ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(both_ready, "the API and the relay are ready with NATS up");
    nats.kill();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let api = call(server.addr, "GET", "/readyz", None, "").await;
    assert_eq!(api.status, 200, "{}", ready_body(&api));
    assert_ne!(api.json()["nats"], "ok", "{}", ready_body(&api));
    let rel = call(relay, "GET", "/readyz", None, "").await;
    assert_eq!(rel.status, 503, "{}", ready_body(&rel));
    // The API still takes payments; their events wait.
    let r = create(server.addr, "ready-nats-1", PAY).await;
    assert_eq!(r.status, 201);
    nats.restart();
    // A server without the streams: the relay would create them.
    let fresh = idem_testkit::NatsServer::start();
    let (status, err) = run_within(
        &[
            "relay",
            "--database-url",
            &db,
            "--nats-url",
            &fresh.url(),
            "--nats-replicas",
            "3",
        ],
        Duration::from_secs(30),
    );
    assert!(
        status.is_some_and(|s| s.code() == Some(1)),
        "exit {status:?}: {err}"
    );
    assert!(err.contains("not in a JetStream cluster"), "{err}");
}

/// A relay's or consumer's `/metrics` off loopback needs the admin token or
/// `--public-metrics`: refused at start in words about `--metrics-listen`.
#[test]
fn a_side_listener_off_loopback_without_a_token_is_refused() {
    let dir = TempDir::new("side-refused");
    let db = dir.sqlite_url();
    assert!(run(&["migrate", "--database-url", &db]).status.success());
    for command in ["relay", "consume"] {
        let out = run(&[
            command,
            "--database-url",
            &db,
            "--nats-url",
            "nats://127.0.0.1:1",
            "--metrics-listen",
            "0.0.0.0:0",
        ]);
        assert_eq!(out.status.code(), Some(1), "{command}");
        let err = text(&out.stderr);
        assert!(
            err.starts_with("error: --metrics-listen 0.0.0.0:0 is not a loopback address"),
            "{command}: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{command}: {err}");
    }
}
