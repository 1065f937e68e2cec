//! The web console: its login, sessions and CSRF check over HTTP, and the
//! console itself in a real Chromium (Debian's `chromium`, driven by
//! `tests/browser/console.mjs` with playwright-core) against the real `idem`
//! binary holding seeded state: a stored response with a hostile body, a dead
//! webhook receipt, a run that needs attention.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::Reply;
use crate::checkout::{ShopDb, World, order_body, set_stock};
use crate::fixture::TempDir;
use crate::process::Server;

const TOKEN: &str = "baf3f055da7d52c2fbc369c71201b3f6";

/// One request with these headers on its own connection.
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let extra: String = headers
        .iter()
        .map(|(n, v)| format!("{n}: {v}\r\n"))
        .collect();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    crate::exchange(addr, &req).await
}

const FORM: (&str, &str) = ("Content-Type", "application/x-www-form-urlencoded");

/// Logs in as `actor`; the cookie pair (`idem_session=…`) and the CSRF token.
async fn login(addr: SocketAddr, actor: &str) -> (String, String) {
    let r = send(
        addr,
        "POST",
        "/console/login",
        &[FORM],
        &format!("actor={actor}&token={TOKEN}"),
    )
    .await;
    assert_eq!(r.status, 303, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("location").as_deref(), Some("/console/"));
    let set = r.header("set-cookie").unwrap();
    let pair = set.split(';').next().unwrap().to_owned();
    let s = send(
        addr,
        "GET",
        "/console/api/session",
        &[("Cookie", &pair)],
        "",
    )
    .await;
    assert_eq!(s.status, 200);
    let csrf = s.json()["csrf"].as_str().unwrap().to_owned();
    (pair, csrf)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_login_sessions_and_csrf() {
    let dir = TempDir::new("console-auth");
    let server = Server::start(&dir.sqlite_url(), &["--admin-token", TOKEN]).await;
    let a = server.addr;
    let html = ("Accept", "text/html,application/xhtml+xml");

    // Anonymous: a page goes to the login page, the API gets a bare 401.
    for path in ["/console", "/console/", "/console/app.js", "/console/nope"] {
        let r = send(a, "GET", path, &[html], "").await;
        assert_eq!(r.status, 303, "{path}");
        assert_eq!(r.header("location").as_deref(), Some("/console/login"));
    }
    for path in ["/console/api/session", "/admin/v1/keys", "/admin/nope"] {
        let r = send(a, "GET", path, &[], "").await;
        assert_eq!(r.status, 401, "{path}");
        assert_eq!(r.problem_type(), "https://idem.dev/problems/unauthorized");
    }
    // The login page and its stylesheet are open, under a strict policy.
    let page = send(a, "GET", "/console/login", &[html], "").await;
    assert_eq!(page.status, 200);
    assert!(
        page.header("content-security-policy")
            .unwrap()
            .starts_with("default-src 'self'")
    );
    assert_eq!(page.header("cache-control").as_deref(), Some("no-store"));
    let body = String::from_utf8(page.body.clone()).unwrap();
    assert!(body.contains("name=\"token\"") && !body.contains("<script"));
    let css = send(a, "GET", "/console/app.css", &[], "").await;
    assert_eq!(css.status, 200);
    assert_eq!(
        css.header("content-type").as_deref(),
        Some("text/css; charset=utf-8")
    );

    // A wrong token: the form again, 401, nothing set.
    let wrong = send(
        a,
        "POST",
        "/console/login",
        &[FORM],
        "actor=ops&token=wrong-token-0123456789",
    )
    .await;
    assert_eq!(wrong.status, 401);
    assert!(wrong.header("set-cookie").is_none());
    assert_eq!(
        wrong.header("content-type").as_deref(),
        Some("text/html; charset=utf-8"),
        "the form again, not a problem document"
    );
    assert!(String::from_utf8_lossy(&wrong.body).contains("the token is not valid"));
    // Bad forms change nothing either.
    let big = format!("actor=ops&token={}", "x".repeat(5000));
    let json = ("Content-Type", "application/json");
    let cases = [
        (FORM, big, 413),
        (FORM, format!("actor=%3Cb%3E&token={TOKEN}"), 400),
        (FORM, format!("actor=a&actor=b&token={TOKEN}"), 400),
        (json, format!("{{\"token\":\"{TOKEN}\"}}"), 415),
    ];
    for (content_type, body, status) in cases {
        let r = send(a, "POST", "/console/login", &[content_type], &body).await;
        assert_eq!(r.status, status, "{body:.40}");
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("text/html; charset=utf-8")
        );
        assert!(r.header("set-cookie").is_none());
    }
    // A login form posted from another site is refused.
    let foreign = send(
        a,
        "POST",
        "/console/login",
        &[FORM, ("Origin", "http://evil.example")],
        &format!("actor=ops&token={TOKEN}"),
    )
    .await;
    assert_eq!(foreign.status, 403);

    // The right token: a session cookie with every attribute.
    let r = send(
        a,
        "POST",
        "/console/login",
        &[FORM],
        &format!("actor=Ada+Ops&token={TOKEN}"),
    )
    .await;
    assert_eq!(r.status, 303);
    let set = r.header("set-cookie").unwrap();
    for attr in ["Secure", "HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set.split("; ").any(|a| a == attr), "{attr} in {set}");
    }
    let pair = set.split(';').next().unwrap().to_owned();
    let id = pair.strip_prefix("idem_session=").unwrap();
    assert_eq!(id.len(), 64, "256 random bits, hex");
    let cookie = ("Cookie", pair.as_str());
    let s = send(a, "GET", "/console/api/session", &[cookie], "").await;
    let csrf = s.json()["csrf"].as_str().unwrap().to_owned();
    assert_eq!(s.json()["actor"], "Ada Ops");
    assert_eq!(csrf.len(), 64);
    assert_ne!(csrf, id);
    // The console's pages and scripts, with the cookie.
    let index = send(a, "GET", "/console/", &[cookie, html], "").await;
    assert_eq!(index.status, 200);
    assert!(String::from_utf8_lossy(&index.body).contains("/console/app.js"));
    let js = send(a, "GET", "/console/app.js", &[cookie], "").await;
    assert_eq!(
        js.header("content-type").as_deref(),
        Some("text/javascript; charset=utf-8")
    );
    assert!(!String::from_utf8_lossy(&js.body).contains("innerHTML"));
    // Reads need no CSRF token; state-changing requests do.
    assert_eq!(
        send(a, "GET", "/admin/v1/outbox", &[cookie], "")
            .await
            .status,
        200
    );
    for csrf_header in [None, Some("wrong"), Some(&csrf[..63])] {
        let mut headers = vec![cookie];
        if let Some(t) = csrf_header {
            headers.push(("X-CSRF-Token", t));
        }
        let r = send(a, "POST", "/console/logout", &headers, "").await;
        assert_eq!(r.status, 403, "{csrf_header:?}");
        assert_eq!(r.problem_type(), "https://idem.dev/problems/csrf");
    }
    // A session id that was never issued, or is malformed, is nobody.
    for forged in [
        "idem_session=0000000000000000000000000000000000000000000000000000000000000000",
        "idem_session=abc",
    ] {
        let r = send(a, "GET", "/console/api/session", &[("Cookie", forged)], "").await;
        assert_eq!(r.status, 401);
    }
    // A bearer token needs no CSRF token and names its actor by header.
    let bearer = format!("Bearer {TOKEN}");
    let auth = ("Authorization", bearer.as_str());
    let s = send(
        a,
        "GET",
        "/console/api/session",
        &[auth, ("X-Idem-Actor", "cli-ops")],
        "",
    )
    .await;
    assert_eq!(
        (s.json()["actor"].as_str(), s.json()["csrf"].is_null()),
        (Some("cli-ops"), true)
    );
    let s = send(
        a,
        "GET",
        "/console/api/session",
        &[auth, ("X-Idem-Actor", "<bad>")],
        "",
    )
    .await;
    assert_eq!(
        s.json()["actor"],
        "admin",
        "an invalid actor name is not used"
    );
    // A wrong bearer token is refused even with a good cookie.
    let r = send(
        a,
        "GET",
        "/console/api/session",
        &[cookie, ("Authorization", "Bearer wrong-token-0123456789")],
        "",
    )
    .await;
    assert_eq!(r.status, 401);

    // Logout (with the CSRF token) ends the session server-side.
    let out = send(
        a,
        "POST",
        "/console/logout",
        &[cookie, ("X-CSRF-Token", &csrf)],
        "",
    )
    .await;
    assert_eq!(out.status, 200);
    assert!(out.header("set-cookie").unwrap().contains("Max-Age=0"));
    let r = send(a, "GET", "/console/api/session", &[cookie], "").await;
    assert_eq!(r.status, 401);
    // Two sessions are independent.
    let (one, _) = login(a, "one").await;
    let (two, two_csrf) = login(a, "two").await;
    let r = send(
        a,
        "POST",
        "/console/logout",
        &[("Cookie", &one), ("X-CSRF-Token", &two_csrf)],
        "",
    )
    .await;
    assert_eq!(r.status, 403, "another session's CSRF token is refused");
    let s = send(a, "GET", "/console/api/session", &[("Cookie", &two)], "").await;
    assert_eq!(s.json()["actor"], "two");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_without_a_token_says_so() {
    let dir = TempDir::new("console-closed");
    let server = Server::start(&dir.sqlite_url(), &[]).await;
    let page = send(server.addr, "GET", "/console/login", &[], "").await;
    assert_eq!(page.status, 200);
    assert!(String::from_utf8_lossy(&page.body).contains("admin token is not configured"));
    let r = send(
        server.addr,
        "POST",
        "/console/login",
        &[FORM],
        "actor=ops&token=anything-at-all-0123",
    )
    .await;
    assert_eq!(r.status, 401);
    assert!(r.header("set-cookie").is_none());
    assert!(String::from_utf8_lossy(&r.body).contains("admin token is not configured"));
    let r = send(server.addr, "GET", "/console/api/session", &[], "").await;
    assert_eq!(r.problem_type(), "https://idem.dev/problems/admin-disabled");
}

/// What the browser test needs, or a panic saying how to get it.
/// Node, Chromium and `tests/browser` (also the checkout page's test).
pub struct Browser {
    pub node: PathBuf,
    pub chromium: PathBuf,
    pub dir: PathBuf,
}

pub fn browser() -> Browser {
    let hint = "run `cargo xtask test` (it installs Debian's chromium and runs `npm ci` in \
                crates/idem-server/tests/browser)";
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    let node = std::env::var_os("IDEM_TEST_NODE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("node"));
    let version = std::process::Command::new(&node).arg("--version").output();
    assert!(
        version.is_ok_and(|o| o.status.success()),
        "node is missing ({}): {hint}",
        node.display()
    );
    assert!(
        dir.join("node_modules/playwright-core/package.json")
            .exists(),
        "the npm packages of {} are missing: {hint}",
        dir.display()
    );
    let chromium = std::env::var_os("IDEM_TEST_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    assert!(
        chromium.exists(),
        "chromium is missing ({}): {hint}",
        chromium.display()
    );
    Browser {
        node,
        chromium,
        dir,
    }
}

/// A webhook upstream that answers 503 until `up` is set, then 201.
async fn flaky_upstream(up: Arc<AtomicBool>) -> SocketAddr {
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move || {
            let up = up.clone();
            async move {
                if up.load(Ordering::SeqCst) {
                    axum::http::StatusCode::CREATED
                } else {
                    axum::http::StatusCode::SERVICE_UNAVAILABLE
                }
            }
        }),
    );
    crate::fixture::serve(app).await
}

