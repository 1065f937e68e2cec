//! What a peer announces costs what it may be, not what it says (guarantee
//! 16), on every route `idem serve` serves: a `Content-Length` above the
//! route's body limit is answered `413` before anything is reserved for
//! it, and one address holds at most its share of the buffered-bytes
//! budget — declared lengths and chunked bodies alike — so a client from
//! another address keeps getting through. The attackers connect from
//! 127.0.0.2 (the loopback answers all of 127/8); the legitimate clients
//! from 127.0.0.1.

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::checkout::ShopDb;
use crate::gateway::Upstream;
use crate::process::Server;
use crate::webhooks::sign;
use crate::{PAY, Reply};

const TOKEN: &str = "7971e2bf2de07fc42b369f8dff01eea0";
const MIB: usize = 1 << 20;
/// The default `--max-buffered-bytes`.
const BUDGET: usize = 64 * MIB;
const ATTACKER: [u8; 4] = [127, 0, 0, 2];
const CLIENT: [u8; 4] = [127, 0, 0, 1];
const BUFFERED: &str = "idem_http_body_bytes_buffered";

/// A connection to `addr` from the address `from`.
async fn connect_from(from: [u8; 4], addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((from, 0))).unwrap();
    socket.connect(addr).await.unwrap()
}

/// A request head; `length` `None` is a chunked body.
fn head(method: &str, path: &str, headers: &[(&str, &str)], length: Option<usize>) -> Vec<u8> {
    let extra: String = headers
        .iter()
        .map(|(n, v)| format!("{n}: {v}\r\n"))
        .collect();
    let framing = match length {
        Some(n) => format!("Content-Length: {n}"),
        None => "Transfer-Encoding: chunked".to_owned(),
    };
    format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\n{extra}{framing}\r\n\r\n"
    )
    .into_bytes()
}

/// One chunk of a chunked body.
fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

/// The answer on `s`, if a whole one (head, and the body its
/// `Content-Length` says) comes within `wait`.
async fn answer_within(s: &mut TcpStream, wait: Duration) -> Option<Reply> {
    let read = async {
        let mut raw = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            if let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&raw[..split]).into_owned();
                let reply = Reply {
                    status: head.get(9..12)?.parse().ok()?,
                    head,
                    body: raw[split + 4..].to_vec(),
                };
                let length = reply.header("content-length").and_then(|l| l.parse().ok());
                if length.is_some_and(|n: usize| reply.body.len() >= n) {
                    return Some(reply);
                }
            }
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => raw.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(wait, read).await.ok().flatten()
}

/// One request from `from` on its own connection: its answer (20 s at most).
async fn send_from(from: [u8; 4], addr: SocketAddr, head: Vec<u8>, body: &[u8]) -> Option<Reply> {
    let mut s = connect_from(from, addr).await;
    s.write_all(&head).await.ok()?;
    s.write_all(body).await.ok()?;
    answer_within(&mut s, Duration::from_secs(20)).await
}

/// `POST /v1/payments` from 127.0.0.1: its status, and its problem type if any.
async fn pay(addr: SocketAddr, key: &str) -> (u16, String) {
    let h = head(
        "POST",
        "/v1/payments",
        &[("Idempotency-Key", key)],
        Some(PAY.len()),
    );
    match send_from(CLIENT, addr, h, PAY.as_bytes()).await {
        Some(r) => (r.status, problem_of(&r)),
        None => (0, "no answer".into()),
    }
}

