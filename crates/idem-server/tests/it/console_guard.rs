//! The console and the admin API resist guessing, against the real `idem
//! serve` over real HTTP: wrong tokens lock their source out (console
//! logins, bearer requests and `/metrics` alike; a locked-out attempt is not
//! compared, even with the right token) and the lockout ends; the total is
//! limited too, except for sources that logged in before; every admin and
//! console request must name an allowed host, so a DNS-rebinding page
//! (`Host: evil.example`) gets nowhere; the counts are in `/metrics`.
//!
//! Sources other than 127.0.0.1 are other loopback addresses (127.0.0.2, …),
//! which Linux routes to the server listening on 127.0.0.1.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpSocket;

use crate::Reply;
use crate::fixture::TempDir;
use crate::process::Server;

const TOKEN: &str = "5be2d1f0c94a7e3816d0b9f2a4c57e18";
const WRONG: &str = "0f3c9a71e5d24b86a1c7e9d03b5f2a64";

/// One raw request from source address `from` (a loopback address),
/// `head` being everything between the request line and the blank line.
async fn raw_from(from: Ipv4Addr, addr: SocketAddr, line: &str, head: &str, body: &str) -> Reply {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(IpAddr::V4(from), 0)).unwrap();
    let mut s = socket.connect(addr).await.unwrap();
    let req = format!(
        "{line} HTTP/1.1\r\n{head}Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    Reply::read(&mut s).await
}

fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, last)
}

/// A console login with `token` from `from`.
async fn login(from: Ipv4Addr, addr: SocketAddr, token: &str) -> Reply {
    let head = format!("Host: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\n");
    raw_from(
        from,
        addr,
        "POST /console/login",
        &head,
        &format!("actor=ops&token={token}"),
    )
    .await
}

/// `GET path` with a bearer token from `from`.
async fn bearer(from: Ipv4Addr, addr: SocketAddr, path: &str, token: &str) -> Reply {
    let head = format!("Host: {addr}\r\nAuthorization: Bearer {token}\r\n");
    raw_from(from, addr, &format!("GET {path}"), &head, "").await
}

fn retry_after(r: &Reply) -> u64 {
    r.header("retry-after").unwrap().parse().unwrap()
}

