//! `GET /metrics` of the real `idem serve` process: every counter equals the
//! number of requests, webhook deliveries and messages this test sent, on an
//! SQLite file and on PostgreSQL; the gauges read the store; and the
//! endpoint is behind the admin token unless `--public-metrics`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use idem_testkit::{NatsServer, PgDatabase, TempDir};

use crate::Reply;
use crate::process::Server;
use crate::webhooks::{deliver, now_s, payment, sign};

pub(crate) const TOKEN: &str = "e9c9eb468bc0aca7aefe58c195f0d1f7";

/// One sample of the exposition text: name, labels, value.
#[derive(Debug)]
pub(crate) struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses the Prometheus text format (0.0.4): comment lines skipped, label
/// values unescaped (`\\`, `\"`, `\n`), every other line one sample.
pub(crate) fn parse(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line
            .find(['{', ' '])
            .unwrap_or_else(|| panic!("no value on {line:?}"));
        let name = line[..name_end].to_owned();
        let mut labels = BTreeMap::new();
        let mut rest = &line[name_end..];
        if let Some(body) = rest.strip_prefix('{') {
            let mut chars = body.char_indices();
            let mut key = String::new();
            let end = loop {
                let (i, c) = chars
                    .next()
                    .unwrap_or_else(|| panic!("unclosed {{ in {line:?}"));
                match c {
                    '}' => break i,
                    ',' | ' ' => {}
                    '=' => {
                        assert_eq!(chars.next().map(|(_, c)| c), Some('"'), "{line:?}");
                        let mut value = String::new();
                        loop {
                            match chars.next().unwrap().1 {
                                '"' => break,
                                '\\' => match chars.next().unwrap().1 {
                                    'n' => value.push('\n'),
                                    other => value.push(other),
                                },
                                c => value.push(c),
                            }
                        }
                        labels.insert(std::mem::take(&mut key), value);
                    }
                    c => key.push(c),
                }
            };
            rest = &body[end + 1..];
        }
        let value = rest.split_whitespace().next().unwrap();
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        out.push(Sample {
            name,
            labels,
            value,
        });
    }
    out
}

/// The scraped samples, with lookups by name and exact label set.
pub(crate) struct Scraped(pub Vec<Sample>);

impl Scraped {
    /// The value of the sample `name{labels}` (exactly these labels).
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let found: Vec<&Sample> = self
            .0
            .iter()
            .filter(|s| s.name == name && s.labels == want)
            .collect();
        assert!(found.len() <= 1, "{name}{want:?} appears twice");
        found.first().map(|s| s.value)
    }

    /// Like `get`, 0 when absent (a counter never incremented is not shown).
    pub fn count(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let v = self.get(name, labels).unwrap_or(0.0);
        assert!(v >= 0.0 && v.fract() == 0.0, "{name} = {v}");
        v as u64
    }

    /// The sum of every sample of `name` whose labels include `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.0
            .iter()
            .filter(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value as u64)
            .sum()
    }
}

/// `GET /metrics`, with `Authorization: Bearer <token>` when given.
pub(crate) async fn get_metrics(addr: SocketAddr, token: Option<&str>) -> Reply {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req =
        format!("GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{auth}\r\n");
    crate::exchange(addr, &req).await
}

pub(crate) async fn scrape(addr: SocketAddr) -> Scraped {
    let r = get_metrics(addr, Some(TOKEN)).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        r.header("content-type")
            .is_some_and(|ct| ct.starts_with("text/plain; version=0.0.4")),
        "{}",
        r.head
    );
    Scraped(parse(&String::from_utf8(r.body).unwrap()))
}