async fn admin_get(addr: SocketAddr, path: &str) -> Reply {
    let bearer = format!("Bearer {TOKEN}");
    send(addr, "GET", path, &[("Authorization", &bearer)], "").await
}

/// Polls `path` (bearer) until `pred` holds on its JSON, for at most 30 s.
async fn await_admin(addr: SocketAddr, path: &str, pred: impl Fn(&serde_json::Value) -> bool) {
    for _ in 0..300 {
        let r = admin_get(addr, path).await;
        if r.status == 200 && pred(&r.json()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{path} never reached the expected state");
}

async fn console_in_chromium(db: ShopDb) {
    let browser = browser();
    let up = Arc::new(AtomicBool::new(false));
    let hook = flaky_upstream(up.clone()).await;
    let conf_dir = TempDir::new("console-conf");
    let conf = conf_dir.path().join("idem.toml");
    std::fs::write(
        &conf,
        format!(
            "[webhooks.github]\nscheme = \"github\"\nsecrets = [\"github-secret\"]\n\
             forward_to = \"http://{hook}/hook\"\nforward_timeout_secs = 4\n\
             [worker]\nlease_secs = 5\nmax_attempts = 1\npoll_interval_ms = 50\n"
        ),
    )
    .unwrap();
    let w = World::new(db).await;
    let conf = conf.to_string_lossy().into_owned();
    let shop = w
        .shop(
            &[
                "--mail-delivery",
                "at-most-once",
                "--admin-token",
                TOKEN,
                "--config",
                &conf,
            ],
            None,
        )
        .await;
    let a = shop.addr;

    // A completed key whose stored body is hostile, and some traffic for the
    // overview: fresh requests, replays, a mismatch.
    let hostile = r#"{"amount":1200,"currency":"EUR","customer":"<script>window.__pwned=1</script><img src=x onerror=\"window.__pwned=2\">"}"#;
    let first = crate::create(a, "xss-key-1", hostile).await;
    assert_eq!(first.status, 201);
    for i in 0..12 {
        let body = format!(
            r#"{{"amount":{},"currency":"EUR","customer":"cus_{i}"}}"#,
            100 + i
        );
        assert_eq!(
            crate::create(a, &format!("pay-{i}"), &body).await.status,
            201
        );
        if i % 3 == 0 {
            assert!(
                crate::create(a, &format!("pay-{i}"), &body)
                    .await
                    .replayed()
            );
        }
    }
    assert_eq!(crate::create(a, "pay-1", crate::PAY).await.status, 422);

    // A dead webhook receipt: its upstream answers 503 and one attempt is all.
    let body = r#"{"action":"opened","number":7}"#;
    let headers = crate::webhooks::sign::github("github-secret", "console-1", body);
    let r = crate::webhooks::deliver(a, "github", &headers, body).await;
    assert_eq!(r.status, 202);
    await_admin(a, "/admin/v1/webhooks/receipts?state=dead", |v| {
        v.to_string().contains("console-1")
    })
    .await;
    up.store(true, Ordering::SeqCst);

    // A run that needs attention: an at-most-once confirmation whose answer is lost.
    set_stock(a, "tee", 10).await;
    w.relay.lose_next(1);
    let order = order_body("cus_console", "tee", 1, 900);
    let r = crate::call(a, "POST", "/v1/orders", Some("console-order"), &order).await;
    assert_eq!(
        r.problem_type(),
        "https://idem.dev/problems/needs-attention"
    );

    // A task that needs attention: its notification's outcome is unknown
    // (the first claim's lease ended after it was told to go).
    let made = crate::call(
        a,
        "POST",
        "/v1/queues/mail/tasks",
        Some("console-task"),
        r#"{"payload":{"issue":7,"ref":123456789012345678901234567890}}"#,
    )
    .await;
    let task = made.json()["id"].as_str().unwrap().to_owned();
    let claim = |key: &'static str| {
        crate::call(
            a,
            "POST",
            "/v1/queues/mail/claims",
            Some(key),
            r#"{"worker":"w","lease":"1s"}"#,
        )
    };
    let first = claim("console-c1").await.json()["tasks"][0]["fence"]
        .as_i64()
        .unwrap();
    let notify = format!("/v1/tasks/{task}/actions/notify");
    let go = crate::call(
        a,
        "POST",
        &notify,
        None,
        &format!(r#"{{"fence":{first},"mode":"at-most-once"}}"#),
    )
    .await;
    assert_eq!(go.json()["do"], "go");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let second = claim("console-c2").await.json()["tasks"][0]["fence"]
        .as_i64()
        .unwrap();
    let parked = crate::call(
        a,
        "POST",
        &notify,
        None,
        &format!(r#"{{"fence":{second},"mode":"at-most-once"}}"#),
    )
    .await;
    assert_eq!(parked.json()["task"]["state"], "needs_attention");

    // A forward stuck on a reject route: pending, leased for 10 min.
    idem_server::backend::Db::open(&w.db.url())
        .await
        .unwrap()
        .run(StuckForward)
        .await;

    let shot_dir = TempDir::new("console-shot");
    let screenshot = std::env::var_os("IDEM_CONSOLE_SCREENSHOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| shot_dir.path().join("overview.png"));
    let out = std::process::Command::new(&browser.node)
        .arg("console.mjs")
        .current_dir(&browser.dir)
        .env("IDEM_CONSOLE_URL", format!("http://{a}"))
        .env("IDEM_ADMIN_TOKEN", TOKEN)
        .env("IDEM_TEST_CHROMIUM", &browser.chromium)
        .env("IDEM_CONSOLE_KEY_PREFIX", "xss-")
        .env("IDEM_CONSOLE_STUCK_KEY", "default/gateway.pay/stuck-1")
        .env("IDEM_CONSOLE_SCREENSHOT", &screenshot)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "console.mjs failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for check in [
        "a wrong token is refused with 401",
        "window.__pwned is undefined",
        "the replayed receipt is shown as processed",
        "the resolved run's new state is shown",
        "the task's timeline of claims and actions is shown",
        "the task's payload is shown with every digit",
        "the resolved task is ready again",
        "a POST without the CSRF token gets 403 csrf",
        "a release says a running forward may still land upstream",
        "release waits for the operator's upstream check",
    ] {
        assert!(stdout.contains(&format!("ok - {check}")), "{check}");
    }
    let png = std::fs::read(&screenshot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
        "a real screenshot"
    );

    // What the browser did, seen through the API.
    let r = admin_get(a, "/admin/v1/webhooks/receipts?state=processed").await;
    assert!(
        r.json().to_string().contains("console-1"),
        "the receipt is processed"
    );
    let r = admin_get(a, "/admin/v1/runs?state=needs_attention").await;
    assert_eq!(
        r.json()["items"].as_array().unwrap().len(),
        0,
        "no run needs attention"
    );
    let r = admin_get(a, "/admin/v1/tasks?state=needs_attention").await;
    assert_eq!(
        r.json()["items"],
        serde_json::json!([]),
        "no task needs attention"
    );
    let audit = admin_get(a, "/admin/v1/audit").await.json();
    let actors: Vec<&str> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["actor"].as_str())
        .collect();
    assert!(
        actors.len() >= 2 && actors.iter().all(|a| *a == "ops-browser"),
        "{audit}"
    );
}

/// Claims `default/gateway.pay/stuck-1` with a lease of 10 min, as a
/// gateway forwarding on a `reject` route would.
struct StuckForward;

impl idem_server::backend::Job for StuckForward {
    type Output = ();
    async fn run<B: idem_server::backend::Backend>(self, store: B) {
        use idem_core::leased::{LeaseToken, OnUnknown};
        let scope = idem_core::Scope::new(
            idem_core::Tenant::new("default").unwrap(),
            idem_core::Operation::new("gateway.pay").unwrap(),
            idem_core::IdempotencyKey::new("stuck-1").unwrap(),
        );
        let now = idem_core::Clock::now_ms(&idem_core::SystemClock);
        store
            .claim_leased(
                &scope,
                &idem_core::Fingerprint::from_bytes([3; 32]),
                &idem_core::Policy::default(),
                &LeaseToken::new(),
                now + 600_000,
                OnUnknown::Reject,
                now,
            )
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_chromium_on_sqlite() {
    console_in_chromium(ShopDb::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_chromium_on_postgres() {
    console_in_chromium(ShopDb::postgres().await).await;
}
