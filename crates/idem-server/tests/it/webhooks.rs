//! Webhook ingest over real sockets on both backends: drill 5, every scheme's
//! negative space, order awareness, limits, operator replay, and a worker
//! killed between a forward and its bookkeeping.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, Mac};
use idem_core::webhooks::{ReceiptState, WebhookStore};
use idem_core::{KeyStore, ManualClock, SharedClock};
use idem_server::webhooks;
use idem_webhooks::Receiver;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::fixture::serve;
use crate::process::Server;
use crate::{DemoConfig, Reply, payments_of};

type HmacSha256 = Hmac<sha2::Sha256>;

fn hmac(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = HmacSha256::new_from_slice(key).unwrap();
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().to_vec()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn now_s() -> i64 {
    idem_core::Clock::now_ms(&idem_core::SystemClock) / 1000
}

/// Signers, each following its provider's documented algorithm.
pub mod sign {
    use super::*;
    pub fn github(secret: &str, delivery: &str, body: &str) -> Vec<(String, String)> {
        vec![
            (
                "X-Hub-Signature-256".into(),
                format!(
                    "sha256={}",
                    hex(&hmac(secret.as_bytes(), &[body.as_bytes()]))
                ),
            ),
            ("X-GitHub-Delivery".into(), delivery.into()),
            ("X-GitHub-Hook-ID".into(), "4242".into()),
            ("X-GitHub-Event".into(), "push".into()),
        ]
    }
    pub fn stripe(secret: &str, t: i64, body: &str) -> Vec<(String, String)> {
        let sig = hex(&hmac(
            secret.as_bytes(),
            &[t.to_string().as_bytes(), b".", body.as_bytes()],
        ));
        vec![("Stripe-Signature".into(), format!("t={t},v1={sig}"))]
    }
    pub fn standard(key: &[u8], id: &str, ts: i64, body: &str) -> Vec<(String, String)> {
        let sig = B64.encode(hmac(
            key,
            &[
                id.as_bytes(),
                b".",
                ts.to_string().as_bytes(),
                b".",
                body.as_bytes(),
            ],
        ));
        vec![
            ("webhook-id".into(), id.into()),
            ("webhook-timestamp".into(), ts.to_string()),
            ("webhook-signature".into(), format!("v1,{sig}")),
        ]
    }
    pub fn shopify(secret: &str, id: &str, body: &str) -> Vec<(String, String)> {
        vec![
            (
                "X-Shopify-Hmac-Sha256".into(),
                B64.encode(hmac(secret.as_bytes(), &[body.as_bytes()])),
            ),
            ("X-Shopify-Webhook-Id".into(), id.into()),
        ]
    }
    pub fn slack(secret: &str, ts: i64, body: &str) -> Vec<(String, String)> {
        let sig = hex(&hmac(
            secret.as_bytes(),
            &[b"v0:", ts.to_string().as_bytes(), b":", body.as_bytes()],
        ));
        vec![
            ("X-Slack-Signature".into(), format!("v0={sig}")),
            ("X-Slack-Request-Timestamp".into(), ts.to_string()),
        ]
    }
}

/// `POST /webhooks/{endpoint}` with these headers and this raw body.
pub async fn deliver(
    addr: SocketAddr,
    endpoint: &str,
    headers: &[(String, String)],
    body: &str,
) -> Reply {
    try_deliver(addr, endpoint, headers, body).await.unwrap()
}

/// [`deliver`]; an error when the server is gone or the answer is cut.
pub async fn try_deliver(
    addr: SocketAddr,
    endpoint: &str,
    headers: &[(String, String)],
    body: &str,
) -> std::io::Result<Reply> {
    let extra: String = headers
        .iter()
        .map(|(n, v)| format!("{n}: {v}\r\n"))
        .collect();
    let req = format!(
        "POST /webhooks/{endpoint} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\n\
         {extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    crate::try_exchange(addr, &req).await
}

pub const STANDARD_KEY: &[u8] = b"standard-webhooks-test-key-32byte";

/// A config whose endpoints forward to `upstream` (`http://…/path`), each
/// forward bounded by 4 s (shorter than the 5 s lease).
pub fn config(upstream: &str, extra: &str) -> String {
    let whsec = format!("whsec_{}", B64.encode(STANDARD_KEY));
    let text = format!(
        r#"
        [webhooks.github]
        scheme = "github"
        secrets = ["old-github-secret", "github-secret"]
        forward_to = "{upstream}"
        [webhooks.stripe]
        scheme = "stripe"
        secrets = ["whsec_stripe"]
        forward_to = "{upstream}"
        [webhooks.standard]
        scheme = "standard"
        secrets = ["{whsec}"]
        forward_to = "{upstream}"
        [webhooks.shopify]
        scheme = "shopify"
        secrets = ["shopify-secret"]
        forward_to = "{upstream}"
        [webhooks.slack]
        scheme = "slack"
        secrets = ["slack-secret"]
        forward_to = "{upstream}"
        [webhooks.orders]
        scheme = "github"
        secrets = ["github-secret"]
        forward_to = "{upstream}"
        entity_id = "/order/id"
        entity_version = "/order/version"
        [webhooks.small]
        scheme = "github"
        secrets = ["github-secret"]
        forward_to = "{upstream}"
        max_body_bytes = 256
        [worker]
        lease_secs = 5
        poll_interval_ms = 50
        {extra}
        "#
    );
    text.replace(
        &format!("forward_to = \"{upstream}\""),
        &format!("forward_to = \"{upstream}\"\n        forward_timeout_secs = 4"),
    )
}

/// A payment body the upstream (the demo API, built on Idem's HTTP layer)
/// accepts, tagged so its effects can be counted.
pub fn payment(customer: &str, extra: &str) -> String {
    format!(r#"{{"amount":500,"currency":"EUR","customer":"{customer}"{extra}}}"#)
}

/// The upstream: the demo payments API on an SQLite file of its own.
pub async fn upstream() -> (SocketAddr, idem_testkit::TempDir) {
    let f = crate::fixture::sqlite(ManualClock::starting_now(), DemoConfig::default()).await;
    let (addr, dir) = f.into_parts();
    (addr, dir)
}

pub struct Rig<S: WebhookStore + KeyStore> {
    pub addr: SocketAddr,
    pub store: S,
    pub receiver: Arc<Receiver<S, SharedClock>>,
    pub processor: idem_webhooks::Processor<S, SharedClock>,
    pub upstream: SocketAddr,
    _up: idem_testkit::TempDir,
}

/// The webhook routes of the admin API over `store` (unguarded: the guard
/// has tests of its own), with `receiver`'s counters and the retired routes.
fn admin<S: idem_server::admin::AdminBackend>(
    store: &S,
    receiver: &Arc<Receiver<S, SharedClock>>,
) -> axum::Router {
    use idem_server::admin::{retired, v1};
    v1::router(store.clone(), Default::default())
        .merge(v1::webhooks::stats_routes(receiver.clone()))
        .merge(retired::router())
}

impl<S: idem_server::admin::AdminBackend> Rig<S> {
    pub async fn new(store: S, extra: &str) -> Self {
        let (upstream, up) = upstream().await;
        let config =
            webhooks::parse(&config(&format!("http://{upstream}/v1/payments"), extra)).unwrap();
        let receiver = Arc::new(Receiver::with_clock(
            store.clone(),
            config.endpoints.clone(),
            store.clock(),
        ));
        let router = idem_webhooks::route::router(receiver.clone()).merge(admin(&store, &receiver));
        Self {
            addr: serve(router).await,
            processor: webhooks::processor(store.clone(), store.clock(), &config).unwrap(),
            store,
            receiver,
            upstream,
            _up: up,
        }
    }

    pub async fn count(&self) -> usize {
        self.store
            .list_receipts(None, None, 1000)
            .await
            .unwrap()
            .len()
    }

    pub fn counter(&self, endpoint: &str) -> (u64, u64, u64, u64) {
        let (_, c) = self
            .receiver
            .counters()
            .find(|(n, _)| *n == endpoint)
            .unwrap();
        (
            c.accepted.load(Ordering::Relaxed),
            c.duplicates.load(Ordering::Relaxed),
            c.rejected_signature.load(Ordering::Relaxed),
            c.too_large.load(Ordering::Relaxed),
        )
    }

    pub async fn state(&self, endpoint: &str, delivery: &str) -> ReceiptState {
        self.store
            .get_receipt(endpoint, delivery)
            .await
            .unwrap()
            .unwrap()
            .state
    }
}

/// A raw TCP upstream: a request whose body contains `stall` gets
/// `500` with `Content-Length: 100` and then no body, the socket held open
/// until the client gives up; any other gets `200` at once.
pub struct Stalling {
    pub addr: SocketAddr,
    /// Stalled answers sent (heads without a body).
    pub heads: Arc<AtomicUsize>,
    /// Stalled connections the client closed.
    pub closed: Arc<AtomicUsize>,
}

impl Stalling {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let heads = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicUsize::new(0));
        let (h, c) = (heads.clone(), closed.clone());
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let (heads, closed) = (h.clone(), c.clone());
                tokio::spawn(async move {
                    let mut raw = Vec::new();
                    let mut buf = [0u8; 4096];
                    // The head, then as much body as it announces.
                    let (split, len) = loop {
                        let n = s.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        raw.extend_from_slice(&buf[..n]);
                        if let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
                            let len = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length:"))
                                .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                            break (split + 4, len);
                        }
                    };
                    while raw.len() < split + len {
                        let n = s.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        raw.extend_from_slice(&buf[..n]);
                    }
                    if raw[split..].windows(5).any(|w| w == b"stall") {
                        s.write_all(
                            b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 100\r\n\r\n",
                        )
                        .await
                        .unwrap();
                        heads.fetch_add(1, Ordering::SeqCst);
                        // Never the body; hold the socket until the client leaves.
                        while s.read(&mut buf).await.is_ok_and(|n| n > 0) {}
                        closed.fetch_add(1, Ordering::SeqCst);
                    } else {
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                            .await;
                    }
                });
            }
        });
        Self {
            addr,
            heads,
            closed,
        }
    }
}