/// Polls the scrape until `done` holds (background work: relay, consumer,
/// webhook workers), for at most 30 s; returns the last scrape.
async fn scrape_until(addr: SocketAddr, what: &str, done: impl Fn(&Scraped) -> bool) -> Scraped {
    for _ in 0..300 {
        let s = scrape(addr).await;
        if done(&s) {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what} within 30 s");
}

/// Webhook endpoints: `hooks` (GitHub: delivery ids, no timestamp) and
/// `timed` (Stripe: signed timestamps), both forwarding to `upstream`.
fn webhook_config(upstream: SocketAddr) -> String {
    format!(
        r#"
        [webhooks.hooks]
        scheme = "github"
        secrets = ["hooks-secret"]
        forward_to = "http://{upstream}/v1/payments"
        max_body_bytes = 512
        [webhooks.timed]
        scheme = "stripe"
        secrets = ["whsec_timed"]
        forward_to = "http://{upstream}/v1/payments"
        [worker]
        poll_interval_ms = 50
        "#
    )
}

const F: usize = 5; // fresh keyed requests
const R: usize = 4; // replays
const M: usize = 3; // mismatches
const MISSING: usize = 2;
const MALFORMED: usize = 2;
const TOO_LARGE: usize = 1;
const W: usize = 4; // accepted webhooks
const D: usize = 3; // duplicate deliveries
const B: usize = 2; // bad signatures
const S: usize = 3; // stale timestamps

async fn counters_equal_what_was_sent(db_url: &str) {
    let nats = NatsServer::start();
    let (upstream, _up) = crate::webhooks::upstream().await;
    let dir = TempDir::new("metrics-cfg");
    let file = dir.path().join("idem.toml");
    std::fs::write(&file, webhook_config(upstream)).unwrap();
    let nats_url = nats.url();
    let server = Server::start(
        db_url,
        &[
            "--admin-token",
            TOKEN,
            "--config",
            file.to_str().unwrap(),
            "--nats-url",
            &nats_url,
            "--consume",
            "--max-body-bytes",
            "2048",
        ],
    )
    .await;
    let addr = server.addr;

    // HTTP: the payments route, operation `payments.create`.
    let body = |i: usize| {
        format!(
            r#"{{"amount":{},"currency":"EUR","customer":"cus_m"}}"#,
            i + 1
        )
    };
    for i in 0..F {
        let r = crate::create(addr, &format!("fresh-{i}"), &body(i)).await;
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    }
    for i in 0..R {
        let r = crate::create(addr, &format!("fresh-{}", i % F), &body(i % F)).await;
        assert!(r.replayed(), "replay {i}");
    }
    for i in 0..M {
        let r = crate::create(addr, &format!("fresh-{i}"), &body(i + 100)).await;
        assert_eq!(r.status, 422, "mismatch {i}");
    }
    for _ in 0..MISSING {
        let r = crate::call(addr, "POST", "/v1/payments", None, &body(0)).await;
        assert_eq!(r.status, 400);
        assert!(
            r.problem_type().ends_with("missing-idempotency-key"),
            "{}",
            r.problem_type()
        );
    }
    for key in ["\"unterminated", "has\\backslash"].iter().take(MALFORMED) {
        let r = crate::create(addr, key, &body(0)).await;
        assert_eq!(r.status, 400);
        assert!(
            r.problem_type().ends_with("malformed-idempotency-key"),
            "{}",
            r.problem_type()
        );
    }
    for i in 0..TOO_LARGE {
        let big = format!(
            r#"{{"amount":1,"currency":"EUR","customer":"cus_m","pad":"{}"}}"#,
            "x".repeat(4096)
        );
        let r = crate::create(addr, &format!("big-{i}"), &big).await;
        assert_eq!(r.status, 413);
    }

    // Webhooks.
    let hook_body = |i: usize| payment(&format!("cus_hook_{i}"), "");
    for i in 0..W {
        let h = sign::github("hooks-secret", &format!("w-{i}"), &hook_body(i));
        assert_eq!(deliver(addr, "hooks", &h, &hook_body(i)).await.status, 202);
    }
    for i in 0..D {
        let h = sign::github("hooks-secret", &format!("w-{}", i % W), &hook_body(i % W));
        assert_eq!(
            deliver(addr, "hooks", &h, &hook_body(i % W)).await.status,
            200
        );
    }
    for i in 0..B {
        let h = sign::github("not-the-secret", &format!("b-{i}"), &hook_body(i));
        assert_eq!(deliver(addr, "hooks", &h, &hook_body(i)).await.status, 401);
    }
    for i in 0..S {
        let b = payment(&format!("cus_stale_{i}"), "");
        let h = sign::stripe("whsec_timed", now_s() - 3600, &b);
        assert_eq!(deliver(addr, "timed", &h, &b).await.status, 401);
    }
    let big = payment("cus_big", &format!(r#","pad":"{}""#, "x".repeat(600)));
    let h = sign::github("hooks-secret", "big", &big);
    assert_eq!(deliver(addr, "hooks", &h, &big).await.status, 413);

    // Counted before each answer went out: exact at once.
    let m = scrape(addr).await;
    let http = |outcome: &str| {
        m.count(
            "idem_http_requests_total",
            &[("operation", "payments.create"), ("outcome", outcome)],
        )
    };
    assert_eq!(http("executed"), F as u64);
    assert_eq!(http("replayed"), R as u64);
    assert_eq!(http("mismatch"), M as u64);
    assert_eq!(http("missing_key"), MISSING as u64);
    assert_eq!(http("malformed_key"), MALFORMED as u64);
    assert_eq!(http("too_large"), TOO_LARGE as u64);
    assert_eq!(http("in_flight"), 0);
    assert_eq!(
        m.sum("idem_http_requests_total", &[]),
        (F + R + M + MISSING + MALFORMED + TOO_LARGE) as u64,
        "no request counted twice or under another outcome"
    );
    // The histogram counts the same requests.
    assert_eq!(
        m.count(
            "idem_http_request_duration_seconds_count",
            &[("operation", "payments.create"), ("outcome", "executed")],
        ),
        F as u64
    );
    assert_eq!(
        m.count(
            "idem_http_request_duration_seconds_bucket",
            &[
                ("operation", "payments.create"),
                ("outcome", "replayed"),
                ("le", "+Inf")
            ],
        ),
        R as u64
    );
    let hook = |endpoint: &str, result: &str| {
        m.count(
            "idem_webhook_deliveries_total",
            &[("endpoint", endpoint), ("result", result)],
        )
    };
    assert_eq!(hook("hooks", "accepted"), W as u64);
    assert_eq!(hook("hooks", "duplicate"), D as u64);
    assert_eq!(hook("hooks", "bad_signature"), B as u64);
    assert_eq!(hook("hooks", "too_large"), 1);
    assert_eq!(hook("timed", "stale_timestamp"), S as u64);
    assert_eq!(
        m.sum("idem_webhook_deliveries_total", &[]),
        (W + D + B + S + 1) as u64
    );

    // The relay, the consumer and the webhook workers run in the background:
    // their counters and the store's gauges reach the numbers sent.
    let m = scrape_until(
        addr,
        "events published and applied, receipts processed",
        |m| {
            m.count("idem_outbox_published_total", &[]) >= F as u64
                && m.count(
                    "idem_inbox_messages_total",
                    &[("subscriber", "demo-ledger"), ("result", "applied")],
                ) >= F as u64
                && m.get(
                    "idem_webhook_receipts",
                    &[("endpoint", "hooks"), ("state", "processed")],
                ) == Some(W as f64)
                && m.get("idem_outbox_pending", &[]) == Some(0.0)
        },
    )
    .await;
    assert_eq!(m.count("idem_outbox_published_total", &[]), F as u64);
    assert_eq!(
        m.count(
            "idem_inbox_messages_total",
            &[("subscriber", "demo-ledger"), ("result", "applied")],
        ),
        F as u64
    );
    assert_eq!(
        m.count(
            "idem_inbox_messages_total",
            &[("subscriber", "demo-ledger"), ("result", "dead")],
        ),
        0
    );
    assert_eq!(m.get("idem_outbox_dead", &[]), Some(0.0));
    assert_eq!(
        m.get("idem_outbox_oldest_pending_age_seconds", &[]),
        Some(0.0)
    );
    assert_eq!(
        m.get(
            "idem_webhook_receipts",
            &[("endpoint", "hooks"), ("state", "received")],
        )
        .unwrap_or(0.0),
        0.0
    );
    // No multi-step runs in this process: every state is shown, at 0.
    for state in [
        "running",
        "compensating",
        "needs_attention",
        "completed",
        "failed",
    ] {
        assert_eq!(
            m.get("idem_runs", &[("state", state)]),
            Some(0.0),
            "{state}"
        );
    }
    // Two events published again under new broker ids (an operator's
    // replay: only the inbox catches them) and one message that does not
    // decode (no message id): two duplicates and one dead letter.
    let js = idem_nats::connect(&nats_url, "metrics-test", false)
        .await
        .unwrap();
    assert_eq!(
        crate::messaging::replay_stream(&js, |seq| seq <= 2).await,
        2
    );
    js.publish("payments.bogus", "not an event".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let inbox = |m: &Scraped, result: &str| {
        m.count(
            "idem_inbox_messages_total",
            &[("subscriber", "demo-ledger"), ("result", result)],
        )
    };
    let m = scrape_until(
        addr,
        "the duplicates skipped and the bad message dead",
        |m| inbox(m, "duplicate") >= 2 && inbox(m, "dead") >= 1,
    )
    .await;
    assert_eq!(inbox(&m, "duplicate"), 2);
    assert_eq!(inbox(&m, "dead"), 1);
    assert_eq!(inbox(&m, "applied"), F as u64, "nothing applied twice");
    // Neither the key nor a body shows anywhere.
    let text = String::from_utf8(get_metrics(addr, Some(TOKEN)).await.body).unwrap();
    assert!(!text.contains("fresh-0") && !text.contains("cus_m"));
    let mut server = server;
    let log = server.proc().log();
    assert!(
        log.contains("idem.message{subscriber=demo-ledger"),
        "the dead letter's line is in its message span: {log}"
    );
    assert!(!log.contains("fresh-0"), "a raw key was logged: {log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_counters_equal_what_was_sent_on_sqlite() {
    let dir = TempDir::new("metrics");
    counters_equal_what_was_sent(&dir.sqlite_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_counters_equal_what_was_sent_on_postgres() {
    let db = PgDatabase::create("idem_metrics").await;
    counters_equal_what_was_sent(&db.url).await;
}

/// Without `--public-metrics` `/metrics` answers like `/admin`: 401 without
/// the token or with a wrong one (and 401 admin-disabled when no token is
/// configured); with it, 200 to anyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_the_admin_token_unless_public() {
    let dir = TempDir::new("metrics-auth");
    let url = dir.sqlite_url();

    let guarded = Server::start(&url, &["--admin-token", TOKEN]).await;
    for token in [None, Some("wrong-token-0123456789abcdef")] {
        let r = get_metrics(guarded.addr, token).await;
        assert_eq!(r.status, 401, "{token:?}");
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("application/problem+json")
        );
        assert!(
            r.problem_type().ends_with("/unauthorized"),
            "{}",
            r.problem_type()
        );
        assert!(!String::from_utf8_lossy(&r.body).contains("idem_"));
    }
    assert_eq!(get_metrics(guarded.addr, Some(TOKEN)).await.status, 200);
    drop(guarded);

    let no_token = Server::start(&url, &[]).await;
    let r = get_metrics(no_token.addr, None).await;
    assert_eq!(r.status, 401);
    assert!(
        r.problem_type().ends_with("/admin-disabled"),
        "{}",
        r.problem_type()
    );
    drop(no_token);

    let public = Server::start(&url, &["--public-metrics"]).await;
    let r = get_metrics(public.addr, None).await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body).unwrap();
    let m = Scraped(parse(&text));
    assert_eq!(m.get("idem_outbox_pending", &[]), Some(0.0));
    // The environment variable does the same.
    drop(public);
    let env = Server::start_env(&url, &[], None, &[("IDEM_PUBLIC_METRICS", "true")]).await;
    assert_eq!(get_metrics(env.addr, None).await.status, 200);
}

/// The checkout's runs through the real shop: one confirmed order, one
/// declined (compensated) and a replay; the step, compensation and run
/// figures equal what the saga did.
async fn steps_are_counted(shop_url: &str) {
    let provider_dir = TempDir::new("metrics-provider");
    let provider = Server::start(&provider_dir.sqlite_url(), &[]).await;
    let sink_addr: SocketAddr = format!("127.0.0.1:{}", crate::process::free_port())
        .parse()
        .unwrap();
    let _sink = crate::process::Proc::spawn(
        &["mail-sink".into(), "--listen".into(), sink_addr.to_string()],
        None,
    );
    let provider_url = format!("http://{}", provider.addr);
    let mail_url = format!("http://{sink_addr}");
    let shop = Server::start(
        shop_url,
        &[
            "--admin-token",
            TOKEN,
            "--provider-url",
            &provider_url,
            "--mail-url",
            &mail_url,
        ],
    )
    .await;
    let s = shop.addr;
    crate::checkout::set_stock(s, "tee-m", 5).await;
    let ok = crate::checkout::order_body("cus_ok", "tee-m", 2, 3000);
    let r = crate::call(s, "POST", "/v1/orders", Some("o-1"), &ok).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        crate::call(s, "POST", "/v1/orders", Some("o-1"), &ok)
            .await
            .replayed()
    );
    // The demo provider declines customers named cus_decline_*.
    let declined = crate::checkout::order_body("cus_decline_1", "tee-m", 1, 500);
    let r = crate::call(s, "POST", "/v1/orders", Some("o-2"), &declined).await;
    assert_eq!(r.status, 402, "{}", String::from_utf8_lossy(&r.body));

    let m = scrape(s).await;
    let attempts = |step: &str, result: &str| {
        m.count(
            "idem_step_attempts_total",
            &[("step", step), ("result", result)],
        )
    };
    assert_eq!(attempts("charge", "ok"), 2, "both charges answered");
    assert_eq!(attempts("confirmation", "ok"), 1, "one confirmation sent");
    assert_eq!(attempts("refund", "ok"), 1, "the declined charge's undo");
    assert_eq!(
        m.sum("idem_step_attempts_total", &[]),
        4,
        "no other attempt"
    );
    // The declined order undid its charge (nothing to refund) and released
    // its stock: two compensations, none failed.
    assert_eq!(
        m.count("idem_compensations_total", &[("result", "done")]),
        2
    );
    assert_eq!(
        m.count("idem_compensations_total", &[("result", "failed")]),
        0
    );
    assert_eq!(m.count("idem_lease_takeovers_total", &[]), 0);
    assert_eq!(m.count("idem_fence_rejections_total", &[]), 0);
    assert_eq!(m.get("idem_runs", &[("state", "completed")]), Some(1.0));
    assert_eq!(m.get("idem_runs", &[("state", "failed")]), Some(1.0));
    assert_eq!(m.get("idem_runs", &[("state", "running")]), Some(0.0));
    // The runs' route is counted like the layer's.
    let orders = |outcome: &str| {
        m.count(
            "idem_http_requests_total",
            &[("operation", "orders.create"), ("outcome", outcome)],
        )
    };
    assert_eq!(orders("replayed"), 1);
    assert_eq!(
        m.sum(
            "idem_http_requests_total",
            &[("operation", "orders.create")]
        ),
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_steps_compensations_and_runs_on_sqlite() {
    let dir = TempDir::new("metrics-shop");
    steps_are_counted(&dir.sqlite_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_steps_compensations_and_runs_on_postgres() {
    let db = PgDatabase::create("idem_metrics_shop").await;
    steps_are_counted(&db.url).await;
}

/// A shop killed after the provider answered a charge and before it was
/// recorded: the restarted shop takes the run over; its takeover counter
/// equals the takeovers the run's record holds, and the repeated charge is
/// its one charge attempt.
async fn takeovers_are_counted(db: crate::checkout::ShopDb) {
    use crate::checkout::{World, order_body, set_stock, settle};
    let w = World::new(db).await;
    let mut shop = w
        .shop(&["--admin-token", TOKEN], Some("steps.after_call=1"))
        .await;
    set_stock(shop.addr, "tee", 10).await;
    let body = order_body("cus_takeover", "tee", 1, 3000);
    let first = crate::try_call(shop.addr, "POST", "/v1/orders", Some("t-1"), &body).await;
    assert!(first.is_err() || first.unwrap().status >= 500);
    assert!(
        shop.proc().exited_within(Duration::from_secs(10)).await,
        "aborted at the failpoint"
    );
    shop.restart().await;
    let done = settle(shop.addr, "t-1", &body, Duration::from_secs(30)).await;
    assert_eq!(done.status, 201, "{}", String::from_utf8_lossy(&done.body));
    let order = done.json()["id"].as_str().unwrap().to_owned();
    let run = w.run(&order).await;
    assert!(run.takeovers >= 1);
    let m = scrape(shop.addr).await;
    assert_eq!(
        m.count("idem_lease_takeovers_total", &[]),
        u64::from(run.takeovers),
        "every takeover was this process's"
    );
    assert_eq!(
        m.count(
            "idem_step_attempts_total",
            &[("step", "charge"), ("result", "ok")]
        ),
        1,
        "the charge sent again"
    );
    assert_eq!(m.count("idem_fence_rejections_total", &[]), 0);
    assert_eq!(m.get("idem_runs", &[("state", "completed")]), Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_lease_takeovers_on_sqlite() {
    takeovers_are_counted(crate::checkout::ShopDb::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_lease_takeovers_on_postgres() {
    takeovers_are_counted(crate::checkout::ShopDb::postgres().await).await;
}

/// Key records past their TTL are deleted by the server's collector; the
/// counter equals the records written.
async fn purged_keys_are_counted(db_url: &str) {
    let server = Server::start(
        db_url,
        &[
            "--admin-token",
            TOKEN,
            "--key-ttl",
            "1s",
            "--gc-interval",
            "1s",
        ],
    )
    .await;
    const N: u64 = 3;
    for i in 0..N {
        let b = format!(
            r#"{{"amount":{},"currency":"EUR","customer":"cus_gc"}}"#,
            i + 1
        );
        assert_eq!(
            crate::create(server.addr, &format!("gc-{i}"), &b)
                .await
                .status,
            201
        );
    }
    let m = scrape_until(server.addr, "the expired keys purged", |m| {
        m.count("idem_keys_purged_total", &[]) >= N
    })
    .await;
    assert_eq!(m.count("idem_keys_purged_total", &[]), N);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_purged_keys_on_sqlite() {
    let dir = TempDir::new("metrics-gc");
    purged_keys_are_counted(&dir.sqlite_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_purged_keys_on_postgres() {
    let db = PgDatabase::create("idem_metrics_gc").await;
    purged_keys_are_counted(&db.url).await;
}

/// The gateway's routes are counted like the layer's, and a forward whose
/// gateway was killed is taken over once its lease ran out: the in-flight
/// answers before that, the takeover and the one execution are counted.
async fn the_gateway_is_counted(db: crate::checkout::ShopDb) {
    use crate::gateway::{Upstream, config_file};
    let up = Upstream::start().await;
    let dir = TempDir::new("metrics-gateway");
    let config = config_file(&dir, &up, "reforward");
    let args = ["--config", config.as_str(), "--admin-token", TOKEN];
    let mut gw = Server::start(&db.url(), &args).await;

    let body = r#"{"amount":100,"currency":"EUR","customer":"c1"}"#;
    let post = |key: Option<&'static str>, body: &'static str| {
        let addr = gw.addr;
        async move { crate::call(addr, "POST", "/v1/payments", key, body).await }
    };
    assert_eq!(post(Some("k-1"), body).await.status, 201);
    assert!(post(Some("k-1"), body).await.replayed());
    assert_eq!(post(Some("k-1"), r#"{"amount":999}"#).await.status, 422);
    assert_eq!(post(None, body).await.status, 400);
    let m = scrape(gw.addr).await;
    let counted = |outcome: &str| {
        m.count(
            "idem_http_requests_total",
            &[("operation", "payments.create"), ("outcome", outcome)],
        )
    };
    assert_eq!(
        (
            counted("executed"),
            counted("replayed"),
            counted("mismatch"),
            counted("missing_key")
        ),
        (1, 1, 1, 1)
    );
    assert_eq!(m.sum("idem_http_requests_total", &[]), 4);

    // A forward held by the upstream, its gateway killed.
    up.hold();
    let addr = gw.addr;
    let first =
        tokio::spawn(
            async move { crate::try_call(addr, "POST", "/hold", Some("h-1"), "{}").await },
        );
    for _ in 0..500 {
        if !up.seen_at("/hold").is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        up.seen_at("/hold").len(),
        1,
        "the forward reached the upstream"
    );
    gw.proc().kill9();
    assert!(first.await.unwrap().is_err());
    up.open();
    gw.restart().await;
    let mut in_flight = 0u64;
    let answer = loop {
        let r = crate::call(gw.addr, "POST", "/hold", Some("h-1"), "{}").await;
        if r.status == 409 && r.problem_type().ends_with("/request-in-flight") {
            in_flight += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        break r;
    };
    assert_eq!(
        answer.status,
        201,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let m = scrape(gw.addr).await;
    let hold = |outcome: &str| {
        m.count(
            "idem_http_requests_total",
            &[("operation", "hold"), ("outcome", outcome)],
        )
    };
    assert_eq!(hold("in_flight"), in_flight, "every 409 during the lease");
    assert_eq!(hold("executed"), 1);
    assert_eq!(
        m.count("idem_lease_takeovers_total", &[]),
        1,
        "one takeover"
    );
    assert_eq!(m.count("idem_fence_rejections_total", &[]), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_the_gateway_and_its_takeovers_on_sqlite() {
    the_gateway_is_counted(crate::checkout::ShopDb::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_the_gateway_and_its_takeovers_on_postgres() {
    the_gateway_is_counted(crate::checkout::ShopDb::postgres().await).await;
}

#[test]
fn the_exposition_parser_reads_labels_and_escapes() {
    let text = "# HELP x y\n# TYPE x counter\nx{a=\"1\",b=\"q\\\"u\\\\o\"} 3\ny 0.5\nz_bucket{le=\"+Inf\"} 7\n";
    let s = Scraped(parse(text));
    assert_eq!(s.get("x", &[("a", "1"), ("b", "q\"u\\o")]), Some(3.0));
    assert_eq!(s.get("y", &[]), Some(0.5));
    assert_eq!(s.get("z_bucket", &[("le", "+Inf")]), Some(7.0));
    assert_eq!(s.get("x", &[("a", "1")]), None, "labels match exactly");
}