fn problem_of(r: &Reply) -> String {
    serde_json::from_slice::<serde_json::Value>(&r.body)
        .ok()
        .and_then(|v| v["type"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// The request body bytes the server holds now, from `/metrics`; `None`
/// when it does not say.
async fn buffered(addr: SocketAddr) -> Option<usize> {
    let h = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let r = send_from(CLIENT, addr, h.to_vec(), b"").await?;
    let text = String::from_utf8_lossy(&r.body).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(BUFFERED)?.trim().parse::<f64>().ok())
        .map(|v| v as usize)
}

/// Waits (10 s at most) until the server holds at least `bytes` of request
/// bodies; whether it did.
async fn await_buffered(addr: SocketAddr, bytes: usize) -> bool {
    for _ in 0..200 {
        if buffered(addr).await.is_some_and(|b| b >= bytes) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// What each attacker's connection was answered within `wait`
/// (`None`: nothing yet, the connection still held).
async fn answers(held: &mut [TcpStream], wait: Duration) -> Vec<Option<u16>> {
    join_all(held.iter_mut().map(|s| async move {
        answer_within(s, wait).await.map(|r| {
            if r.status == 503 || r.status == 413 {
                assert_eq!(
                    r.header("content-type").as_deref(),
                    Some("application/problem+json")
                );
            }
            r.status
        })
    }))
    .await
}

async fn serve(db: &ShopDb, extra: &[&str]) -> Server {
    let mut args = vec!["--admin-token", TOKEN, "--public-metrics"];
    args.extend_from_slice(extra);
    Server::start(&db.url(), &args).await
}

/// A route: name, method, path, headers, body limit.
type Route<'a> = (&'a str, &'a str, &'a str, &'a [(&'a str, &'a str)], usize);

/// For each route: a request declaring the whole default budget, and one
/// declaring a byte over the route's limit.
fn declarations(routes: &[Route<'_>]) -> Vec<(String, Vec<u8>)> {
    routes
        .iter()
        .flat_map(|(name, method, path, headers, limit)| {
            [
                (
                    format!("{name} at 64 MiB"),
                    head(method, path, headers, Some(BUDGET)),
                ),
                (
                    format!("{name} at its limit + 1"),
                    head(method, path, headers, Some(limit + 1)),
                ),
            ]
        })
        .collect()
}

/// (a) A declared length above the route's limit is answered 413 at once,
/// with one byte of its body sent: the whole default budget (64 MiB, over
/// any share: refused before routing) and one byte over the route's own
/// limit (1 MiB on the API's routes, 64 KiB on the admin's, 4 KiB on the
/// console's login: refused by the route, unread). Legitimate POSTs from
/// another address meanwhile get 201.
pub async fn an_announced_body_over_the_routes_limit_is_413_at_once(db: ShopDb) {
    let server = serve(&db, &[]).await;
    let a = server.addr;
    let bearer = format!("Bearer {TOKEN}");
    let key = [("Idempotency-Key", "big-1")];
    let admin = [
        ("Authorization", bearer.as_str()),
        ("Idempotency-Key", "big-2"),
    ];
    let routes: Vec<Route<'_>> = vec![
        ("payments", "POST", "/v1/payments", &key, MIB),
        ("refunds", "POST", "/v1/payments/pay_x/refunds", &key, MIB),
        ("tasks", "POST", "/v1/queues/q1/tasks", &[], MIB),
        ("claims", "POST", "/v1/queues/q1/claims", &key, MIB),
        (
            "observations",
            "POST",
            "/v1/pollers/p1/observations",
            &[],
            MIB,
        ),
        ("admin", "POST", "/admin/v1/keys/release", &admin, 64 << 10),
    ];
    let cases = declarations(&routes);
    let mut held = Vec::new();
    for (_, h) in &cases {
        let mut s = connect_from(ATTACKER, a).await;
        s.write_all(h).await.unwrap();
        s.write_all(b"{").await.unwrap();
        held.push(s);
    }
    // The console's login form: its own page, 413.
    let mut login = connect_from(ATTACKER, a).await;
    login
        .write_all(
            format!(
                "POST /console/login HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
                 Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {MIB}\r\n\r\nt"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let statuses = answers(&mut held, Duration::from_secs(10)).await;
    let login = answer_within(&mut login, Duration::from_secs(10)).await;
    // The attackers' connections stay open while the others pay.
    let mut paid = Vec::new();
    for i in 0..5 {
        paid.push(pay(a, &format!("legit-{i}")).await);
    }
    assert!(
        paid.iter().all(|(s, _)| *s == 201),
        "legitimate POSTs while one connection declared {BUDGET} bytes: {paid:?}"
    );
    for ((name, _), status) in cases.iter().zip(&statuses) {
        assert_eq!(*status, Some(413), "{name}: the oversized declaration");
    }
    // Each 413 is the project's body-too-large problem.
    for (name, h) in &cases {
        let r = send_from(ATTACKER, a, h.clone(), b"{").await.unwrap();
        assert_eq!(
            problem_of(&r),
            "https://idem.dev/problems/body-too-large",
            "{name}"
        );
    }
    assert_eq!(login.map(|r| r.status), Some(413), "the console's login");
    assert_eq!(buffered(a).await, Some(0), "nothing is held for them");
}

/// (b) 80 connections from one address each declare 1 MiB (the payments
/// route's limit) and send nothing more: that address holds its share (an
/// eighth of the budget: 8 of them), the others are refused at once, and
/// a client from another address keeps getting 201.
pub async fn eighty_announced_bodies_from_one_address_leave_the_others_room(db: ShopDb) {
    let server = serve(&db, &[]).await;
    let a = server.addr;
    let mut held = Vec::new();
    for i in 0..80 {
        let mut s = connect_from(ATTACKER, a).await;
        let h = head(
            "POST",
            "/v1/payments",
            &[("Idempotency-Key", &format!("hog-{i}"))],
            Some(MIB),
        );
        s.write_all(&h).await.unwrap();
        held.push(s);
    }
    let share_taken = await_buffered(a, 8 * MIB).await;
    let mut paid = Vec::new();
    for i in 0..10 {
        paid.push(pay(a, &format!("legit-{i}")).await);
    }
    assert!(
        paid.iter().all(|(s, _)| *s == 201),
        "legitimate POSTs while 80 connections from 127.0.0.2 declared 1 MiB each: {paid:?}"
    );
    assert!(share_taken, "the attacker's share was taken");
    let statuses = answers(&mut held, Duration::from_secs(10)).await;
    let refused = statuses.iter().filter(|s| **s == Some(503)).count();
    let waiting = statuses.iter().filter(|s| s.is_none()).count();
    assert_eq!(
        (refused, waiting),
        (72, 8),
        "8 fit the address's share; the rest are refused at once: {statuses:?}"
    );
    assert_eq!(buffered(a).await, Some(8 * MIB));
    drop(held);
    assert!(
        wait_for_zero(a).await,
        "the share comes back with the connections"
    );
}

async fn wait_for_zero(addr: SocketAddr) -> bool {
    for _ in 0..200 {
        if buffered(addr).await == Some(0) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// A payment padded with spaces to `n` bytes (still the same JSON).
fn padded(n: usize) -> Vec<u8> {
    let mut body = PAY.as_bytes().to_vec();
    body.resize(n, b' ');
    body
}

/// (c) Chunked bodies are counted as they arrive, under the same share: 8
/// bodies of 1,000,000 bytes from 127.0.0.2, left unfinished, hold 8 MB of
/// its 8 MiB; a ninth from the same address is cut (503) when it reaches
/// the share, while the same body from 127.0.0.3 goes through.
pub async fn a_chunked_body_is_cut_at_its_addresss_share(db: ShopDb) {
    let server = serve(&db, &[]).await;
    let a = server.addr;
    const SIZE: usize = 1_000_000;
    let body = padded(SIZE);
    let mut held = Vec::new();
    for i in 0..8 {
        let mut s = connect_from(ATTACKER, a).await;
        let h = head(
            "POST",
            "/v1/payments",
            &[("Idempotency-Key", &format!("slow-{i}"))],
            None,
        );
        s.write_all(&h).await.unwrap();
        s.write_all(&chunk(&body)).await.unwrap();
        held.push(s);
    }
    let held_share = await_buffered(a, 8 * SIZE).await;
    // A whole chunked body, sent in 50 kB chunks.
    let chunked = |from: [u8; 4], key: &'static str| {
        let body = body.clone();
        async move {
            let mut s = connect_from(from, a).await;
            s.write_all(&head(
                "POST",
                "/v1/payments",
                &[("Idempotency-Key", key)],
                None,
            ))
            .await
            .unwrap();
            let (mut rd, mut wr) = s.into_split();
            let writer = tokio::spawn(async move {
                for part in body.chunks(50_000) {
                    if wr.write_all(&chunk(part)).await.is_err() {
                        return;
                    }
                }
                let _ = wr.write_all(b"0\r\n\r\n").await;
                let _ = wr.flush().await;
                // Keep the write half open until the answer is read.
                tokio::time::sleep(Duration::from_secs(25)).await;
            });
            let mut raw = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(20), rd.read_to_end(&mut raw)).await;
            writer.abort();
            let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
            let head = String::from_utf8_lossy(&raw[..split]).into_owned();
            Some(Reply {
                status: head.get(9..12)?.parse().ok()?,
                head,
                body: raw[split + 4..].to_vec(),
            })
        }
    };
    let ninth = chunked(ATTACKER, "slow-8").await;
    let other = chunked([127, 0, 0, 3], "other-1").await;
    let (legit, _) = pay(a, "legit-1").await;
    assert_eq!(
        ninth.as_ref().map(|r| (r.status, problem_of(r))),
        Some((503, "https://idem.dev/problems/server-busy".to_owned())),
        "a ninth chunked body from 127.0.0.2 is cut at the address's share"
    );
    assert!(
        held_share,
        "the eight unfinished bodies were counted as they arrived"
    );
    assert_eq!(
        other.map(|r| r.status),
        Some(201),
        "the same body from 127.0.0.3"
    );
    assert_eq!(legit, 201, "a payment from 127.0.0.1");
    let statuses = answers(&mut held, Duration::from_millis(500)).await;
    assert!(
        statuses.iter().all(Option::is_none),
        "the eight within the share are not cut: {statuses:?}"
    );
}

/// (d) The gateway and the webhook routes: an oversized declaration is 413
/// at once (the gateway's keyed and passed-through routes, a webhook
/// endpoint, and one whose own limit is 256 bytes), and 80 connections
/// from one address declaring 1 MiB each leave room for forwards and
/// deliveries from another.
pub async fn the_gateway_and_webhooks_answer_oversized_declarations_and_share_the_budget(
    db: ShopDb,
) {
    let up = Upstream::start().await;
    let dir = idem_testkit::TempDir::new("announced-gw");
    let config = dir.path().join("idem.toml");
    let hooks = format!("{}/hooks", up.url());
    std::fs::write(
        &config,
        format!(
            r#"
[webhooks.github]
scheme = "github"
secrets = ["github-secret"]
forward_to = "{hooks}"

[webhooks.small]
scheme = "github"
secrets = ["github-secret"]
forward_to = "{hooks}"
max_body_bytes = 256
"#
        ),
    )
    .unwrap();
    let config = config.display().to_string();
    let upstream = up.url();
    let server = serve(&db, &["--upstream", &upstream, "--config", &config]).await;
    let a = server.addr;
    let gh = sign::github("github-secret", "d-1", "{}");
    let gh: Vec<(&str, &str)> = gh.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    let key = [("Idempotency-Key", "big-1")];
    let routes: Vec<Route<'_>> = vec![
        ("gateway keyed", "POST", "/v1/payments", &key, MIB),
        ("gateway pass-through", "PUT", "/v1/things/1", &[], MIB),
        ("webhook", "POST", "/webhooks/github", &gh, MIB),
        (
            "webhook with its own 256 bytes",
            "POST",
            "/webhooks/small",
            &gh,
            256,
        ),
    ];
    let cases = declarations(&routes);
    let mut held = Vec::new();
    for (_, h) in &cases {
        let mut s = connect_from(ATTACKER, a).await;
        s.write_all(h).await.unwrap();
        s.write_all(b"{").await.unwrap();
        held.push(s);
    }
    let statuses = answers(&mut held, Duration::from_secs(10)).await;
    // 80 connections from the attacker's address, half at the gateway,
    // half at the webhook route, each declaring 1 MiB.
    let mut hogs = Vec::new();
    for i in 0..80 {
        let mut s = connect_from(ATTACKER, a).await;
        let h = if i % 2 == 0 {
            head(
                "POST",
                "/v1/payments",
                &[("Idempotency-Key", &format!("hog-{i}"))],
                Some(MIB),
            )
        } else {
            head("POST", "/webhooks/github", &gh, Some(MIB))
        };
        s.write_all(&h).await.unwrap();
        hogs.push(s);
    }
    let share_taken = await_buffered(a, 8 * MIB).await;
    let mut forwarded = Vec::new();
    let mut delivered = Vec::new();
    for i in 0..5 {
        let h = head(
            "POST",
            "/v1/payments",
            &[("Idempotency-Key", &format!("legit-{i}"))],
            Some(PAY.len()),
        );
        forwarded.push(
            send_from(CLIENT, a, h, PAY.as_bytes())
                .await
                .map(|r| r.status),
        );
        let body = format!(r#"{{"n":{i}}}"#);
        let signed = sign::github("github-secret", &format!("legit-{i}"), &body);
        let signed: Vec<(&str, &str)> = signed
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let h = head("POST", "/webhooks/github", &signed, Some(body.len()));
        delivered.push(
            send_from(CLIENT, a, h, body.as_bytes())
                .await
                .map(|r| r.status),
        );
    }
    assert!(
        forwarded.iter().all(|s| *s == Some(201)),
        "gateway POSTs from 127.0.0.1 while 127.0.0.2 declared: {forwarded:?}"
    );
    assert!(
        delivered.iter().all(|s| *s == Some(202)),
        "webhook deliveries from 127.0.0.1 while 127.0.0.2 declared: {delivered:?}"
    );
    for ((name, _), status) in cases.iter().zip(&statuses) {
        assert_eq!(*status, Some(413), "{name}: the oversized declaration");
    }
    for (name, h) in &cases {
        let r = send_from(ATTACKER, a, h.clone(), b"{").await.unwrap();
        assert_eq!(
            problem_of(&r),
            "https://idem.dev/problems/body-too-large",
            "{name}"
        );
    }
    assert!(share_taken, "the attacker's share was taken");
    let statuses = answers(&mut hogs, Duration::from_secs(10)).await;
    let refused = statuses.iter().filter(|s| **s == Some(503)).count();
    assert_eq!(refused, 72, "8 fit the address's share: {statuses:?}");
    assert_eq!(
        up.seen_at("/v1/payments").len(),
        5,
        "only the legitimate POSTs were forwarded"
    );
}

on_both! {
    an_announced_body_over_the_routes_limit_is_413_at_once;
    eighty_announced_bodies_from_one_address_leave_the_others_room;
    a_chunked_body_is_cut_at_its_addresss_share;
    the_gateway_and_webhooks_answer_oversized_declarations_and_share_the_budget;
}