macro_rules! webhook_suite {
    ($modname:ident, $store:expr) => {
        mod $modname {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn drill5_same_delivery_three_times_one_effect() {
                let (store, _db) = $store.await;
                let rig = Rig::new(store, "").await;
                let body = payment("cus_d5", "");
                let h = sign::github("github-secret", "d5-guid", &body);
                let statuses: Vec<u16> = {
                    let mut v = Vec::new();
                    for _ in 0..3 {
                        v.push(deliver(rig.addr, "github", &h, &body).await.status);
                    }
                    v
                };
                assert_eq!(statuses, [202, 200, 200]);
                assert_eq!(rig.counter("github"), (1, 2, 0, 0));
                let stats = crate::call(rig.addr, "GET", "/admin/v1/webhooks/stats", None, "").await;
                assert_eq!(stats.status, 200);
                assert_eq!(
                    stats.json()["github"],
                    serde_json::json!({"accepted": 1, "duplicates": 2, "rejected_signature": 0, "too_large": 0})
                );
                assert_eq!(rig.processor.run_once().await.unwrap().processed, 1);
                assert_eq!(rig.processor.run_once().await.unwrap().claimed, 0);
                assert_eq!(payments_of(rig.upstream, "cus_d5").await.len(), 1, "one effect");
                assert_eq!(rig.state("github", "4242:d5-guid").await, ReceiptState::Processed);
                // A late fourth copy, after processing: still a duplicate.
                assert_eq!(deliver(rig.addr, "github", &h, &body).await.status, 200);
                assert_eq!(rig.processor.run_once().await.unwrap().claimed, 0);
                assert_eq!(payments_of(rig.upstream, "cus_d5").await.len(), 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn every_scheme_refuses_forgeries_and_stores_nothing() {
                let (store, _db) = $store.await;
                let rig = Rig::new(store, "").await;
                let now = now_s();
                let body = payment("cus_sig", "");
                let tampered = payment("cus_sig", r#","amount_extra":1"#);
                type Case = (&'static str, Vec<(String, String)>, String);
                let strip = |h: &[(String, String)], name: &str| -> Vec<(String, String)> {
                    h.iter().filter(|(n, _)| !n.eq_ignore_ascii_case(name)).cloned().collect()
                };
                let cases: Vec<(&str, Vec<(String, String)>, Vec<Case>)> = vec![
                    ("github", sign::github("old-github-secret", "g1", &body), vec![
                        ("tampered body", sign::github("github-secret", "g2", &body), tampered.clone()),
                        ("wrong secret", sign::github("nope", "g3", &body), body.clone()),
                        ("empty signature", vec![("X-Hub-Signature-256".into(), "sha256=".into())], body.clone()),
                        ("missing header", strip(&sign::github("github-secret", "g4", &body), "X-Hub-Signature-256"), body.clone()),
                    ]),
                    ("stripe", sign::stripe("whsec_stripe", now, &body), vec![
                        ("tampered body", sign::stripe("whsec_stripe", now, &body), tampered.clone()),
                        ("wrong secret", sign::stripe("whsec_other", now, &body), body.clone()),
                        ("stale timestamp", sign::stripe("whsec_stripe", now - 400, &body), body.clone()),
                        ("future timestamp", sign::stripe("whsec_stripe", now + 400, &body), body.clone()),
                        ("empty signature", vec![("Stripe-Signature".into(), format!("t={now},v1="))], body.clone()),
                        ("missing header", vec![], body.clone()),
                    ]),
                    ("standard", sign::standard(STANDARD_KEY, "msg_1", now, &body), vec![
                        ("tampered body", sign::standard(STANDARD_KEY, "msg_2", now, &body), tampered.clone()),
                        ("wrong secret", sign::standard(b"another-key", "msg_3", now, &body), body.clone()),
                        ("stale timestamp", sign::standard(STANDARD_KEY, "msg_4", now - 400, &body), body.clone()),
                        ("future timestamp", sign::standard(STANDARD_KEY, "msg_5", now + 400, &body), body.clone()),
                        ("empty signature", {
                            let mut h = strip(&sign::standard(STANDARD_KEY, "msg_6", now, &body), "webhook-signature");
                            h.push(("webhook-signature".into(), "v1,".into()));
                            h
                        }, body.clone()),
                        ("missing header", strip(&sign::standard(STANDARD_KEY, "msg_7", now, &body), "webhook-id"), body.clone()),
                    ]),
                    ("shopify", sign::shopify("shopify-secret", "s1", &body), vec![
                        ("tampered body", sign::shopify("shopify-secret", "s2", &body), tampered.clone()),
                        ("wrong secret", sign::shopify("nope", "s3", &body), body.clone()),
                        ("empty signature", vec![("X-Shopify-Hmac-Sha256".into(), String::new())], body.clone()),
                        ("missing header", vec![("X-Shopify-Webhook-Id".into(), "s4".into())], body.clone()),
                    ]),
                    ("slack", sign::slack("slack-secret", now, &body), vec![
                        ("tampered body", sign::slack("slack-secret", now, &body), tampered.clone()),
                        ("wrong secret", sign::slack("nope", now, &body), body.clone()),
                        ("stale timestamp", sign::slack("slack-secret", now - 400, &body), body.clone()),
                        ("future timestamp", sign::slack("slack-secret", now + 400, &body), body.clone()),
                        ("empty signature", {
                            let mut h = strip(&sign::slack("slack-secret", now, &body), "X-Slack-Signature");
                            h.push(("X-Slack-Signature".into(), "v0=".into()));
                            h
                        }, body.clone()),
                        ("missing header", strip(&sign::slack("slack-secret", now, &body), "X-Slack-Request-Timestamp"), body.clone()),
                    ]),
                ];
                for (endpoint, valid, forgeries) in cases {
                    let before = rig.count().await;
                    for (what, headers, b) in &forgeries {
                        let r = deliver(rig.addr, endpoint, headers, b).await;
                        assert_eq!(r.status, 401, "{endpoint}: {what}");
                        assert_eq!(r.problem_type(), "https://idem.dev/problems/invalid-signature", "{endpoint}: {what}");
                        // One generic answer for every forgery: which check failed
                        // (and by how many seconds a timestamp missed) helps a forger.
                        let problem = r.json();
                        assert_eq!(problem.get("detail"), None, "{endpoint}: {what}: no reason in {problem}");
                        assert_eq!(
                            problem.as_object().unwrap().keys().collect::<Vec<_>>(),
                            ["status", "title", "type"],
                            "{endpoint}: {what}"
                        );
                    }
                    assert_eq!(rig.count().await, before, "{endpoint}: nothing stored for a forgery");
                    assert_eq!(rig.counter(endpoint).2, forgeries.len() as u64, "{endpoint}: counted");
                    let ok = deliver(rig.addr, endpoint, &valid, &body).await;
                    assert_eq!(ok.status, 202, "{endpoint}: valid (github signs with the rotated-out secret)");
                    assert_eq!(rig.count().await, before + 1);
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn out_of_order_deliveries_the_older_one_is_stale() {
                let (store, _db) = $store.await;
                let rig = Rig::new(store, "").await;
                // Version n is a payment of n × 100, so the upstream shows which applied.
                let v = |n: u32| {
                    format!(r#"{{"amount":{},"currency":"EUR","customer":"cus_order","order":{{"id":"o-1","version":{n}}}}}"#, n * 100)
                };
                let send = |n: u32| {
                    let body = v(n);
                    let h = sign::github("github-secret", &format!("v{n}"), &body);
                    let addr = rig.addr;
                    async move { deliver(addr, "orders", &h, &body).await.status }
                };
                // Version 2 arrives before version 1.
                assert_eq!((send(2).await, send(1).await), (202, 202));
                let first = rig.processor.run_once().await.unwrap();
                assert_eq!((first.claimed, first.processed), (1, 1), "one entity, one at a time");
                let second = rig.processor.run_once().await.unwrap();
                assert_eq!((second.claimed, second.stale), (1, 1));
                assert_eq!(rig.state("orders", "4242:v1").await, ReceiptState::Stale);
                // A newer version still applies.
                assert_eq!(send(3).await, 202);
                assert_eq!(rig.processor.run_once().await.unwrap().processed, 1);
                let mut amounts: Vec<i64> = payments_of(rig.upstream, "cus_order")
                    .await
                    .iter()
                    .map(|p| p["amount"].as_i64().unwrap())
                    .collect();
                amounts.sort();
                assert_eq!(amounts, [200, 300], "v2 and v3 applied; the stale v1 never forwarded");
                let processed = rig.store.list_receipts(Some("orders"), Some(ReceiptState::Processed), 10).await.unwrap();
                assert_eq!(processed.len(), 2);
            }

            /// Entity ids are compared with every digit: two orders whose
            /// numeric ids differ in the last of 30 digits are two entities,
            /// so the first version of one is not stale after the second
            /// version of the other.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn numeric_entity_ids_keep_every_digit() {
                let (store, _db) = $store.await;
                let rig = Rig::new(store, "").await;
                let send = |id: &str, version: u32| {
                    let body = format!(
                        r#"{{"amount":{},"currency":"EUR","customer":"cus_big","order":{{"id":{id},"version":{version}}}}}"#,
                        version * 100
                    );
                    let h = sign::github("github-secret", &format!("big-{version}"), &body);
                    let addr = rig.addr;
                    async move { deliver(addr, "orders", &h, &body).await.status }
                };
                assert_eq!(send("123456789012345678901234567890", 2).await, 202);
                assert_eq!(send("123456789012345678901234567891", 1).await, 202);
                let mut stale = 0;
                for _ in 0..2 {
                    stale += rig.processor.run_once().await.unwrap().stale;
                }
                assert_eq!(stale, 0, "another order's version is not this one's");
                let mut amounts: Vec<i64> = payments_of(rig.upstream, "cus_big")
                    .await
                    .iter()
                    .map(|p| p["amount"].as_i64().unwrap())
                    .collect();
                amounts.sort();
                assert_eq!(amounts, [100, 200], "both orders' deliveries forwarded");
                let receipt = rig.store.get_receipt("orders", "4242:big-1").await.unwrap().unwrap();
                assert_eq!(
                    receipt.receipt.entity_id.as_deref(),
                    Some("123456789012345678901234567891")
                );
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn rust_handler_runs_once_per_delivery_and_rejects_go_dead() {
                let (store, _db) = $store.await;
                let rig = Rig::new(store.clone(), "").await;
                /// Counts deliveries; a body with "reject" is refused.
                struct Counting(Arc<std::sync::Mutex<Vec<String>>>);
                impl idem_webhooks::WebhookHandler for Counting {
                    fn handle<'a>(&'a self, r: &'a idem_core::webhooks::Receipt)
                        -> idem_core::BoxFuture<'a, Result<(), idem_webhooks::HandlerError>> {
                        Box::pin(async move {
                            if r.receipt.body.windows(6).any(|w| w == b"reject") {
                                return Err(idem_webhooks::HandlerError::Reject("not for us".into()));
                            }
                            self.0.lock().unwrap().push(r.receipt.delivery_id.clone());
                            Ok(())
                        })
                    }
                }
                let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
                let processor = idem_webhooks::Processor::new(store, Default::default())
                    .unwrap()
                    .handler("stripe", Counting(seen.clone()));
                let now = now_s();
                for (id, kind) in [("evt_1", "ok"), ("evt_2", "reject"), ("evt_1", "ok")] {
                    let body = format!(r#"{{"id":"{id}","type":"{kind}"}}"#);
                    deliver(rig.addr, "stripe", &sign::stripe("whsec_stripe", now, &body), &body).await;
                }
                let round = processor.run_once().await.unwrap();
                assert_eq!((round.processed, round.dead), (1, 1));
                assert_eq!(*seen.lock().unwrap(), ["evt_1"], "the duplicate evt_1 never reached the handler");
                let dead = rig.store.get_receipt("stripe", "evt_2").await.unwrap().unwrap();
                assert_eq!(dead.state, ReceiptState::Dead);
                assert!(dead.last_error.unwrap().contains("not for us"));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn webhook_delivery_id_over_255_bytes_is_hashed_accepted_once() {
                let (store, _db) = $store.await;
                let rig = Rig::new(store, "").await;
                // Incompressible, so PostgreSQL cannot shrink it under its btree row limit.
                let long: String = (0..50u32)
                    .map(|i| hex(&<sha2::Sha256 as sha2::Digest>::digest(i.to_be_bytes())))
                    .collect();
                assert_eq!(long.len(), 3200);
                let body = payment("cus_long", "");
                let first = deliver(rig.addr, "github", &sign::github("github-secret", &long, &body), &body).await;
                assert_eq!(first.status, 202, "{}", String::from_utf8_lossy(&first.body));
                let id = first.json()["delivery_id"].as_str().unwrap().to_owned();
                let digest = hex(&<sha2::Sha256 as sha2::Digest>::digest(format!("4242:{long}").as_bytes()));
                assert_eq!(id, format!("sha256:{digest}"), "the id the provider sent, hashed");
                // The same long id with another body: a duplicate by its id.
                let other = payment("cus_long_other", "");
                let again = deliver(rig.addr, "github", &sign::github("github-secret", &long, &other), &other).await;
                assert_eq!((again.status, again.json()["delivery_id"].as_str()), (200, Some(id.as_str())));
                assert_eq!(rig.count().await, 1, "stored once");
                assert_eq!(rig.processor.run_once().await.unwrap().processed, 1);
                assert_eq!(payments_of(rig.upstream, "cus_long").await.len(), 1, "forwarded and applied");
                assert_eq!(payments_of(rig.upstream, "cus_long_other").await.len(), 0);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn webhook_body_fields_with_nul_are_absent_and_stored_without_error() {
                let (store, _db) = $store.await;
                let rig = Rig::new(store, "").await;
                let now = now_s();
                // `\u0000` is JSON for NUL: the raw body is valid JSON, the
                // decoded string holds a control character.
                let stripe = r#"{"id":"evt_\u0000x","type":"charge.\u0000succeeded"}"#;
                let r = deliver(rig.addr, "stripe", &sign::stripe("whsec_stripe", now, stripe), stripe).await;
                assert_eq!(r.status, 202, "{}", String::from_utf8_lossy(&r.body));
                let id = r.json()["delivery_id"].as_str().unwrap().to_owned();
                assert!(id.starts_with(&format!("{now}:sha256:")), "the documented fallback: {id}");
                let stored = rig.store.get_receipt("stripe", &id).await.unwrap().unwrap();
                assert_eq!(stored.receipt.event_type, None, "a type with NUL is absent");
                assert_eq!(stored.receipt.body, stripe.as_bytes(), "the body byte for byte");
                let r = deliver(rig.addr, "stripe", &sign::stripe("whsec_stripe", now, stripe), stripe).await;
                assert_eq!(r.status, 200, "a repeat is a duplicate");

                let slack = r#"{"event_id":"Ev\u0000","event":{"type":"message\u0000"}}"#;
                let r = deliver(rig.addr, "slack", &sign::slack("slack-secret", now, slack), slack).await;
                assert_eq!(r.status, 202, "{}", String::from_utf8_lossy(&r.body));
                let id = r.json()["delivery_id"].as_str().unwrap().to_owned();
                assert!(id.starts_with(&format!("{now}:sha256:")), "the documented fallback: {id}");
                let stored = rig.store.get_receipt("slack", &id).await.unwrap().unwrap();
                assert_eq!(stored.receipt.event_type, None);

                let order = r#"{"amount":100,"currency":"EUR","customer":"cus_nul","order":{"id":"o\u0000","version":1}}"#;
                let r = deliver(rig.addr, "orders", &sign::github("github-secret", "nul-1", order), order).await;
                assert_eq!(r.status, 202, "{}", String::from_utf8_lossy(&r.body));
                let stored = rig.store.get_receipt("orders", "4242:nul-1").await.unwrap().unwrap();
                assert_eq!((stored.receipt.entity_id, stored.receipt.entity_version), (None, None), "no entity");
                assert_eq!(rig.processor.run_once().await.unwrap().claimed, 3, "all three handed to workers");
                assert_eq!(rig.state("orders", "4242:nul-1").await, ReceiptState::Processed);
                assert_eq!(payments_of(rig.upstream, "cus_nul").await.len(), 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn webhook_stalled_upstream_blocks_neither_other_endpoints_nor_other_deliveries() {
                let (store, _db) = $store.await;
                let (upstream, _up) = upstream().await;
                let stalling = Stalling::start().await;
                // `stalled` forwards to the raw upstream (which stalls on bodies
                // marked "stall" and answers others at once), `github` to the
                // demo API; both in one processor, as `idem serve` runs them.
                let text = format!(
                    r#"
                    [webhooks.github]
                    scheme = "github"
                    secrets = ["github-secret"]
                    forward_to = "http://{upstream}/v1/payments"
                    [webhooks.stalled]
                    scheme = "github"
                    secrets = ["github-secret"]
                    forward_to = "http://{}/hook"
                    forward_timeout_secs = 5
                    [worker]
                    lease_secs = 20
                    poll_interval_ms = 50
                    "#,
                    stalling.addr
                );
                let mut config = webhooks::parse(&text).unwrap();
                config.worker.backoff = idem_core::Backoff {
                    initial: Duration::from_millis(200),
                    max: Duration::from_millis(200),
                };
                let receiver = Arc::new(Receiver::with_clock(store.clone(), config.endpoints.clone(), store.clock()));
                let addr = serve(idem_webhooks::route::router(receiver)).await;
                let processor = webhooks::processor(store.clone(), store.clock(), &config).unwrap();
                let worker = tokio::spawn(async move {
                    processor.run(Duration::from_secs(3600), std::future::pending()).await
                });
                let stall = r#"{"stall":true}"#;
                assert_eq!(deliver(addr, "stalled", &sign::github("github-secret", "s-1", stall), stall).await.status, 202);
                crate::messaging::eventually(Duration::from_secs(10), "the upstream sent its 500 head and stalled", || async {
                    stalling.heads.load(Ordering::SeqCst) == 1
                }).await;
                // While that forward is outstanding: the other endpoint's
                // deliveries, and the stalled endpoint's other deliveries.
                for i in 0..3 {
                    let body = payment(&format!("cus_free_{i}"), "");
                    let h = sign::github("github-secret", &format!("free-{i}"), &body);
                    assert_eq!(deliver(addr, "github", &h, &body).await.status, 202);
                }
                for i in 0..2 {
                    let body = format!(r#"{{"quick":{i}}}"#);
                    let h = sign::github("github-secret", &format!("quick-{i}"), &body);
                    assert_eq!(deliver(addr, "stalled", &h, &body).await.status, 202);
                }
                crate::messaging::eventually(Duration::from_secs(15), "the other deliveries are processed", || async {
                    let processed = store.list_receipts(None, Some(ReceiptState::Processed), 100).await.unwrap();
                    processed.len() == 5
                }).await;
                let outstanding = store.get_receipt("stalled", "4242:s-1").await.unwrap().unwrap();
                assert_eq!(
                    (outstanding.state, outstanding.attempts, stalling.closed.load(Ordering::SeqCst)),
                    (ReceiptState::Received, 0, 0),
                    "processed while the stalled forward was still outstanding"
                );
                for i in 0..3 {
                    assert_eq!(payments_of(upstream, &format!("cus_free_{i}")).await.len(), 1);
                }
                // The stalled forward ends with a timeout error and is retried.
                crate::messaging::eventually(Duration::from_secs(20), "the stalled forward timed out", || async {
                    let r = store.get_receipt("stalled", "4242:s-1").await.unwrap().unwrap();
                    r.attempts >= 1
                }).await;
                let failed = store.get_receipt("stalled", "4242:s-1").await.unwrap().unwrap();
                assert!(failed.last_error.as_deref().unwrap().contains("timed out"), "{:?}", failed.last_error);
                assert!(stalling.closed.load(Ordering::SeqCst) >= 1, "the stalled connection was given up");
                crate::messaging::eventually(Duration::from_secs(10), "the stalled delivery is forwarded again", || async {
                    stalling.heads.load(Ordering::SeqCst) >= 2
                }).await;
                worker.abort();
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn webhook_run_outliving_its_lease_is_not_started_twice_and_a_panic_is_a_failed_run() {
                let (store, _db) = $store.await;
                let rig = Rig::new(store.clone(), "").await;
                /// Holds "slow" deliveries until released; panics on "panic".
                struct Slow {
                    runs: Arc<AtomicUsize>,
                    release: Arc<tokio::sync::Notify>,
                }
                impl idem_webhooks::WebhookHandler for Slow {
                    fn handle<'a>(&'a self, r: &'a idem_core::webhooks::Receipt)
                        -> idem_core::BoxFuture<'a, Result<(), idem_webhooks::HandlerError>> {
                        Box::pin(async move {
                            if r.receipt.body.windows(5).any(|w| w == b"panic") {
                                panic!("a handler bug");
                            }
                            self.runs.fetch_add(1, Ordering::SeqCst);
                            self.release.notified().await;
                            Ok(())
                        })
                    }
                }
                let runs = Arc::new(AtomicUsize::new(0));
                let release = Arc::new(tokio::sync::Notify::new());
                let config = idem_webhooks::ProcessorConfig {
                    lease: Duration::from_millis(300),
                    poll_interval: Duration::from_millis(20),
                    ..Default::default()
                };
                let processor = idem_webhooks::Processor::new(store.clone(), config)
                    .unwrap()
                    .handler("stripe", Slow { runs: runs.clone(), release: release.clone() });
                let worker = tokio::spawn(async move {
                    processor.run(Duration::from_secs(3600), std::future::pending()).await
                });
                let now = now_s();
                for body in [r#"{"id":"evt_slow"}"#, r#"{"id":"evt_panic"}"#] {
                    let r = deliver(rig.addr, "stripe", &sign::stripe("whsec_stripe", now, body), body).await;
                    assert_eq!(r.status, 202);
                }
                crate::messaging::eventually(Duration::from_secs(10), "the slow run started", || async {
                    runs.load(Ordering::SeqCst) == 1
                }).await;
                crate::messaging::eventually(Duration::from_secs(10), "the panic is recorded as a failed run", || async {
                    let r = store.get_receipt("stripe", "evt_panic").await.unwrap().unwrap();
                    r.state == ReceiptState::Failed && r.last_error.as_deref() == Some("the handler panicked")
                }).await;
                // Well past the lease: the loop claims the slow receipt again
                // while it still runs, and must not start it a second time.
                tokio::time::sleep(Duration::from_millis(1000)).await;
                assert_eq!(runs.load(Ordering::SeqCst), 1, "one run at a time in this process");
                release.notify_one();
                crate::messaging::eventually(Duration::from_secs(10), "the slow run is recorded", || async {
                    rig.state("stripe", "evt_slow").await == ReceiptState::Processed
                }).await;
                assert_eq!(runs.load(Ordering::SeqCst), 1);
                worker.abort();
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn webhook_captured_delivery_resent_under_new_ids_is_forwarded_once() {
                let (store, _db) = $store.await;
                let rig = Rig::new(store, "").await;
                // GitHub and Shopify do not sign the delivery id, and have no
                // signed timestamp: whoever captured one delivery can resend it
                // under any id.
                let gh = payment("cus_resend_gh", "");
                let shop = payment("cus_resend_shop", "");
                assert_eq!(deliver(rig.addr, "github", &sign::github("github-secret", "orig", &gh), &gh).await.status, 202);
                assert_eq!(deliver(rig.addr, "shopify", &sign::shopify("shopify-secret", "orig", &shop), &shop).await.status, 202);
                for i in 0..5 {
                    let id = format!("resent-{i}");
                    let r = deliver(rig.addr, "github", &sign::github("github-secret", &id, &gh), &gh).await;
                    assert_eq!((r.status, r.json()["status"].as_str()), (200, Some("duplicate")), "github resend {i}");
                    let r = deliver(rig.addr, "shopify", &sign::shopify("shopify-secret", &id, &shop), &shop).await;
                    assert_eq!((r.status, r.json()["status"].as_str()), (200, Some("duplicate")), "shopify resend {i}");
                }
                assert_eq!(rig.count().await, 2, "one receipt each");
                assert_eq!(rig.counter("github"), (1, 5, 0, 0));
                assert_eq!(rig.processor.run_once().await.unwrap().processed, 2);
                assert_eq!(rig.processor.run_once().await.unwrap().claimed, 0);
                assert_eq!(payments_of(rig.upstream, "cus_resend_gh").await.len(), 1, "one forward, one effect");
                assert_eq!(payments_of(rig.upstream, "cus_resend_shop").await.len(), 1);
                // Stripe signs the event id (in the body) with a timestamp: two
                // events may share a body only if they share an id, so no content dedupe.
                let now = now_s();
                let a = r#"{"id":"evt_same_body","type":"t"}"#;
                assert_eq!(deliver(rig.addr, "stripe", &sign::stripe("whsec_stripe", now, a), a).await.status, 202);
                assert_eq!(deliver(rig.addr, "stripe", &sign::stripe("whsec_stripe", now - 1, a), a).await.status, 200);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn webhook_signature_headers_are_neither_stored_nor_shown() {
                let (store, _db) = $store.await;
                let rig = Rig::new(store.clone(), "").await;
                let now = now_s();
                let body = payment("cus_sig_hdr", "");
                let mut github = sign::github("github-secret", "h1", &body);
                github.push(("X-Hub-Signature".into(), "sha1=0123456789abcdef0123456789abcdef01234567".into()));
                let deliveries: Vec<(&str, Vec<(String, String)>)> = vec![
                    ("github", github),
                    ("stripe", sign::stripe("whsec_stripe", now, &body)),
                    ("standard", sign::standard(STANDARD_KEY, "msg_h1", now, &body)),
                    ("shopify", sign::shopify("shopify-secret", "h1", &body)),
                    ("slack", sign::slack("slack-secret", now, &body)),
                ];
                let signature_headers = ["x-hub-signature", "x-hub-signature-256", "stripe-signature",
                    "webhook-signature", "x-shopify-hmac-sha256", "x-slack-signature"];
                for (endpoint, headers) in &deliveries {
                    let mut headers = headers.clone();
                    headers.push(("Authorization".into(), "Bearer t".into()));
                    assert_eq!(deliver(rig.addr, endpoint, &headers, &body).await.status, 202, "{endpoint}");
                }
                let stored = store.list_receipts(None, None, 100).await.unwrap();
                assert_eq!(stored.len(), 5);
                for r in &stored {
                    let names: Vec<&str> = r.receipt.headers.iter().map(|(n, _)| n.as_str()).collect();
                    assert!(names.contains(&"content-type"), "{names:?}");
                    for h in signature_headers.iter().chain(&["authorization"]) {
                        assert!(!names.contains(h), "{}: {h} stored", r.receipt.endpoint);
                    }
                }
                // A receipt stored before signatures were filtered out: the
                // admin view and `idem webhooks show` leave them out on output.
                let old = idem_core::webhooks::NewReceipt {
                    endpoint: "github".into(),
                    delivery_id: "4242:old".into(),
                    event_type: Some("push".into()),
                    headers: vec![
                        ("content-type".into(), "application/json".into()),
                        ("x-hub-signature-256".into(), "sha256=00".into()),
                        ("X-Hub-Signature".into(), "sha1=00".into()),
                        ("stripe-signature".into(), "t=1,v1=00".into()),
                    ],
                    body: b"{}".to_vec(),
                    entity_id: None,
                    entity_version: None,
                    content_sha256: None,
                };
                store.accept(&old, now * 1000, now * 1000 + 60_000).await.unwrap();
                let shown = crate::call(rig.addr, "GET", "/admin/v1/webhooks/receipt?endpoint=github&delivery_id=4242%3Aold", None, "").await;
                assert_eq!(shown.status, 200);
                assert_eq!(shown.json()["headers"], serde_json::json!([["content-type", "application/json"]]));
                let shown = crate::call(rig.addr, "GET", "/admin/v1/webhooks/receipt?endpoint=github&delivery_id=4242%3Ah1", None, "").await;
                let text = String::from_utf8_lossy(&shown.body).to_ascii_lowercase();
                assert!(!text.contains("signature"), "{text}");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn oversized_body_is_413_and_unknown_endpoint_404() {
                let (store, _db) = $store.await;
                let rig = Rig::new(store, "").await;
                let big = payment("cus_big", &format!(r#","pad":"{}""#, "x".repeat(300)));
                let r = deliver(rig.addr, "small", &sign::github("github-secret", "big", &big), &big).await;
                assert_eq!(r.status, 413);
                assert_eq!(r.problem_type(), "https://idem.dev/problems/body-too-large");
                assert_eq!(rig.counter("small"), (0, 0, 0, 1));
                let r = deliver(rig.addr, "nowhere", &[], "{}").await;
                assert_eq!(r.status, 404);
                assert_eq!(rig.count().await, 0, "nothing stored");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn operator_replay_reruns_dead_and_leaves_processed_alone() {
                let (store, _db) = $store.await;
                // An upstream that is down until it is not.
                let up = Arc::new(AtomicBool::new(false));
                let flag = up.clone();
                let app = axum::Router::new().route("/hook", axum::routing::post(move || {
                    let flag = flag.clone();
                    async move {
                        if flag.load(Ordering::SeqCst) { axum::http::StatusCode::CREATED } else { axum::http::StatusCode::SERVICE_UNAVAILABLE }
                    }
                }));
                let flaky = serve(app).await;
                let text = config(&format!("http://{flaky}/hook"), "max_attempts = 2");
                let mut config = webhooks::parse(&text).unwrap();
                config.worker.backoff = idem_core::Backoff {
                    initial: Duration::from_millis(20),
                    max: Duration::from_millis(20),
                };
                let receiver = Arc::new(Receiver::with_clock(store.clone(), config.endpoints.clone(), store.clock()));
                let addr = serve(idem_webhooks::route::router(receiver.clone()).merge(admin(&store, &receiver))).await;
                let processor = webhooks::processor(store.clone(), store.clock(), &config).unwrap();
                let body = payment("cus_r", "");
                assert_eq!(deliver(addr, "github", &sign::github("github-secret", "r1", &body), &body).await.status, 202);
                assert_eq!(processor.run_once().await.unwrap().retried, 1);
                let id = "4242:r1";
                let r = store.get_receipt("github", id).await.unwrap().unwrap();
                assert_eq!((r.state, r.attempts), (ReceiptState::Failed, 1));
                assert!(r.last_error.unwrap().contains("503"));
                tokio::time::sleep(Duration::from_millis(50)).await;
                let round = processor.run_once().await.unwrap();
                assert_eq!(round.dead, 1, "the second failure is the last");
                let replay = |key: &'static str, delivery: &'static str| async move {
                    let body = serde_json::json!({"endpoint": "github", "delivery_id": delivery}).to_string();
                    crate::call(addr, "POST", "/admin/v1/webhooks/replay", Some(key), &body).await
                };
                let show = |delivery: &'static str| async move {
                    let r = crate::call(addr, "GET", &format!("/admin/v1/webhooks/receipt?endpoint=github&delivery_id={delivery}"), None, "").await;
                    assert_eq!(r.status, 200, "{delivery}");
                    let v = r.json();
                    (v["state"].as_str().unwrap().to_owned(), v["attempts"].as_u64().unwrap(), v["finished_at"].is_string())
                };
                assert_eq!(show("4242%3Ar1").await, ("dead".into(), 2, true), "two runs; dead is finished");
                up.store(true, Ordering::SeqCst);
                // The retired replay route answers 410 naming its
                // replacement, and replays nothing.
                let gone = crate::call(addr, "POST", "/admin/webhooks/replay?endpoint=github&delivery=4242%3Ar1", Some("old-replay"), "").await;
                assert_eq!(gone.status, 410);
                assert_eq!(gone.header("content-type").as_deref(), Some("application/problem+json"));
                assert_eq!(gone.problem_type(), "https://idem.dev/problems/route-retired");
                assert_eq!(gone.json()["replacement"], "POST /admin/v1/webhooks/replay");
                assert!(gone.json()["detail"].as_str().unwrap().contains("delivery_id"), "{:?}", gone.json());
                assert_eq!(show("4242%3Ar1").await, ("dead".into(), 2, true), "the retired route changed nothing");
                assert_eq!(processor.run_once().await.unwrap().claimed, 0, "nothing was requeued");
                // The form the upstream saw in Idempotency-Key works too.
                let r = replay("replay-1", "github:4242:r1").await;
                assert_eq!(r.status, 202, "{:?}", r.json());
                assert_eq!((r.json()["result"].as_str(), r.json()["delivery_id"].as_str()), (Some("requeued"), Some("4242:r1")));
                assert_eq!(show("github%3A4242%3Ar1").await, ("received".into(), 0, false), "a replay starts afresh");
                assert_eq!(processor.run_once().await.unwrap().processed, 1);
                assert_eq!(show("4242%3Ar1").await, ("processed".into(), 1, true), "the successful run counts");
                let r = replay("replay-2", "4242:r1").await;
                assert_eq!(r.status, 200, "{:?}", r.json());
                assert_eq!(r.json()["result"], "no_op");
                assert!(r.json()["message"].as_str().unwrap().contains("processed"));
                assert_eq!(processor.run_once().await.unwrap().claimed, 0, "a processed delivery is not run again");
                // Two replays, two audit rows; the retired route wrote none.
                let audit = crate::call(addr, "GET", "/admin/v1/audit?action=webhooks.replay", None, "").await;
                assert_eq!(audit.json()["items"].as_array().unwrap().len(), 2, "{:?}", audit.json());
                // Input no stored id can hold is a 400 naming the parameter,
                // never a database error; a well-formed unknown id is 404.
                let r = crate::call(addr, "GET", "/admin/v1/webhooks/receipt?endpoint=github&delivery_id=a%00b", None, "").await;
                assert_eq!((r.status, r.problem_type().as_str()), (400, "https://idem.dev/problems/invalid-request"));
                assert!(r.json()["detail"].as_str().unwrap().starts_with("delivery_id"));
                let r = replay("replay-3", "a\u{0}b").await;
                assert_eq!(r.status, 400, "{:?}", r.json());
                let r = replay("replay-4", "no-such-delivery").await;
                assert_eq!(r.status, 404, "{:?}", r.json());
                let r = crate::call(addr, "GET", "/admin/v1/webhooks/receipt?endpoint=git%00hub&delivery_id=x", None, "").await;
                assert_eq!(r.status, 400);
                assert!(r.json()["detail"].as_str().unwrap().starts_with("endpoint"));
                let r = crate::call(addr, "GET", "/admin/v1/webhooks/receipts?endpoint=git%00hub", None, "").await;
                assert_eq!(r.status, 400);
            }
        }
    };
}

webhook_suite!(sqlite, async {
    let dir = idem_testkit::TempDir::new("wh");
    let store = idem_sqlite::SqliteStore::connect(&dir.sqlite_url(), Default::default())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    (store, dir)
});
webhook_suite!(postgres, async {
    let db = idem_testkit::PgDatabase::create("idem_wh").await;
    let store = idem_postgres::PgStore::connect(&db.url, Default::default())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    (store, db)
});

/// The worker forwards a delivery, then dies (an abort at the failpoint between
/// the forward and marking the receipt processed). After a restart the same
/// delivery is forwarded again with the same Idempotency-Key, and the upstream
/// (the demo API on Idem's HTTP layer) applies it once.
async fn worker_killed_between_forward_and_bookkeeping(db_url: &str) {
    let (upstream, _up) = upstream().await;
    let dir = idem_testkit::TempDir::new("whcfg");
    let file = dir.path().join("idem.toml");
    std::fs::write(&file, config(&format!("http://{upstream}/v1/payments"), "")).unwrap();
    let args = ["--config", file.to_str().unwrap()];
    let server = Server::start_with(db_url, &args, Some("webhook.after_handle")).await;
    let body = payment("cus_kill", "");
    let h = sign::github("github-secret", "k1", &body);
    assert_eq!(deliver(server.addr, "github", &h, &body).await.status, 202);
    crate::messaging::eventually(
        Duration::from_secs(15),
        "the forward reached the upstream",
        || async { payments_of(upstream, "cus_kill").await.len() == 1 },
    )
    .await;
    // The worker aborted right after the forward, before its bookkeeping.
    let show = |db: String| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .args([
                "webhooks",
                "show",
                "github",
                "4242:k1",
                "--database-url",
                &db,
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    crate::messaging::eventually(
        Duration::from_secs(10),
        "the receiver died at the failpoint",
        || async { try_health(server.addr).await.is_none() },
    )
    .await;
    assert_eq!(
        show(db_url.to_owned())["state"],
        "received",
        "not marked processed"
    );
    drop(server);
    let restarted = Server::start(db_url, &args).await;
    crate::messaging::eventually(
        Duration::from_secs(20),
        "the delivery is processed after the lease",
        || async { show(db_url.to_owned())["state"] == "processed" },
    )
    .await;
    assert_eq!(
        payments_of(upstream, "cus_kill").await.len(),
        1,
        "forwarded twice, applied once"
    );
    let shown = show(db_url.to_owned());
    assert_eq!(
        (&shown["attempts"], shown["finished_at"].is_string()),
        (&serde_json::json!(1), true),
        "one recorded run (the aborted one was never recorded)"
    );
    let listed = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args([
            "webhooks",
            "list",
            "--state",
            "processed",
            "--database-url",
            db_url,
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&listed.stdout).lines().count(), 1);
    // The delivery as the upstream saw it in Idempotency-Key: `github:4242:k1`.
    for id in ["4242:k1", "github:4242:k1"] {
        let replay = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["webhooks", "replay", "github", id, "--database-url", db_url])
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&replay.stdout);
        assert!(
            out.contains("\"no_op\"") && out.contains("\"delivery_id\":\"4242:k1\""),
            "{id}: {out}"
        );
        let show = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["webhooks", "show", "github", id, "--database-url", db_url])
            .output()
            .unwrap();
        assert!(
            show.status.success(),
            "{id}: {}",
            String::from_utf8_lossy(&show.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
        assert_eq!(v["delivery_id"], "4242:k1");
    }
    println!(
        "webhook worker drill: forwarded, aborted before bookkeeping, forwarded again after restart; upstream payments=1"
    );
    drop(restarted);
}

async fn try_health(addr: SocketAddr) -> Option<u16> {
    crate::try_call(addr, "GET", "/healthz", None, "")
        .await
        .ok()
        .map(|r| r.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_webhook_worker_after_forward_on_sqlite() {
    let dir = idem_testkit::TempDir::new("whk");
    worker_killed_between_forward_and_bookkeeping(&dir.sqlite_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_webhook_worker_after_forward_on_postgres() {
    let db = idem_testkit::PgDatabase::create("idem_whk").await;
    worker_killed_between_forward_and_bookkeeping(&db.url).await;
}

/// A configuration file without endpoints starts, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_config_without_endpoints_warns() {
    for (name, text) in [
        ("empty", ""),
        ("worker-only", "[worker]\nlease_secs = 30\n"),
    ] {
        let dir = idem_testkit::TempDir::new("whempty");
        let file = dir.path().join("idem.toml");
        std::fs::write(&file, text).unwrap();
        let log = dir.path().join("stderr.log");
        let addr: SocketAddr = format!("127.0.0.1:{}", crate::process::free_port())
            .parse()
            .unwrap();
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["serve", "--listen", &addr.to_string(), "--database-url"])
            .arg(dir.sqlite_url())
            .arg("--config")
            .arg(&file)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        crate::messaging::eventually(Duration::from_secs(30), "idem serve is up", || async {
            try_health(addr).await == Some(200)
        })
        .await;
        let _ = child.kill();
        let _ = child.wait();
        let stderr = std::fs::read_to_string(&log).unwrap();
        assert!(
            stderr.contains("WARN") && stderr.contains("no webhook endpoints are configured"),
            "{name}: {stderr}"
        );
    }
}