/// The value of `idem_admin_auth_attempts_total{via,result}`, 0 when absent.
fn attempts(metrics: &str, via: &str, result: &str) -> u64 {
    let labels = [format!("result=\"{result}\""), format!("via=\"{via}\"")];
    metrics
        .lines()
        .filter(|l| l.starts_with("idem_admin_auth_attempts_total{"))
        .find(|l| labels.iter().all(|x| l.contains(x.as_str())))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0, |v| v.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_tokens_lock_their_source_out_and_right_ones_are_not_even_compared() {
    let dir = TempDir::new("guess-lockout");
    // A lockout long enough that this test never sees it end.
    let server = Server::start(
        &dir.sqlite_url(),
        &["--admin-token", TOKEN, "--admin-lockout", "1h"],
    )
    .await;
    let a = server.addr;
    let (attacker, operator, other) = (ip(1), ip(2), ip(3));

    // Five wrong logins are refused as usual.
    for i in 0..5 {
        let r = login(attacker, a, WRONG).await;
        assert_eq!(r.status, 401, "wrong login {i}");
    }
    // The sixth attempt is refused without being compared: the right token
    // gets 429 too, as the login page, with Retry-After, and no session.
    let locked = login(attacker, a, TOKEN).await;
    assert_eq!(locked.status, 429);
    assert!(locked.header("set-cookie").is_none());
    assert_eq!(
        locked.header("content-type").as_deref(),
        Some("text/html; charset=utf-8")
    );
    let wait = retry_after(&locked);
    assert!((3000..=3600).contains(&wait), "Retry-After {wait}");
    let page = String::from_utf8_lossy(&locked.body).into_owned();
    assert!(
        page.contains("Too many failed logins") && page.contains("not checked"),
        "{page}"
    );
    assert_eq!(login(attacker, a, WRONG).await.status, 429);
    // The same source's bearer requests, to the admin API and to /metrics,
    // are locked out as well, as problem documents.
    for path in ["/admin/v1/keys", "/metrics"] {
        let r = bearer(attacker, a, path, TOKEN).await;
        assert_eq!(r.status, 429, "{path}");
        assert_eq!(
            r.problem_type(),
            "https://idem.dev/problems/too-many-attempts"
        );
        assert!(retry_after(&r) >= 3000, "{path}");
    }

    // Another source is not locked out; a success forgets its failures
    // (four wrong, one right, four wrong: never locked).
    for round in 0..2 {
        for i in 0..4 {
            assert_eq!(login(other, a, WRONG).await.status, 401, "{round}/{i}");
        }
        assert_eq!(login(other, a, TOKEN).await.status, 303, "{round}");
    }
    assert_eq!(
        bearer(operator, a, "/admin/v1/keys", TOKEN).await.status,
        200
    );

    // The counts, scraped by the operator.
    let m = bearer(operator, a, "/metrics", TOKEN).await;
    assert_eq!(m.status, 200);
    let text = String::from_utf8(m.body).unwrap();
    assert_eq!(attempts(&text, "console", "refused"), 5 + 8, "{text}");
    assert_eq!(attempts(&text, "console", "locked_out"), 2);
    assert_eq!(attempts(&text, "console", "accepted"), 2);
    assert_eq!(attempts(&text, "bearer", "locked_out"), 2);
    assert_eq!(
        attempts(&text, "bearer", "accepted"),
        2,
        "this scrape included"
    );
    assert_eq!(attempts(&text, "bearer", "refused"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lockout_ends_and_the_right_token_works_again() {
    let dir = TempDir::new("guess-release");
    let server = Server::start(
        &dir.sqlite_url(),
        &["--admin-token", TOKEN, "--admin-lockout", "3s"],
    )
    .await;
    let a = server.addr;
    for i in 0..5 {
        let r = bearer(ip(1), a, "/admin/v1/keys", WRONG).await;
        assert_eq!(r.status, 401, "wrong token {i}");
    }
    // From now on the right token is answered 429 (not compared) until
    // the lockout ends, then 200: never 401.
    let mut waits = 0;
    loop {
        let r = bearer(ip(1), a, "/admin/v1/keys", TOKEN).await;
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 429);
        let wait = retry_after(&r);
        assert!((1..=3).contains(&wait), "Retry-After {wait}");
        waits += 1;
        assert!(waits <= 5, "still locked out after {waits} Retry-Afters");
        tokio::time::sleep(Duration::from_secs(wait)).await;
    }
    assert!(
        waits >= 1,
        "the right token was let through during the lockout"
    );
    // And the failures were forgotten: four more wrong ones lock nothing.
    for _ in 0..4 {
        assert_eq!(bearer(ip(1), a, "/admin/v1/keys", WRONG).await.status, 401);
    }
    assert_eq!(bearer(ip(1), a, "/admin/v1/keys", TOKEN).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_sources_guessing_lock_out_everyone_but_the_operators_at_work() {
    let dir = TempDir::new("guess-total");
    let server = Server::start(
        &dir.sqlite_url(),
        &["--admin-token", TOKEN, "--admin-lockout", "1h"],
    )
    .await;
    let a = server.addr;
    // An operator logged in before the attack.
    assert_eq!(login(ip(2), a, TOKEN).await.status, 303);
    // 20 sources, 5 wrong tokens each: 100 failures, the total's limit.
    for source in 10..30 {
        for _ in 0..5 {
            assert_eq!(login(ip(source), a, WRONG).await.status, 401);
        }
    }
    // A source never seen before is locked out, the right token or not.
    let r = login(ip(99), a, TOKEN).await;
    assert_eq!(r.status, 429);
    assert!(retry_after(&r) <= 60);
    assert_eq!(bearer(ip(99), a, "/admin/v1/keys", TOKEN).await.status, 429);
    // The operator goes on.
    assert_eq!(login(ip(2), a, TOKEN).await.status, 303);
    assert_eq!(bearer(ip(2), a, "/admin/v1/keys", TOKEN).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_and_console_requests_must_name_an_allowed_host() {
    let dir = TempDir::new("hosts");
    // The names come from the configuration file's [server] table.
    let file = dir.path().join("idem.toml");
    std::fs::write(
        &file,
        "[server]\nadmin_hosts = \"Admin.Example.Test, ops.example.test:9443\"\n",
    )
    .unwrap();
    let server = Server::start(
        &dir.sqlite_url(),
        &["--admin-token", TOKEN, "--config", file.to_str().unwrap()],
    )
    .await;
    let a = server.addr;
    let port = a.port();
    let get = |path: &'static str, head: String| async move {
        raw_from(ip(1), a, &format!("GET {path}"), &head, "").await
    };
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");

    // A DNS-rebinding page: its host, and its origin equal to its host.
    let evil = format!("evil.example:{port}");
    let rebinding = format!("Host: {evil}\r\nOrigin: http://{evil}\r\n");
    for path in [
        "/admin/v1/keys",
        "/metrics",
        "/console/api/session",
        "/console/login",
    ] {
        let r = get(path, format!("{rebinding}{auth}")).await;
        assert_eq!(r.status, 421, "{path}");
        assert_eq!(
            r.problem_type(),
            "https://idem.dev/problems/host-not-allowed"
        );
    }
    // It cannot log in either, with the right token.
    let form = format!("{rebinding}Content-Type: application/x-www-form-urlencoded\r\n");
    let r = raw_from(
        ip(1),
        a,
        "POST /console/login",
        &form,
        &format!("actor=ops&token={TOKEN}"),
    )
    .await;
    assert_eq!(r.status, 421);
    assert!(r.header("set-cookie").is_none());
    // Nor by an absolute-form target naming it.
    let r = raw_from(
        ip(1),
        a,
        &format!("GET http://{evil}/admin/v1/keys"),
        &format!("Host: {a}\r\n{auth}"),
        "",
    )
    .await;
    assert_eq!(r.status, 421);

    // The hosts this server answers for: IP literals, localhost, the
    // configured names (case-insensitively, any port unless one is given).
    for host in [
        a.to_string(),
        format!("localhost:{port}"),
        format!("LocalHost:{port}"),
        format!("[::1]:{port}"),
        format!("admin.example.test:{port}"),
        "ADMIN.EXAMPLE.TEST".to_owned(),
        "ops.example.test:9443".to_owned(),
    ] {
        let r = get("/admin/v1/keys", format!("Host: {host}\r\n{auth}")).await;
        assert_eq!(r.status, 200, "{host}");
        let origin = format!("Host: {host}\r\nOrigin: http://{host}\r\n{auth}");
        assert_eq!(
            get("/admin/v1/keys", origin).await.status,
            200,
            "{host} + Origin"
        );
    }
    assert_eq!(
        get(
            "/admin/v1/keys",
            format!("Host: ops.example.test:{port}\r\n{auth}")
        )
        .await
        .status,
        421,
        "a name given with a port matches that port only"
    );
    // An allowed host with another site's Origin: 403.
    let cross = format!("Host: localhost:{port}\r\nOrigin: http://evil.example:{port}\r\n{auth}");
    let r = get("/admin/v1/keys", cross).await;
    assert_eq!(r.status, 403);
    assert_eq!(r.problem_type(), "https://idem.dev/problems/foreign-origin");
    // No Host, two, or one that is no host: 400.
    for head in [
        String::new(),
        format!("Host: localhost:{port}\r\nHost: localhost:{port}\r\n"),
        "Host: a b\r\n".to_owned(),
    ] {
        let r = get("/admin/v1/keys", format!("{head}{auth}")).await;
        assert_eq!(r.status, 400, "{head:?}");
        assert_eq!(r.problem_type(), "https://idem.dev/problems/invalid-host");
    }
    // Refusals for the host are no token attempts: the right token still
    // works after many wrong ones sent to a wrong host.
    for _ in 0..10 {
        let wrong = format!("Host: {evil}\r\nAuthorization: Bearer {WRONG}\r\n");
        assert_eq!(get("/admin/v1/keys", wrong).await.status, 421);
    }
    assert_eq!(
        get("/admin/v1/keys", format!("Host: {a}\r\n{auth}"))
            .await
            .status,
        200
    );
    // The rest of the server is not concerned.
    assert_eq!(
        get("/healthz", format!("Host: {evil}\r\n")).await.status,
        200
    );
}

#[test]
fn a_bad_admin_hosts_list_or_lockout_stops_the_start() {
    let dir = TempDir::new("hosts-bad");
    let db = dir.sqlite_url();
    for (flag, value, says) in [
        ("--admin-hosts", "https://admin.example", "--admin-hosts"),
        ("--admin-hosts", "admin.example/console", "--admin-hosts"),
        (
            "--admin-lockout",
            "0s",
            "--admin-lockout must be between 1s and 1h",
        ),
        (
            "--admin-lockout",
            "2h",
            "--admin-lockout must be between 1s and 1h",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .args([
                "serve",
                "--database-url",
                &db,
                "--admin-token",
                TOKEN,
                flag,
                value,
            ])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flag} {value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{flag} {value}: {err}");
    }
    assert!(!dir.path().join("idem.db").exists(), "nothing was opened");
}
