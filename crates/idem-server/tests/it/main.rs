//! Drills against the demo API on real sockets (127.0.0.1:0), on a real SQLite
//! file and a real PostgreSQL database, in-process (`drills`) and as the `idem`
//! binary started, killed with SIGKILL and restarted (`process`).
#![allow(clippy::unwrap_used, missing_docs)]

/// One test per backend: `mod sqlite` and `mod postgres`, each calling
/// `super::NAME(ShopDb, ARGS…)` on a fresh database.
macro_rules! on_both {
    ($($name:ident $(, $arg:expr)*;)*) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(crate::checkout::ShopDb::sqlite().await $(, $arg)*).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(crate::checkout::ShopDb::postgres().await $(, $arg)*).await;
                }
            )*
        }
    };
}

mod admin_api;
mod announced;
mod broker_drills;
mod checkout;
mod checkout_page;
mod cli_help;
mod clock;
mod compensation;
mod console;
mod console_guard;
mod drill_peers;
mod drill_runner;
mod drill_streamed;
mod drill_workers;
mod fakes;
mod fleet;
mod gateway;
mod gateway_paths;
mod gateway_unknown;
mod hardening;
mod history;
mod keepalive;
mod messaging;
mod metric_labels;
mod metrics;
mod numbers;
mod operate;
mod process;
mod provider_libraries;
mod quorum;
mod real_clients;
mod tasks;
mod tasks_history;
mod tasks_restart;
mod webhooks;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub struct Reply {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed").as_deref() == Some("true")
    }
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.split("\r\n").skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    }
    pub fn problem_type(&self) -> String {
        self.json()["type"].as_str().unwrap_or_default().to_owned()
    }
}

/// Runs `idem ARGS` to its end.
pub fn idem_cli(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .output()
        .unwrap()
}

pub fn request(method: &str, path: &str, key: Option<&str>, body: &str) -> String {
    let key = key
        .map(|k| format!("Idempotency-Key: {k}\r\n"))
        .unwrap_or_default();
    format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\n\
         {key}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

pub async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> Reply {
    try_call(addr, method, path, key, body).await.unwrap()
}

/// `POST /v1/payments` with a key.
pub async fn create(addr: SocketAddr, key: &str, body: &str) -> Reply {
    call(addr, "POST", "/v1/payments", Some(key), body).await
}

/// One request on its own connection; an error when the server is gone.
pub async fn try_call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> std::io::Result<Reply> {
    try_exchange(addr, &request(method, path, key, body)).await
}

impl Reply {
    /// The whole answer on `s`, read to the connection's close within 30 s.
    pub async fn read<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> Reply {
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out))
            .await
            .unwrap()
            .unwrap();
        let split = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let head = String::from_utf8_lossy(&out[..split]).into_owned();
        Reply {
            status: head[9..12].parse().unwrap(),
            head,
            body: out[split + 4..].to_vec(),
        }
    }
}

/// A raw request (head and body as written) on its own connection.
pub async fn exchange(addr: SocketAddr, raw_request: &str) -> Reply {
    try_exchange(addr, raw_request).await.unwrap()
}

/// [`exchange`]; an error when the server is gone or the answer is cut.
pub async fn try_exchange(addr: SocketAddr, raw_request: &str) -> std::io::Result<Reply> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(raw_request.as_bytes()).await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    let broken = || std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "incomplete response");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(broken)?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = head
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(broken)?;
    Ok(Reply {
        status,
        head,
        body: raw[split + 4..].to_vec(),
    })
}

