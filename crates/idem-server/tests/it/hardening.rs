//! `idem serve` as a real process under hostile clients: slow headers, slow
//! bodies, too many connections, too many bytes at once; admin routes
//! without, with a wrong and with the right token, and from a foreign
//! origin; what the logs and the error messages look like.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::fixture::TempDir;
use crate::process::{Proc, Server};
use crate::{PAY, Reply, call, create, try_call};

const TOKEN: &str = "7971e2bf2de07fc42b369f8dff01eea0";

/// Sends raw bytes and reads until the server closes; the reply, if one came.
async fn exchange(addr: SocketAddr, raw: &[u8]) -> Option<Reply> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(raw).await.unwrap();
    read_reply(&mut s).await
}

async fn read_reply(s: &mut TcpStream) -> Option<Reply> {
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut raw)).await;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    Some(Reply {
        status: head.get(9..12)?.parse().ok()?,
        head,
        body: raw[split + 4..].to_vec(),
    })
}

/// Waits until the server closes `s` (EOF or reset); how long it took.
async fn closed_within(s: &mut TcpStream, max: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(max.saturating_sub(started.elapsed()), s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

/// `idem migrate` on `url`: the database exists afterwards.
fn migrate(url: &str) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["migrate", "--database-url", url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn get_with(path: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let extra: String = headers
        .iter()
        .map(|(n, v)| format!("{n}: {v}\r\n"))
        .collect();
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{extra}\r\n")
        .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_routes_need_the_token_and_refuse_foreign_origins() {
    let dir = TempDir::new("admin");
    let closed = Server::start(&dir.sqlite_url(), &[]).await;
    let r = call(closed.addr, "GET", "/admin/v1/outbox", None, "").await;
    assert_eq!(r.status, 401);
    assert_eq!(r.problem_type(), "https://idem.dev/problems/admin-disabled");
    // The router is a library: its answer names no flag of the server.
    let detail = r.json()["detail"].as_str().unwrap().to_owned();
    assert!(detail.contains("no admin token is configured"), "{detail}");
    assert!(!detail.contains("--"), "{detail}");
    // Unknown admin paths are guarded alike: nothing is revealed.
    let r = call(closed.addr, "GET", "/admin/no-such-thing", None, "").await;
    assert_eq!(r.status, 401);
    assert_eq!(
        call(closed.addr, "GET", "/healthz", None, "").await.status,
        200
    );
    closed.kill9();

    let dir = TempDir::new("admin-token");
    let server = Server::start(&dir.sqlite_url(), &["--admin-token", TOKEN]).await;
    let a = server.addr;
    let r = exchange(a, &get_with("/admin/v1/outbox", &[]))
        .await
        .unwrap();
    assert_eq!(r.status, 401);
    assert_eq!(r.problem_type(), "https://idem.dev/problems/unauthorized");
    assert!(r.header("www-authenticate").unwrap().starts_with("Bearer"));
    let wrong = format!("Bearer {TOKEN}x");
    let r = exchange(
        a,
        &get_with("/admin/v1/outbox", &[("Authorization", &wrong)]),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 401);
    let right = format!("Bearer {TOKEN}");
    let r = exchange(
        a,
        &get_with("/admin/v1/outbox", &[("Authorization", &right)]),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(r.json()["pending"].is_u64());
    // A web page on another origin cannot use the token's routes, even if
    // it somehow had the token (CSRF, DNS rebinding): refused on Origin.
    let r = exchange(
        a,
        &get_with(
            "/admin/v1/outbox",
            &[("Authorization", &right), ("Origin", "http://evil.example")],
        ),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 403);
    assert_eq!(r.problem_type(), "https://idem.dev/problems/foreign-origin");
    let r = exchange(
        a,
        &get_with(
            "/admin/v1/outbox",
            &[("Authorization", &right), ("Origin", "http://localhost")],
        ),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "the server's own origin is fine");
    // The retired unversioned routes: guarded like the rest, then 410 Gone
    // as problem+json naming the /admin/v1 route that replaces them; they
    // change nothing (no audit row, no key record for the admin tenant).
    for old in idem_server::admin::retired::RETIRED {
        let anon = call(a, old.method, old.path, None, "").await;
        assert_eq!(anon.status, 401, "{}", old.path);
        let req = format!(
            "{} {}?endpoint=github&delivery=x HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
             Authorization: {right}\r\nIdempotency-Key: retired-1\r\nContent-Length: 0\r\n\r\n",
            old.method, old.path
        );
        let r = exchange(a, req.as_bytes()).await.unwrap();
        assert_eq!(r.status, 410, "{}", old.path);
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("application/problem+json")
        );
        assert_eq!(r.problem_type(), "https://idem.dev/problems/route-retired");
        let v = r.json();
        assert_eq!(v["status"], 410);
        assert_eq!(
            v["replacement"],
            format!("{} {}", old.method, old.replacement)
        );
        assert!(v["replacement"].as_str().unwrap().contains(" /admin/v1/"));
        assert!(
            v["detail"].as_str().unwrap().contains(old.replacement),
            "{v}"
        );
        assert_eq!(
            r.header("link"),
            Some(format!("<{}>; rel=\"successor-version\"", old.replacement))
        );
    }
    let audit = exchange(
        a,
        &get_with("/admin/v1/audit", &[("Authorization", &right)]),
    )
    .await
    .unwrap();
    assert_eq!(audit.json()["items"], serde_json::json!([]));
    let keys = exchange(
        a,
        &get_with("/admin/v1/keys?tenant=admin", &[("Authorization", &right)]),
    )
    .await
    .unwrap();
    assert_eq!(keys.json()["items"], serde_json::json!([]));
    // The token never shows up in the logs.
    let mut server = server;
    assert!(!server.proc().log().contains(TOKEN));
}

#[test]
fn off_loopback_without_a_token_or_with_a_weak_one_nothing_starts() {
    let dir = TempDir::new("offloop");
    let db = dir.sqlite_url();
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(args)
            .env_remove("IDEM_ADMIN_TOKEN")
            .output()
            .unwrap()
    };
    for listen in ["0.0.0.0:8080", "0.0.0.0:1", "[::]:8080"] {
        let out = run(&["serve", "--database-url", &db, "--listen", listen]);
        assert!(!out.status.success(), "{listen}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("--listen {listen} is not a loopback address"))
                && err.contains("--admin-token"),
            "{err}"
        );
    }
    let out = run(&["serve", "--database-url", &db, "--admin-token", "short"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("24 to 1024 characters"), "{err}");
    assert!(err.contains("openssl rand -hex 32"), "{err}");
    // Long enough but easy to guess: refused with the command that makes a
    // good one, by flag, by variable and from the file, never quoting it.
    let weak = [
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "passwordpasswordpasswordpassword",
        "0123456789abcdef0123456789abcdef",
    ];
    // A database that cannot open: a weak token let through fails the
    // start anyway, saying something else (rather than serving forever).
    let db = format!("sqlite://{}/no-such-dir/idem.db", dir.path().display());
    for token in weak {
        let file = dir.path().join("weak.toml");
        std::fs::write(&file, format!("[server]\nadmin_token = \"{token}\"\n")).unwrap();
        let by_flag = run(&["serve", "--database-url", &db, "--admin-token", token]);
        let by_file = run(&[
            "serve",
            "--database-url",
            &db,
            "--config",
            file.to_str().unwrap(),
        ]);
        let by_env = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["serve", "--database-url", &db])
            .env("IDEM_ADMIN_TOKEN", token)
            .output()
            .unwrap();
        for (how, out) in [("flag", by_flag), ("file", by_file), ("env", by_env)] {
            assert!(!out.status.success(), "{token} by {how}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("too easy to guess") && err.contains("openssl rand -hex 32"),
                "{token} by {how}: {err}"
            );
            assert!(!err.contains(token), "the token is not quoted: {err}");
        }
    }
    // The 16-character tokens the old rule took are refused too.
    for token in ["aaaaaaaaaaaaaaaa", "passwordpassword"] {
        let out = run(&["serve", "--database-url", &db, "--admin-token", token]);
        assert!(!out.status.success(), "{token}");
    }
    assert!(!dir.path().join("idem.db").exists(), "nothing was opened");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_finish_their_headers_are_closed() {
    let dir = TempDir::new("slowloris");
    let server = Server::start(&dir.sqlite_url(), &["--header-read-timeout", "1s"]).await;
    let mut slow = Vec::new();
    for i in 0..20 {
        let mut s = TcpStream::connect(server.addr).await.unwrap();
        if i % 2 == 0 {
            // Half a head, then nothing.
            s.write_all(b"POST /v1/payments HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .await
                .unwrap();
        }
        slow.push(s);
    }
    // Served meanwhile.
    assert_eq!(
        call(server.addr, "GET", "/healthz", None, "").await.status,
        200
    );
    for s in &mut slow {
        assert!(
            closed_within(s, Duration::from_secs(15)).await.is_some(),
            "a connection without a complete head is closed"
        );
    }
    // A keep-alive connection that finished a request is not cut by the
    // header timeout while idle for less than the idle timeout.
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let r = read_reply(&mut s).await.unwrap();
    assert_eq!(
        r.status, 200,
        "idle keep-alive survives a header timeout's worth of idling"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connections_are_closed() {
    let dir = TempDir::new("idle");
    let server = Server::start(&dir.sqlite_url(), &["--idle-timeout", "1s"]).await;
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    assert!(
        closed_within(&mut s, Duration::from_secs(15))
            .await
            .is_some()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_connection_cap_the_answer_is_503_with_retry_after() {
    let dir = TempDir::new("cap");
    let server = Server::start(&dir.sqlite_url(), &["--max-connections", "4"]).await;
    // Wait for the health probe's connection to be released.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(server.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = exchange(server.addr, &get_with("/healthz", &[]))
        .await
        .unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.problem_type(), "https://idem.dev/problems/server-busy");
    assert_eq!(r.header("retry-after").as_deref(), Some("1"));
    drop(held);
    let mut ok = None;
    for _ in 0..50 {
        let r = exchange(server.addr, &get_with("/healthz", &[]))
            .await
            .unwrap();
        if r.status == 200 {
            ok = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok.is_some(), "served again once connections are released");
}

fn post_head(key: &str, content_length: usize) -> Vec<u8> {
    format!(
        "POST /v1/payments HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Idempotency-Key: {key}\r\nContent-Length: {content_length}\r\n\r\n"
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_does_not_arrive_in_time_is_408_and_uses_up_nothing() {
    let dir = TempDir::new("slowbody");
    let server = Server::start(&dir.sqlite_url(), &["--body-read-timeout", "1s"]).await;
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    s.write_all(&post_head("slow-body", PAY.len()))
        .await
        .unwrap();
    s.write_all(&PAY.as_bytes()[..10]).await.unwrap();
    let r = read_reply(&mut s).await.unwrap();
    assert_eq!(r.status, 408);
    assert_eq!(
        r.problem_type(),
        "https://idem.dev/problems/request-timeout"
    );
    let ok = create(server.addr, "slow-body", PAY).await;
    assert_eq!(
        (ok.status, ok.replayed()),
        (201, false),
        "the key was not used up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_over_the_buffered_bytes_budget_are_503_not_memory() {
    let dir = TempDir::new("budget");
    let server = Server::start(
        &dir.sqlite_url(),
        &[
            "--max-body-bytes",
            "600000",
            "--max-buffered-bytes",
            "1000000",
            "--body-read-timeout",
            "3s",
        ],
    )
    .await;
    // Three uploads of 600 kB, each stalled after 550 kB: the budget holds
    // one of them whole, not a share of each.
    let mut uploads = Vec::new();
    for i in 0..3 {
        let mut s = TcpStream::connect(server.addr).await.unwrap();
        s.write_all(&post_head(&format!("big-{i}"), 600_000))
            .await
            .unwrap();
        let chunk = vec![b' '; 50_000];
        for _ in 0..11 {
            if s.write_all(&chunk).await.is_err() {
                break;
            }
        }
        uploads.push(s);
    }
    let mut statuses = Vec::new();
    for s in &mut uploads {
        let r = read_reply(s).await.unwrap();
        match r.status {
            503 => {
                assert_eq!(r.problem_type(), "https://idem.dev/problems/server-busy");
                assert!(r.header("retry-after").is_some());
            }
            408 => assert_eq!(
                r.problem_type(),
                "https://idem.dev/problems/request-timeout"
            ),
            s => panic!("unexpected {s}"),
        }
        statuses.push(r.status);
    }
    statuses.sort();
    // Each declared length is reserved whole when the route starts reading
    // it, so exactly one fits (and times out, stalled); the other two are
    // refused at once rather than all three failing half-read.
    assert_eq!(
        statuses,
        [408, 503, 503],
        "one upload fits the budget, two are refused"
    );
    // The budget is released with the requests.
    let ok = create(server.addr, "after-budget", PAY).await;
    assert_eq!(ok.status, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_is_problem_json_and_every_request_is_logged() {
    let dir = TempDir::new("logs");
    let mut server = Server::start(&dir.sqlite_url(), &[]).await;
    let a = server.addr;
    let r = call(a, "GET", "/nope", None, "").await;
    assert_eq!(r.status, 404);
    assert_eq!(
        r.header("content-type").as_deref(),
        Some("application/problem+json")
    );
    assert_eq!(r.problem_type(), "https://idem.dev/problems/not-found");
    let r = call(a, "DELETE", "/v1/payments", None, "").await;
    assert_eq!(r.status, 405);
    assert_eq!(
        r.problem_type(),
        "https://idem.dev/problems/method-not-allowed"
    );
    assert!(create(a, "log-1", PAY).await.status == 201);
    assert!(create(a, "log-1", PAY).await.replayed());
    let mut log = String::new();
    for _ in 0..50 {
        log = server.proc().log();
        if log.contains("outcome=replayed") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        log.contains("method=POST route=/v1/payments status=201 outcome=executed"),
        "{log}"
    );
    assert!(log.contains("status=201 outcome=replayed"), "{log}");
    assert!(log.contains("route=unmatched status=404"), "{log}");
    assert!(!log.contains('\u{1b}'), "no colour codes in a file");
    server.kill9();

    // RUST_LOG is honoured.
    let dir = TempDir::new("quiet");
    let mut quiet = Server::start_env(&dir.sqlite_url(), &[], None, &[("RUST_LOG", "warn")]).await;
    assert_eq!(create(quiet.addr, "q-1", PAY).await.status, 201);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !quiet.proc().log().contains("request"),
        "{}",
        quiet.proc().log()
    );
}

#[test]
fn operator_commands_refuse_a_database_that_does_not_exist() {
    let dir = TempDir::new("nodb");
    let url = dir.sqlite_url();
    for args in [
        vec!["stats", "--database-url", &url],
        vec!["gc", "--database-url", &url],
        vec!["webhooks", "list", "--database-url", &url],
        vec![
            "relay",
            "--database-url",
            &url,
            "--nats-url",
            "nats://127.0.0.1:1",
        ],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("no SQLite database at"), "{args:?}: {err}");
    }
    assert!(!dir.path().join("idem.db").exists(), "nothing was created");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["serve", "--database-url", "sqlite://"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("empty SQLite path"));
}

#[test]
fn bad_settings_are_one_line_even_with_backtraces_on() {
    let dir = TempDir::new("oneline");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args([
            "serve",
            "--database-url",
            &dir.sqlite_url(),
            "--key-ttl",
            "0s",
        ])
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.trim_end(),
        "error: --key-ttl must be between 1s and 400d, got 0s",
        "one line, durations as typed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_with_its_broker_unreachable_stops_at_once_and_says_why() {
    let dir = TempDir::new("relay-down");
    migrate(&dir.sqlite_url());
    let port = crate::process::free_port();
    let url = format!("nats://127.0.0.1:{port}");
    let args: Vec<String> = [
        "relay",
        "--database-url",
        &dir.sqlite_url(),
        "--nats-url",
        &url,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut relay = Proc::spawn(&args, None);
    // Let it try and log at least once.
    let mut log = String::new();
    for _ in 0..100 {
        log = relay.log();
        if log.contains("not reachable") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        log.contains(&format!("127.0.0.1:{port}")),
        "names the address: {log}"
    );
    assert!(
        log.to_lowercase().contains("refused"),
        "says the connection is refused: {log}"
    );
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &relay.pid().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    assert!(
        relay.exited_within(Duration::from_secs(3)).await,
        "SIGTERM ends it promptly while the broker is unreachable"
    );
}

/// Health checks stay open when the admin routes are closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_unauthenticated_and_cheap() {
    let dir = TempDir::new("health");
    let server = Server::start(&dir.sqlite_url(), &["--admin-token", TOKEN]).await;
    let r = try_call(server.addr, "GET", "/healthz", None, "")
        .await
        .unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, b"ok".as_slice()));
}

#[test]
fn a_configuration_error_never_prints_a_secret() {
    let dir = TempDir::new("cfg-secret");
    let path = dir.path().join("idem.toml");
    for text in [
        "[webhooks.github]\nscheme = \"github\"\nsecrets = [\"s3cr3t-value-1\", 4242424242]\nforward_to = \"http://127.0.0.1:9/\"\n",
        "[webhooks.github]\nscheme = \"github\"\nsecrets = [\"s3cr3t-value-1\"]\nforward_to = \"http://127.0.0.1:9/\"\nforward_too = \"s3cr3t-value-1\"\n",
    ] {
        std::fs::write(&path, text).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["serve", "--database-url", &dir.sqlite_url(), "--config"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("invalid configuration in") && err.contains("line "),
            "{err}"
        );
        assert!(
            !err.contains("s3cr3t") && !err.contains("4242424242"),
            "{err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_says_when_nats_goes_away_and_when_it_is_back() {
    let dir = TempDir::new("relay-watch");
    let mut nats = idem_testkit::NatsServer::start();
    let db = dir.sqlite_url();
    migrate(&db);
    let args: Vec<String> = ["relay", "--database-url", &db, "--nats-url", &nats.url()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let relay = Proc::spawn(&args, None);
    let wait_for = |needle: &'static str| {
        let relay = &relay;
        async move {
            for _ in 0..200 {
                if relay.log().contains(needle) {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            false
        }
    };
    assert!(
        wait_for("relay publishing the outbox").await,
        "{}",
        relay.log()
    );
    assert!(
        !relay.log().contains("not reachable"),
        "no false alarm on a healthy start: {}",
        relay.log()
    );
    nats.kill();
    assert!(
        wait_for("lost the connection to NATS").await,
        "{}",
        relay.log()
    );
    assert!(
        relay.log().to_lowercase().contains("refused"),
        "{}",
        relay.log()
    );
    nats.restart();
    assert!(wait_for("connected to NATS again").await, "{}", relay.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_axum_cannot_parse_get_problems_too() {
    let dir = TempDir::new("rejections");
    let server = Server::start(&dir.sqlite_url(), &["--admin-token", TOKEN]).await;
    let auth = format!("Bearer {TOKEN}");
    for (path, status) in [
        ("/admin/v1/webhooks/receipts?limit=abc", 400),
        ("/admin/v1/webhooks/receipts?limit=5000", 400),
        ("/admin/v1/webhooks/receipt", 400),
        ("/v1/payments/%FF", 400),
    ] {
        let r = exchange(server.addr, &get_with(path, &[("Authorization", &auth)]))
            .await
            .unwrap();
        assert_eq!(
            r.status,
            status,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("application/problem+json"),
            "{path}"
        );
        assert_eq!(
            r.problem_type(),
            "https://idem.dev/problems/invalid-request",
            "{path}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_never_read_their_answers_lose_their_connection() {
    let dir = TempDir::new("slowread");
    let server = Server::start(
        &dir.sqlite_url(),
        &["--idle-timeout", "2s", "--max-connections", "4"],
    )
    .await;
    for i in 0..300 {
        let body = format!(
            r#"{{"amount":{},"currency":"EUR","customer":"cus_big"}}"#,
            i + 1
        );
        assert_eq!(
            create(server.addr, &format!("big-{i}"), &body).await.status,
            201
        );
    }
    // Four connections (the cap) that pipeline requests for a large answer
    // and never read: the server's writes stall.
    let mut readers = Vec::new();
    for _ in 0..4 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut s = socket.connect(server.addr).await.unwrap();
        let one = "GET /v1/payments?customer=cus_big HTTP/1.1\r\nHost: t\r\n\r\n";
        let _ = s.write_all(one.repeat(100).as_bytes()).await;
        readers.push(s);
    }
    let mut served = false;
    for _ in 0..150 {
        if let Ok(r) = try_call(server.addr, "GET", "/healthz", None, "").await
            && r.status == 200
        {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        served,
        "the stalled connections were closed and their slots freed"
    );
    drop(readers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_log_records_what_the_client_got() {
    let dir = TempDir::new("log408");
    let mut server = Server::start(&dir.sqlite_url(), &["--body-read-timeout", "1s"]).await;
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    s.write_all(&post_head("log-408", PAY.len())).await.unwrap();
    s.write_all(&PAY.as_bytes()[..5]).await.unwrap();
    assert_eq!(read_reply(&mut s).await.unwrap().status, 408);
    let mut log = String::new();
    for _ in 0..50 {
        log = server.proc().log();
        if log.contains("status=408") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(log.contains("route=/v1/payments status=408"), "{log}");
}