pub async fn payments_of(addr: SocketAddr, customer: &str) -> Vec<Value> {
    let r = call(
        addr,
        "GET",
        &format!("/v1/payments?customer={customer}"),
        None,
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    r.json()["data"].as_array().unwrap().clone()
}

/// Polls until `customer` has `n` payments (committed), for at most 10 s.
pub async fn await_payments(addr: SocketAddr, customer: &str, n: usize) -> Vec<Value> {
    for _ in 0..500 {
        let p = payments_of(addr, customer).await;
        if p.len() >= n {
            return p;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{customer} never had {n} payments");
}

pub const PAY: &str = r#"{"amount":1000,"currency":"EUR","customer":"cus_1"}"#;

macro_rules! drills {
    ($modname:ident, $setup:path) => {
        mod $modname {
            use super::*;
            use idem_core::ManualClock;

            async fn setup() -> Fixture {
                $setup(ManualClock::starting_now(), DemoConfig::default()).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn drill1_committed_then_response_lost_retry_gets_stored_response() {
                let f = setup().await;
                let body = r#"{"amount":1000,"currency":"EUR","customer":"cus_lost"}"#;
                // The request is sent; the server commits; the client never reads
                // the answer and goes away.
                let mut s = TcpStream::connect(f.addr).await.unwrap();
                s.write_all(request("POST", "/v1/payments", Some("lost-1"), body).as_bytes())
                    .await
                    .unwrap();
                let committed = await_payments(f.addr, "cus_lost", 1).await;
                drop(s);
                let retry = create(f.addr, "lost-1", body).await;
                assert_eq!(retry.status, 201);
                assert!(retry.replayed(), "the retry gets the stored response");
                assert_eq!(retry.json()["id"], committed[0]["id"]);
                let again = create(f.addr, "lost-1", body).await;
                assert_eq!(again.body, retry.body, "every replay is the same bytes");
                assert_eq!(payments_of(f.addr, "cus_lost").await.len(), 1, "exactly one payment");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn drill2_fifty_concurrent_requests_one_payment() {
                let f = setup().await;
                let body = r#"{"amount":50,"currency":"EUR","customer":"cus_race"}"#;
                let mut tasks = Vec::new();
                for _ in 0..50 {
                    let addr = f.addr;
                    tasks.push(tokio::spawn(async move {
                        create(addr, "race-1", body).await
                    }));
                }
                let mut created = std::collections::HashSet::new();
                let (mut fresh, mut conflicts) = (0, 0);
                for t in tasks {
                    let r = t.await.unwrap();
                    assert!(r.status < 500, "never a 5xx, got {}", r.status);
                    match r.status {
                        201 => {
                            fresh += usize::from(!r.replayed());
                            created.insert(r.body);
                        }
                        409 => {
                            assert_eq!(r.problem_type(), "https://idem.dev/problems/request-in-flight");
                            assert!(r.header("retry-after").is_some());
                            conflicts += 1;
                        }
                        s => panic!("unexpected status {s}"),
                    }
                }
                assert_eq!(fresh, 1, "one execution ({conflicts} in flight)");
                assert_eq!(created.len(), 1, "every 201 is the identical response");
                assert_eq!(payments_of(f.addr, "cus_race").await.len(), 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn drill2_optimistic_fifty_concurrent_requests_one_payment() {
                let config = DemoConfig {
                    claim_mode: idem_core::ClaimMode::Optimistic,
                    ..DemoConfig::default()
                };
                let f = $setup(ManualClock::starting_now(), config).await;
                let body = r#"{"amount":50,"currency":"EUR","customer":"cus_orace"}"#;
                let mut tasks = Vec::new();
                for _ in 0..50 {
                    let addr = f.addr;
                    tasks.push(tokio::spawn(async move {
                        create(addr, "orace-1", body).await
                    }));
                }
                let mut created = std::collections::HashSet::new();
                let (mut fresh, mut replayed) = (0, 0);
                for t in tasks {
                    let r = t.await.unwrap();
                    assert_eq!(r.status, 201, "an optimistic duplicate replays, never waits out: {}", r.status);
                    if r.replayed() { replayed += 1 } else { fresh += 1 }
                    created.insert(r.body);
                }
                assert_eq!((fresh, replayed), (1, 49), "one execution, every other request replays it");
                assert_eq!(created.len(), 1, "every 201 is the identical response");
                assert_eq!(payments_of(f.addr, "cus_orace").await.len(), 1, "the losers' payments rolled back");
                let other = r#"{"amount":51,"currency":"EUR","customer":"cus_orace"}"#;
                assert_eq!(create(f.addr, "orace-1", other).await.status, 422);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn drill3_same_key_other_body_is_422_and_record_unchanged() {
                let f = setup().await;
                let first = create(f.addr, "k-3", PAY).await;
                assert_eq!(first.status, 201);
                let other = r#"{"amount":999,"currency":"EUR","customer":"cus_1"}"#;
                let mismatch = create(f.addr, "k-3", other).await;
                assert_eq!(mismatch.status, 422);
                assert_eq!(mismatch.header("content-type").as_deref(), Some("application/problem+json"));
                assert_eq!(mismatch.problem_type(), "https://idem.dev/problems/idempotency-key-reused");
                let replay = create(f.addr, "k-3", PAY).await;
                assert!(replay.replayed());
                assert_eq!(replay.body, first.body, "the stored record is unchanged");
                assert_eq!(payments_of(f.addr, "cus_1").await.len(), 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn missing_and_malformed_keys_are_400_and_nothing_runs() {
                let f = setup().await;
                let r = call(f.addr, "POST", "/v1/payments", None, PAY).await;
                assert_eq!(r.status, 400);
                assert_eq!(r.problem_type(), "https://idem.dev/problems/missing-idempotency-key");
                let long = "k".repeat(256);
                for bad in ["\"unterminated", long.as_str(), "\"a b\"", "a\"b"] {
                    let r = create(f.addr, bad, PAY).await;
                    assert_eq!(r.status, 400, "{bad:?}");
                    assert_eq!(r.problem_type(), "https://idem.dev/problems/malformed-idempotency-key");
                }
                assert!(payments_of(f.addr, "cus_1").await.is_empty());
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn same_key_in_two_tenants_is_two_payments_and_never_cross_replayed() {
                let f = setup().await;
                let post = |tenant: &'static str| {
                    let addr = f.addr;
                    async move {
                        let mut s = TcpStream::connect(addr).await.unwrap();
                        let req = request("POST", "/v1/payments", Some("shared"), PAY)
                            .replacen("Host: localhost\r\n", &format!("Host: localhost\r\nX-Tenant-Id: {tenant}\r\n"), 1);
                        s.write_all(req.as_bytes()).await.unwrap();
                        let mut raw = Vec::new();
                        s.read_to_end(&mut raw).await.unwrap();
                        String::from_utf8(raw).unwrap()
                    }
                };
                let a = post("alpha").await;
                let b = post("beta").await;
                assert!(a.starts_with("HTTP/1.1 201") && b.starts_with("HTTP/1.1 201"));
                assert!(!b.to_ascii_lowercase().contains("idempotent-replayed"), "no cross-tenant replay");
                assert!(post("alpha").await.to_ascii_lowercase().contains("idempotent-replayed: true"));
                // Each tenant sees only its own payment.
                let list = |tenant: &'static str| {
                    let addr = f.addr;
                    async move {
                        let mut s = TcpStream::connect(addr).await.unwrap();
                        let req = format!("GET /v1/payments?customer=cus_1 HTTP/1.1\r\nHost: t\r\nX-Tenant-Id: {tenant}\r\nConnection: close\r\n\r\n");
                        s.write_all(req.as_bytes()).await.unwrap();
                        let mut raw = String::new();
                        s.read_to_string(&mut raw).await.unwrap();
                        let body = raw.split("\r\n\r\n").nth(1).unwrap().to_owned();
                        serde_json::from_str::<Value>(&body).unwrap()["data"].as_array().unwrap().len()
                    }
                };
                assert_eq!((list("alpha").await, list("beta").await, list("gamma").await), (1, 1, 0));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn drill8_ttl_expiry_gc_and_the_late_retry() {
                let f = setup().await;
                let with_ref = r#"{"amount":1000,"currency":"EUR","customer":"cus_8","reference":"order-8"}"#;
                let no_ref = r#"{"amount":700,"currency":"EUR","customer":"cus_8"}"#;
                let first = create(f.addr, "k-8", with_ref).await;
                assert_eq!(first.status, 201);
                let plain = create(f.addr, "k-8b", no_ref).await;
                assert_eq!(plain.status, 201);
                // Within the TTL: a replay, and GC leaves the records alone.
                f.clock.advance(Duration::from_secs(23 * 3600));
                assert!(create(f.addr, "k-8", with_ref).await.replayed());
                assert_eq!((f.gc)().await, 0);
                // Past the TTL (24 h): GC deletes both key records.
                f.clock.advance(Duration::from_secs(3600 + 1));
                assert_eq!((f.gc)().await, 2, "both expired records collected");
                // The late retry is a new request. With a reference, the business
                // natural key returns the existing payment: 200, same id, no new effect.
                let late = create(f.addr, "k-8", with_ref).await;
                assert_eq!(late.status, 200);
                assert!(!late.replayed(), "not a replay: the key record is gone");
                assert_eq!(late.json()["id"], first.json()["id"]);
                // Without a reference there is no second line of defence: the
                // documented behaviour is a new payment.
                let late_plain = create(f.addr, "k-8b", no_ref).await;
                assert_eq!(late_plain.status, 201);
                assert_ne!(late_plain.json()["id"], plain.json()["id"]);
                assert_eq!(payments_of(f.addr, "cus_8").await.len(), 3);
                // A different payment under a used reference is refused.
                let changed = r#"{"amount":2000,"currency":"EUR","customer":"cus_8","reference":"order-8"}"#;
                let conflict = create(f.addr, "k-other", changed).await;
                assert_eq!(conflict.status, 409);
                assert_eq!(conflict.problem_type(), "https://idem.dev/problems/reference-conflict");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn drill9_replay_after_refund_returns_the_original_body() {
                let f = setup().await;
                let created = create(f.addr, "c-9", PAY).await;
                let id = created.json()["id"].as_str().unwrap().to_owned();
                assert_eq!(created.header("location"), Some(format!("/v1/payments/{id}")));
                let refund = call(f.addr, "POST", &format!("/v1/payments/{id}/refunds"), Some("r-9"), r#"{"amount":300}"#).await;
                assert_eq!(refund.status, 201);
                let now = call(f.addr, "GET", &format!("/v1/payments/{id}"), None, "").await;
                assert_eq!(now.json()["amount_refunded"], 300);
                assert_eq!(now.json()["status"], "partially_refunded");
                let replay = create(f.addr, "c-9", PAY).await;
                assert!(replay.replayed());
                assert_eq!(replay.body, created.body, "the replay is the original response");
                assert_eq!(replay.header("location"), created.header("location"));
                assert_eq!(replay.json()["amount_refunded"], 0);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn over_refund_422_is_stored_and_replayed() {
                let f = setup().await;
                let id = create(f.addr, "c-r", PAY).await.json()["id"]
                    .as_str().unwrap().to_owned();
                let path = format!("/v1/payments/{id}/refunds");
                let first = call(f.addr, "POST", &path, Some("r-big"), r#"{"amount":5000}"#).await;
                assert_eq!(first.status, 422);
                assert_eq!(first.problem_type(), "https://idem.dev/problems/refund-exceeds-payment");
                // Even once the refund would fit (it never will: amounts only
                // shrink), the stored failure is what the key answers.
                let again = call(f.addr, "POST", &path, Some("r-big"), r#"{"amount":5000}"#).await;
                assert_eq!(again.status, 422);
                assert!(again.replayed());
                assert_eq!(again.body, first.body);
                // The same refund key sent to another payment is a mismatch, not a replay.
                let other = create(f.addr, "c-r2", PAY).await.json()["id"]
                    .as_str().unwrap().to_owned();
                let cross = call(f.addr, "POST", &format!("/v1/payments/{other}/refunds"), Some("r-big"), r#"{"amount":5000}"#).await;
                assert_eq!(cross.status, 422);
                assert_eq!(cross.problem_type(), "https://idem.dev/problems/idempotency-key-reused");
                let unknown = call(f.addr, "POST", "/v1/payments/pay_nope/refunds", Some("r-x"), r#"{"amount":1}"#).await;
                assert_eq!(unknown.status, 404);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_refunds_with_different_keys_never_exceed_the_payment() {
                let f = setup().await;
                let id = create(f.addr, "c-race", PAY).await.json()["id"].as_str().unwrap().to_owned();
                let path = format!("/v1/payments/{id}/refunds");
                let mut tasks = Vec::new();
                for i in 0..50 {
                    let (addr, path) = (f.addr, path.clone());
                    tasks.push(tokio::spawn(async move {
                        // A correct client retries a 503 with the same key.
                        loop {
                            let r = call(addr, "POST", &path, Some(&format!("rr-{i}")), r#"{"amount":800}"#).await;
                            if r.status != 503 {
                                return r;
                            }
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }));
                }
                let mut accepted = Vec::new();
                for t in tasks {
                    let r = t.await.unwrap();
                    match r.status {
                        201 => accepted.push(r),
                        422 => assert_eq!(r.problem_type(), "https://idem.dev/problems/refund-exceeds-payment"),
                        s => panic!("unexpected {s}: {}", String::from_utf8_lossy(&r.body)),
                    }
                }
                assert_eq!(accepted.len(), 1, "one refund of 800 fits in a payment of 1000, whatever the keys");
                let payment = call(f.addr, "GET", &format!("/v1/payments/{id}"), None, "").await;
                assert_eq!(payment.json()["amount_refunded"], 800);
                // The accepted refund is where its Location says.
                let location = accepted[0].header("location").unwrap();
                assert!(location.starts_with(&format!("/v1/payments/{id}/refunds/re_")), "{location}");
                let shown = call(f.addr, "GET", &location, None, "").await;
                assert_eq!(shown.status, 200);
                assert_eq!(shown.json(), accepted[0].json());
                // A retry of a refused refund replays the refusal, even after
                // another refund freed nothing.
                let again = call(f.addr, "POST", &path, Some("rr-0"), r#"{"amount":800}"#).await;
                assert!(again.replayed());
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn numbers_that_differ_only_beyond_a_double_are_different_requests() {
                let f = setup().await;
                for (key, first, second) in [
                    ("n-big", "18446744073709551616", "18446744073709551617"),
                    ("n-dec", "0.30000000000000001", "0.3"),
                ] {
                    let body = |n: &str| format!(r#"{{"amount":1000,"currency":"EUR","customer":"cus_n","meta":{n}}}"#);
                    assert_eq!(create(f.addr, key, &body(first)).await.status, 201);
                    let other = create(f.addr, key, &body(second)).await;
                    assert_eq!(other.status, 422, "{first} and {second} are different requests");
                    assert_eq!(other.problem_type(), "https://idem.dev/problems/idempotency-key-reused");
                    // The same number spelled differently is the same request.
                    let spelled = body(first).replace(first, &format!("{first}e0"));
                    assert!(create(f.addr, key, &spelled).await.replayed());
                }
                assert_eq!(payments_of(f.addr, "cus_n").await.len(), 2);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn clients_hanging_up_mid_request_leave_the_store_usable() {
                let f = setup().await;
                let mut hangups = Vec::new();
                for i in 0..800u64 {
                    let addr = f.addr;
                    hangups.push(tokio::spawn(async move {
                        let Ok(mut s) = TcpStream::connect(addr).await else { return };
                        let body = r#"{"amount":1,"currency":"EUR","customer":"cus_hang"}"#;
                        let _ = s.write_all(request("POST", "/v1/payments", Some(&format!("hang-{i}")), body).as_bytes()).await;
                        tokio::time::sleep(Duration::from_micros((i * 7919) % 10_000)).await;
                        // A reset, not a polite close: the server's future is dropped mid-flight.
                        let _ = s.set_zero_linger();
                        drop(s);
                    }));
                }
                for h in hangups {
                    h.await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
                for i in 0..10 {
                    let r = tokio::time::timeout(Duration::from_secs(10), create(f.addr, &format!("after-hang-{i}"), PAY))
                        .await
                        .expect("the store answers after the hang-ups");
                    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
                }
                assert_eq!(payments_of(f.addr, "cus_1").await.len(), 10);
                assert_eq!((f.gc)().await, 0, "GC runs too");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_table_itself_refuses_an_over_refund() {
                let f = setup().await;
                assert_eq!(create(f.addr, "c-check", PAY).await.status, 201);
                let over = f.execute("UPDATE demo_payments SET amount_refunded = amount + 1").await;
                assert!(over.unwrap_err().to_string().to_lowercase().contains("check"), "a CHECK constraint refuses it");
                assert_eq!(f.execute("UPDATE demo_payments SET amount_refunded = amount").await.unwrap(), 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn hostile_inputs_are_client_errors_that_change_nothing() {
                let f = setup().await;
                let id = create(f.addr, "c-h", PAY).await.json()["id"].as_str().unwrap().to_owned();
                let long = "x".repeat(3200);
                let refunds = format!("/v1/payments/{id}/refunds");
                let cases: Vec<(&str, String, Option<&str>, &str, u16, &str)> = vec![
                    ("POST", "/v1/payments".into(), Some("h-1"), r#"{"amount":1,"currency":"EUR","customer":"a\u0000b"}"#, 400, "invalid-request"),
                    ("POST", "/v1/payments".into(), Some("h-2"), r#"{"amount":1,"currency":"EUR","customer":"c","reference":"r\u0000"}"#, 400, "invalid-request"),
                    ("POST", "/v1/payments".into(), Some("h-3"), r#"{"amount":1,"currency":"EUR","customer":"line\nbreak"}"#, 400, "invalid-request"),
                    ("POST", "/v1/payments".into(), Some("h-4"), r#"{"amount":10000000000000,"currency":"EUR","customer":"c"}"#, 400, "invalid-request"),
                    ("GET", "/v1/payments/pay%00x".into(), None, "", 404, "not-found"),
                    ("GET", format!("/v1/payments/{long}"), None, "", 404, "not-found"),
                    ("GET", "/v1/payments?customer=a%00b".into(), None, "", 400, "invalid-request"),
                    ("GET", "/v1/payments?reference=a%00b".into(), None, "", 400, "invalid-request"),
                    ("GET", "/v1/payments?reference=".into(), None, "", 400, "invalid-request"),
                    ("GET", format!("/v1/payments?reference={long}"), None, "", 400, "invalid-request"),
                    ("GET", "/v1/payments?customer=cus_1&reference=r".into(), None, "", 400, "invalid-request"),
                    ("GET", "/v1/payments".into(), None, "", 400, "invalid-request"),
                    ("GET", "/v1/payments/pay%00x/effects".into(), None, "", 404, "not-found"),
                    ("POST", "/v1/payments/pay%00x/refunds".into(), Some("h-5"), r#"{"amount":1}"#, 404, "not-found"),
                    ("POST", refunds.clone(), Some("h-6"), r#"{"amount":10000000000000}"#, 400, "invalid-request"),
                    ("POST", refunds.clone(), Some("h-7"), r#"{"amount":9223372036854775807}"#, 400, "invalid-request"),
                    ("GET", format!("{refunds}/re%00"), None, "", 404, "not-found"),
                ];
                for (method, path, key, body, status, problem) in &cases {
                    let r = call(f.addr, method, path, *key, body).await;
                    assert_eq!(r.status, *status, "{method} {path} {body}: {}", String::from_utf8_lossy(&r.body));
                    assert_eq!(r.problem_type(), format!("https://idem.dev/problems/{problem}"), "{method} {path}");
                }
                // Nothing changed, and no key was used up.
                assert_eq!(payments_of(f.addr, "cus_1").await.len(), 1);
                let payment = call(f.addr, "GET", &format!("/v1/payments/{id}"), None, "").await;
                assert_eq!(payment.json()["amount_refunded"], 0);
                let ok = call(f.addr, "POST", &refunds, Some("h-6"), r#"{"amount":1}"#).await;
                assert_eq!((ok.status, ok.replayed()), (201, false));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_payment_is_found_by_its_reference() {
                let f = setup().await;
                let body = r#"{"amount":700,"currency":"EUR","customer":"cus_ref","reference":"ord_42"}"#;
                let paid = create(f.addr, "ref-1", body).await;
                assert_eq!(paid.status, 201);
                let find = |reference: &'static str| async move {
                    let r = call(f.addr, "GET", &format!("/v1/payments?reference={reference}"), None, "").await;
                    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
                    r.json()["data"].as_array().unwrap().clone()
                };
                let found = find("ord_42").await;
                assert_eq!(found.len(), 1);
                assert_eq!((&found[0]["id"], &found[0]["reference"]), (&paid.json()["id"], &"ord_42".into()));
                assert!(find("ord_43").await.is_empty(), "none for another reference");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn invalid_fields_are_400_and_store_nothing() {
                let f = setup().await;
                for bad in [
                    "{",
                    "[]",
                    r#"{"amount":0,"currency":"EUR","customer":"c"}"#,
                    r#"{"amount":1.5,"currency":"EUR","customer":"c"}"#,
                    r#"{"amount":1,"currency":"eur","customer":"c"}"#,
                    r#"{"amount":1,"currency":"EUR"}"#,
                    r#"{"amount":1,"currency":"EUR","customer":"c","reference":7}"#,
                ] {
                    let r = create(f.addr, "bad-1", bad).await;
                    assert_eq!(r.status, 400, "{bad}");
                    assert_eq!(r.problem_type(), "https://idem.dev/problems/invalid-request");
                }
                // Nothing was stored under the key: a valid request with it executes.
                let ok = create(f.addr, "bad-1", PAY).await;
                assert_eq!(ok.status, 201);
                assert!(!ok.replayed());
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn body_over_the_limit_is_413_and_stores_nothing() {
                let f = $setup(ManualClock::starting_now(), DemoConfig { max_body_bytes: 256, ..DemoConfig::default() }).await;
                let big = format!(r#"{{"amount":1,"currency":"EUR","customer":"cus_1","reference":"{}"}}"#, "r".repeat(300));
                let r = create(f.addr, "big", &big).await;
                assert_eq!(r.status, 413);
                assert_eq!(r.problem_type(), "https://idem.dev/problems/body-too-large");
                let ok = create(f.addr, "big", PAY).await;
                assert_eq!(ok.status, 201, "the key was not used by the rejected request");
                assert!(!ok.replayed());
            }
        }
    };
}

pub use fixture::{DemoConfig, Fixture};

mod fixture {
    use super::*;
    use idem_core::{Engine, ManualClock};
    use idem_server::backend::{Backend, Db, DemoJob};
    use idem_testkit::PgDatabase;
    use std::future::Future;
    use std::pin::Pin;

    pub use idem_server::demo::DemoConfig;

    type Gc = Box<dyn Fn() -> Pin<Box<dyn Future<Output = u64> + Send>> + Send + Sync>;

    impl Fixture {
        /// The address and the SQLite directory (for a fixture from `sqlite`).
        pub fn into_parts(mut self) -> (SocketAddr, TempDir) {
            (self.addr, self._dir.take().expect("an SQLite fixture"))
        }
    }

    /// A demo API on a socket, its clock, and a GC on that clock.
    pub struct Fixture {
        pub addr: SocketAddr,
        pub clock: ManualClock,
        pub gc: Gc,
        /// The database, for checks below the API.
        pub url: String,
        _dir: Option<TempDir>,
        _db: Option<PgDatabase>,
    }

    impl Fixture {
        /// Runs one SQL statement on the fixture's database, directly.
        pub async fn execute(&self, sql: &str) -> Result<u64, sqlx::Error> {
            use sqlx::Connection;
            if self.url.starts_with("sqlite:") {
                let mut c = sqlx::SqliteConnection::connect(&self.url).await?;
                Ok(sqlx::query(sql).execute(&mut c).await?.rows_affected())
            } else {
                let mut c = sqlx::PgConnection::connect(&self.url).await?;
                Ok(sqlx::query(sql).execute(&mut c).await?.rows_affected())
            }
        }
    }

    pub use idem_testkit::TempDir;

    pub async fn serve(router: axum::Router) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        addr
    }

    fn gc_on<S: idem_core::KeyStore>(store: S, clock: ManualClock) -> Gc {
        let engine = Engine::with_clock(store, clock);
        Box::new(move || {
            let engine = engine.clone();
            Box::pin(async move { engine.purge_expired(100, 10).await.unwrap() })
        })
    }

    pub async fn sqlite(clock: ManualClock, config: DemoConfig) -> Fixture {
        let dir = TempDir::new("sqlite");
        let mut f = serve_demo(&dir.sqlite_url(), clock, config).await;
        f._dir = Some(dir);
        f
    }

    /// The demo router and a GC, on the fixture's clock.
    struct Demo {
        clock: ManualClock,
        config: DemoConfig,
    }

    impl DemoJob for Demo {
        type Output = (axum::Router, Gc);
        async fn run<B: Backend + idem_server::demo::Store>(self, store: B) -> Self::Output {
            let router = idem_server::demo::router_with_clock(
                store.clone(),
                &self.config,
                self.clock.clone(),
            );
            (router, gc_on(store, self.clock))
        }
    }

    /// Serves the demo in-process on the database at `url`, migrated.
    pub async fn serve_demo(url: &str, clock: ManualClock, config: DemoConfig) -> Fixture {
        let demo = Demo {
            clock: clock.clone(),
            config,
        };
        let (router, gc) = Db::open(url).await.unwrap().run_demo(demo).await.unwrap();
        Fixture {
            addr: serve(router).await,
            gc,
            clock,
            url: url.to_owned(),
            _dir: None,
            _db: None,
        }
    }

    pub async fn postgres(clock: ManualClock, config: DemoConfig) -> Fixture {
        let db = PgDatabase::create("idem_server").await;
        let mut f = serve_demo(&db.url, clock, config).await;
        f._db = Some(db);
        f
    }
}

drills!(sqlite, fixture::sqlite);
drills!(postgres, fixture::postgres);

/// PostgreSQL goes silent: read routes, claims and a handler stuck mid-
/// statement all answer 503 in bounded time — the handler's after its
/// timeout, without waiting on a rollback the silent connection would never
/// acknowledge — and nothing is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_postgres_gives_every_route_a_bounded_503() {
    use idem_postgres::{PgConfig, PgStore};
    let db = idem_testkit::PgDatabase::create("idem_silent").await;
    let proxy = idem_testkit::Proxy::start(idem_testkit::url_addr(&db.url)).await;
    let url = idem_testkit::url_via(&db.url, proxy.addr);
    let store = PgStore::connect(
        &url,
        // The default deadline (11 s): a rollback awaited after the handler
        // timeout would show as 2 s + 11 s.
        PgConfig {
            acquire_timeout: Duration::from_secs(1),
            ..PgConfig::default()
        },
    )
    .await
    .unwrap();
    idem_server::backend::Backend::migrate_store(&store)
        .await
        .unwrap();
    idem_server::demo::DemoSql::migrate_demo(&store)
        .await
        .unwrap();
    let config = DemoConfig {
        handler_timeout: Duration::from_secs(2),
        read_timeout: Duration::from_secs(2),
        ..DemoConfig::default()
    };
    let addr = fixture::serve(idem_server::demo::router(store.clone(), &config)).await;
    assert_eq!(create(addr, "warm", PAY).await.status, 201);

    // A handler whose INSERT reaches the database, which then goes silent.
    let mid = r#"{"amount":7,"currency":"EUR","customer":"cus_mid"}"#;
    proxy.freeze_after_next(b"cus_mid");
    let started = std::time::Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(30), create(addr, "k-mid", mid))
        .await
        .expect("an answer");
    let took = started.elapsed();
    assert_eq!(r.status, 503);
    assert_eq!(
        r.problem_type(),
        "https://idem.dev/problems/handler-timeout"
    );
    assert!(
        took < Duration::from_secs(8),
        "the handler's timeout, not its timeout plus a rollback: {took:?}"
    );

    // Reads and claims while silent.
    for (method, path, key, body, problem) in [
        (
            "GET",
            "/v1/payments?customer=cus_1",
            None,
            "",
            "store-unavailable",
        ),
        (
            "POST",
            "/v1/payments",
            Some("k-silent"),
            PAY,
            "store-unavailable",
        ),
    ] {
        let r = tokio::time::timeout(Duration::from_secs(30), call(addr, method, path, key, body))
            .await
            .expect("an answer, not a hang");
        assert_eq!(r.status, 503, "{method} {path}");
        assert_eq!(
            r.problem_type(),
            format!("https://idem.dev/problems/{problem}")
        );
    }
    proxy.thaw();
    // Nothing was committed: both keys execute now, once.
    let again = create(addr, "k-mid", mid).await;
    assert_eq!((again.status, again.replayed()), (201, false));
    assert_eq!(payments_of(addr, "cus_mid").await.len(), 1);
    let again = create(addr, "k-silent", PAY).await;
    assert_eq!((again.status, again.replayed()), (201, false));
}
