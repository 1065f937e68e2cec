//! The gateway (`idem serve --upstream`) as a real process in front of a
//! deliberately non-idempotent upstream in the test process: every POST
//! there is a new payment. What the upstream received is the evidence.

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::checkout::ShopDb;
use crate::process::Server;
use crate::{Reply, call, try_call};

/// One request as the upstream saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
    pub fn key(&self) -> Option<&str> {
        self.header("idempotency-key")
    }
}

/// A payments API without idempotency: `POST /v1/payments` (and
/// `/v1/orders/…`) creates one each time (`{"id":"pay_N", …body}`, 201); `/fail` answers 503 with
/// `Retry-After: 7`; `/big` answers 2 MiB; `/hold` waits for
/// [`Upstream::open`] before answering; `GET /v1/payments` lists them
/// (`?reference=R`: those whose `reference` is R; `/v1/payments/broken`
/// answers 500, a lookup that fails). And the boundary's failure cases:
/// - `/lose`: creates the payment, then closes the connection without an
///   answer — the first time it sees each `Idempotency-Key` — and answers
///   201 after that (the seed's first failure case);
/// - `/drop`: the first time it sees each key, closes the connection
///   *without* acting; 201 after that;
/// - `/act-then/{status}`: creates the payment, then answers that status;
/// - `/dedupe`: Stripe's contract — a key seen first creates the payment
///   and answers after [`Upstream::set_delay`] (then replays it, marked
///   `Idempotent-Replayed: true`); a key whose first request still runs
///   answers 409 `idempotency_key_in_use`;
/// - `/gzip`: creates the payment and answers it gzip-encoded when the
///   request accepts gzip (`Vary: Accept-Encoding`); `/always-gzip` even
///   when it does not;
/// - `GET /large?bytes=N` and `POST /large?bytes=N`: N bytes;
/// - `GET /v1/payments?reference=R`: the payments with that reference
///   (`{"data": […]}`); `GET /held-lookup?reference=R` the same, but the
///   second one answers (what it read on arrival) only once `open`.
#[derive(Clone)]
pub struct Upstream {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    payments: Arc<Mutex<Vec<Value>>>,
    gate: watch::Sender<bool>,
    keys: Arc<Mutex<HashMap<String, Option<Value>>>>,
    delay: Arc<Mutex<Duration>>,
}

type Answer = Result<Response<Full<Bytes>>, std::io::Error>;

fn json_answer(status: u16, v: &Value) -> Answer {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
    r.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    Ok(r)
}

impl Upstream {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (gate, _) = watch::channel(true);
        let up = Self {
            addr,
            seen: Arc::default(),
            payments: Arc::default(),
            gate,
            keys: Arc::default(),
            delay: Arc::new(Mutex::new(Duration::from_secs(4))),
        };
        let me = up.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let me = me.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let me = me.clone();
                        async move { me.handle(req).await }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        up
    }

    async fn handle(&self, req: Request<Incoming>) -> Answer {
        let (parts, body) = req.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        self.seen.lock().unwrap().push(Seen {
            method: parts.method.to_string(),
            path: parts.uri.to_string(),
            headers: parts
                .headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("?").to_owned()))
                .collect(),
        });
        let create = |me: &Self| {
            let mut p: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
            let mut all = me.payments.lock().unwrap();
            p["id"] = format!("pay_{}", all.len() + 1).into();
            all.push(p.clone());
            p
        };
        let key = parts
            .headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        // Whether this key was seen on this path before (and now is).
        let first_time = |me: &Self| {
            let tag = format!("{}:{}", parts.uri.path(), key.clone().unwrap_or_default());
            me.keys.lock().unwrap().insert(tag, None).is_none()
        };
        let query = |name: &str| {
            parts.uri.query().and_then(|q| {
                q.split('&')
                    .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                    .map(str::to_owned)
            })
        };
        let path = parts.uri.path().to_owned();
        match (parts.method.as_str(), path.as_str()) {
            ("POST", "/v1/payments") => json_answer(201, &create(self)),
            ("POST", p) if p.starts_with("/v1/orders/") => json_answer(201, &create(self)),
            ("POST", "/lose") => {
                let p = create(self);
                if first_time(self) {
                    return Err(std::io::Error::other("the answer is lost"));
                }
                json_answer(201, &p)
            }
            ("POST", "/drop") => {
                if first_time(self) {
                    return Err(std::io::Error::other("dropped before acting"));
                }
                json_answer(201, &create(self))
            }
            ("POST", p) if p.starts_with("/act-then/") => {
                let status = p.trim_start_matches("/act-then/").parse().unwrap_or(500);
                create(self);
                json_answer(status, &json!({"error": "acted, then failed"}))
            }
            ("POST", "/dedupe") => {
                let tag = key.clone().unwrap_or_default();
                let state = self.keys.lock().unwrap().get(&tag).cloned();
                match state {
                    Some(Some(done)) => {
                        let mut r = json_answer(201, &done)?;
                        r.headers_mut()
                            .insert("idempotent-replayed", "true".parse().unwrap());
                        Ok(r)
                    }
                    Some(None) => json_answer(
                        409,
                        &json!({"error": {"type": "idempotency_error",
                                          "code": "idempotency_key_in_use"}}),
                    ),
                    None => {
                        self.keys.lock().unwrap().insert(tag.clone(), None);
                        let p = create(self);
                        let delay = *self.delay.lock().unwrap();
                        // In a task of its own: a client that hangs up does
                        // not stop the work, as in a real service.
                        let keys = self.keys.clone();
                        let done = p.clone();
                        let work = tokio::spawn(async move {
                            tokio::time::sleep(delay).await;
                            keys.lock().unwrap().insert(tag, Some(done));
                        });
                        let _ = work.await;
                        json_answer(201, &p)
                    }
                }
            }
            ("POST", "/gzip" | "/always-gzip") => {
                let p = create(self);
                let accepts = parts
                    .headers
                    .get("accept-encoding")
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.contains("gzip"));
                if !accepts && path == "/gzip" {
                    return json_answer(201, &p);
                }
                let mut gz =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                gz.write_all(p.to_string().as_bytes()).unwrap();
                let mut r = Response::new(Full::new(Bytes::from(gz.finish().unwrap())));
                *r.status_mut() = hyper::StatusCode::CREATED;
                for (n, v) in [
                    ("content-type", "application/json"),
                    ("content-encoding", "gzip"),
                    ("vary", "Accept-Encoding"),
                    ("content-language", "en"),
                ] {
                    r.headers_mut().insert(n, v.parse().unwrap());
                }
                Ok(r)
            }
            ("GET" | "POST", "/large") => {
                // One buffer for every answer: the test process holds it once.
                static BIG: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();
                let big = BIG.get_or_init(|| Bytes::from(vec![b'x'; 16 << 20]));
                let n = query("bytes")
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(1024)
                    .min(big.len());
                if parts.method == "POST" {
                    create(self);
                }
                let mut r = Response::new(Full::new(big.slice(..n)));
                if let Some(s) = query("status").and_then(|s| s.parse().ok()) {
                    *r.status_mut() = hyper::StatusCode::from_u16(s).unwrap();
                }
                Ok(r)
            }
            ("GET", "/v1/payments/broken") => json_answer(500, &json!({"error": "lookup down"})),
            ("POST", "/hold") => {
                let p = create(self);
                let mut rx = self.gate.subscribe();
                let _ = rx.wait_for(|open| *open).await;
                json_answer(201, &p)
            }
            ("POST", "/flaky") if self.seen_at("/flaky").len() <= 2 => {
                json_answer(503, &json!({"error": "warming up"}))
            }
            ("POST", "/flaky") => json_answer(201, &create(self)),
            ("POST", "/fail") => {
                let mut r = json_answer(503, &json!({"error": "busy"}))?;
                r.headers_mut().insert("retry-after", "7".parse().unwrap());
                Ok(r)
            }
            ("POST", "/big") => Ok(Response::new(Full::new(Bytes::from(vec![b'x'; 2 << 20])))),
            ("GET", "/v1/payments" | "/held-lookup") => {
                let all = self.payments.lock().unwrap().clone();
                let data: Vec<Value> = match query("reference") {
                    Some(r) => all
                        .into_iter()
                        .filter(|p| p["reference"] == r.as_str())
                        .collect(),
                    None => all,
                };
                // `/held-lookup`: the second one (a retry's, after the one
                // at the unknown outcome), its answer taken, waits for
                // `open`: a lookup slower than the lease.
                let held = (self.seen().iter())
                    .filter(|s| s.path.starts_with("/held-lookup"))
                    .count();
                if path == "/held-lookup" && held == 2 {
                    let _ = self.gate.subscribe().wait_for(|open| *open).await;
                }
                json_answer(200, &json!({ "data": data }))
            }
            _ => json_answer(404, &json!({"error": "no such route"})),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
    pub fn seen_at(&self, path: &str) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.path == path).collect()
    }
    pub fn effects(&self) -> usize {
        self.payments.lock().unwrap().len()
    }
    /// `/hold` answers wait.
    pub fn hold(&self) {
        self.gate.send_replace(false);
    }
    pub fn open(&self) {
        self.gate.send_replace(true);
    }
    /// How long `/dedupe` takes to answer a key's first request.
    pub fn set_delay(&self, d: Duration) {
        *self.delay.lock().unwrap() = d;
    }
}

pub fn config_file(dir: &idem_testkit::TempDir, upstream: &Upstream, on_unknown: &str) -> String {
    let path = dir.path().join("gateway.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[gateway]
upstream = "{}"
timeout = "3s"

[[gateway.routes]]
method = "POST"
path = "/v1/payments"
operation = "payments.create"
key = "required"
ttl = "24h"
lease = "1s"
on_unknown = "{on_unknown}"
ignore_fields = ["/client_ts"]
tenant_header = "X-Tenant-Id"
tenant = "default"

[[gateway.routes]]
method = "POST"
path = "/hold"
operation = "hold"
lease = "3s"
on_unknown = "{on_unknown}"

[[gateway.routes]]
method = "POST"
path = "/flaky"
operation = "flaky"
not_processed = [503]          # this upstream's 503 says: warming up, nothing done

[[gateway.routes]]
method = "POST"
path = "/{{kind}}"
operation = "misc"
max_response_bytes = 1048576
"#,
            upstream.url()
        ),
    )
    .unwrap();
    path.display().to_string()
}

pub async fn gateway(db: &ShopDb, config: &str, failpoints: Option<&str>) -> Server {
    Server::start_with(&db.url(), &["--config", config], failpoints).await
}

pub async fn post(addr: SocketAddr, path: &str, key: Option<&str>, body: &str) -> Reply {
    call(addr, "POST", path, key, body).await
}

/// The contract at the gateway: one effect per key, replays byte for byte,
/// 422 for another payload, 400 without a key, the key derived per tenant,
/// proxy headers; unlisted routes untouched.
pub async fn contract(db: ShopDb) {
    let up = Upstream::start().await;
    let dir = idem_testkit::TempDir::new("gateway");
    let config = config_file(&dir, &up, "reforward");
    let gw = gateway(&db, &config, None).await;
    let body = r#"{"amount":100,"currency":"EUR","customer":"c1","client_ts":1}"#;
    let first = post(gw.addr, "/v1/payments", Some("k-1"), body).await;
    assert_eq!(
        first.status,
        201,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    assert!(!first.replayed());
    // Same intent, a client timestamp that the fingerprint leaves out, the
    // fields reordered.
    let again = r#"{"client_ts":2,"customer":"c1","currency":"EUR","amount":100}"#;
    let replay = post(gw.addr, "/v1/payments", Some("k-1"), again).await;
    assert_eq!(replay.status, 201);
    assert!(replay.replayed(), "Idempotent-Replayed: true");
    assert_eq!(replay.body, first.body, "the replay is byte for byte");
    assert_eq!(up.effects(), 1, "one payment for one key");
    // What the upstream saw: the gateway's derived key, proxy headers.
    let seen = up.seen_at("/v1/payments");
    assert_eq!(seen.len(), 1);
    let derived = seen[0].key().unwrap().to_owned();
    assert!(derived.starts_with("idem:forward:"), "{derived}");
    assert_ne!(derived, "k-1", "the client's key is not forwarded");
    assert_eq!(seen[0].header("x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(seen[0].header("x-forwarded-proto"), Some("http"));
    assert_eq!(seen[0].header("x-forwarded-host"), Some("localhost"));
    assert!(
        seen[0]
            .header("connection")
            .is_none_or(|v| !v.contains("close"))
    );

    let other = post(gw.addr, "/v1/payments", Some("k-1"), r#"{"amount":999}"#).await;
    assert_eq!(other.status, 422);
    assert_eq!(
        other.problem_type(),
        "https://idem.dev/problems/idempotency-key-reused"
    );
    let missing = post(gw.addr, "/v1/payments", None, body).await;
    assert_eq!(missing.status, 400);
    for bad in ["", &"k".repeat(256)] {
        let r = post(gw.addr, "/v1/payments", Some(bad), body).await;
        assert_eq!(r.status, 400, "key {bad:?}");
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("application/problem+json")
        );
    }
    assert_eq!(up.effects(), 1, "refusals reach nothing");

    // Tenants: the same client key is two intents, two derived keys.
    let tenant = |t: &'static str| async move {
        let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        let req = format!(
            "POST /v1/payments HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\n\
             Idempotency-Key: shared\r\nX-Tenant-Id: {t}\r\nContent-Length: 2\r\n\r\n{{}}"
        );
        tokio::io::AsyncWriteExt::write_all(&mut s, req.as_bytes())
            .await
            .unwrap();
        let mut out = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut s, &mut out)
            .await
            .unwrap();
        String::from_utf8_lossy(&out).into_owned()
    };
    assert!(tenant("acme").await.starts_with("HTTP/1.1 201"));
    assert!(tenant("globex").await.starts_with("HTTP/1.1 201"));
    let keys: Vec<String> = up
        .seen_at("/v1/payments")
        .iter()
        .filter_map(|s| s.key().map(str::to_owned))
        .collect();
    assert_eq!(keys.len(), 3);
    assert!(
        keys[1] != keys[2] && keys[1] != derived,
        "one derived key per tenant: {keys:?}"
    );

    // Unlisted: a GET and a POST elsewhere pass through as they came.
    let list = call(gw.addr, "GET", "/v1/payments", None, "").await;
    assert_eq!(list.status, 200);
    assert_eq!(list.json()["data"].as_array().unwrap().len(), 3);
    let unlisted = call(gw.addr, "PUT", "/v1/payments", Some("mine"), "{}").await;
    assert_eq!(unlisted.status, 404, "the upstream's own answer");
    assert_eq!(unlisted.json()["error"], "no such route");
    let put = up.seen().into_iter().rfind(|s| s.method == "PUT").unwrap();
    assert_eq!(put.key(), Some("mine"), "untouched");
    // Idem's own routes keep their paths.
    assert_eq!(call(gw.addr, "GET", "/healthz", None, "").await.status, 200);
    // The task API is not mounted in front of an upstream: its /v1 paths
    // are the upstream's.
    let tasks = call(
        gw.addr,
        "POST",
        "/v1/queues/q/tasks",
        Some("t-1"),
        r#"{"payload":1}"#,
    )
    .await;
    assert_eq!(
        tasks.status,
        404,
        "{}",
        String::from_utf8_lossy(&tasks.body)
    );
    assert_eq!(
        tasks.json()["error"],
        "no such route",
        "the upstream's own answer"
    );
    // A gateway ships no demo: its database has Idem's tables, none of the
    // demo's.
    let (idem, demo) = tables(&db).await;
    assert!(idem > 0, "Idem's tables are made");
    assert_eq!(
        demo,
        Vec::<String>::new(),
        "no demo tables in a gateway's database"
    );
}

/// The tables of the shop's database: how many are Idem's, and the demo's
/// names.
async fn tables(db: &ShopDb) -> (usize, Vec<String>) {
    let names: Vec<String> = match db {
        ShopDb::Sqlite(_) => {
            let pool = sqlx::SqlitePool::connect(&db.url()).await.unwrap();
            let q = "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name";
            let names = sqlx::query_scalar(q).fetch_all(&pool).await.unwrap();
            pool.close().await;
            names
        }
        ShopDb::Postgres(_) => {
            let pool = sqlx::PgPool::connect(&db.url()).await.unwrap();
            let q = "SELECT table_name::text FROM information_schema.tables \
                     WHERE table_schema = current_schema() ORDER BY 1";
            let names = sqlx::query_scalar(q).fetch_all(&pool).await.unwrap();
            pool.close().await;
            names
        }
    };
    let idem = names.iter().filter(|n| n.starts_with("idem_")).count();
    let demo = names
        .into_iter()
        .filter(|n| n.starts_with("demo_"))
        .collect();
    (idem, demo)
}

/// Concurrent requests with one key: one effect; each answer is the
/// payment or 409 in flight.
pub async fn concurrency(db: ShopDb) {
    let up = Upstream::start().await;
    let dir = idem_testkit::TempDir::new("gateway");
    let config = config_file(&dir, &up, "reforward");
    let gw = gateway(&db, &config, None).await;
    let mut tasks = Vec::new();
    for _ in 0..40 {
        let addr = gw.addr;
        tasks.push(tokio::spawn(async move {
            post(addr, "/v1/payments", Some("race"), r#"{"amount":5}"#).await
        }));
    }
    let mut bodies = Vec::new();
    for t in tasks {
        let r = t.await.unwrap();
        match r.status {
            201 => bodies.push(r.body),
            409 => assert_eq!(
                r.problem_type(),
                "https://idem.dev/problems/request-in-flight"
            ),
            s => panic!("unexpected {s}: {}", String::from_utf8_lossy(&r.body)),
        }
    }
    assert_eq!(up.effects(), 1, "one effect for 40 concurrent requests");
    assert!(!bodies.is_empty());
    assert!(
        bodies.iter().all(|b| *b == bodies[0]),
        "every 201 is the same answer"
    );
    println!(
        "gateway concurrency: requests=40 answered_201={} effects=1",
        bodies.len()
    );
}

/// The upstream fails on a `reject` route (the default): its 5xx is passed
/// through (Retry-After included) and the key kept, so the retry gets 409
/// outcome-unknown and nothing is forwarded again; an answer over the limit
/// is 502 and kept the same way; an upstream that is down (nothing sent)
/// is 502 and the key released, so a retry tries again.
pub async fn upstream_failures(db: ShopDb) {
    let up = Upstream::start().await;
    let dir = idem_testkit::TempDir::new("gateway");
    let config = config_file(&dir, &up, "reforward");
    let gw = gateway(&db, &config, None).await;
    let a = post(gw.addr, "/fail", Some("f-1"), "{}").await;
    assert_eq!(a.status, 503);
    assert_eq!(
        a.header("retry-after").as_deref(),
        Some("7"),
        "passed through"
    );
    assert_eq!(a.json()["error"], "busy", "the upstream's own answer");
    let b = post(gw.addr, "/fail", Some("f-1"), "{}").await;
    assert_eq!(b.status, 409, "kept: {}", String::from_utf8_lossy(&b.body));
    assert_eq!(
        b.problem_type(),
        "https://idem.dev/problems/outcome-unknown"
    );
    assert!(
        b.header("retry-after").is_none(),
        "an operator's, not a retry's"
    );
    assert_eq!(up.seen_at("/fail").len(), 1, "never forwarded again");

    let big = post(gw.addr, "/big", Some("b-1"), "{}").await;
    assert_eq!(big.status, 502);
    assert_eq!(
        big.problem_type(),
        "https://idem.dev/problems/upstream-response-too-large"
    );
    let big = post(gw.addr, "/big", Some("b-1"), "{}").await;
    assert_eq!(big.status, 409, "the upstream acted: kept, not forwarded");
    assert_eq!(up.seen_at("/big").len(), 1);

    // Down: a gateway in front of a closed port.
    let closed = crate::process::free_port();
    let dir2 = idem_testkit::TempDir::new("gateway-down");
    let mut down = Server::start(
        &dir2.sqlite_url(),
        &["--upstream", &format!("http://127.0.0.1:{closed}")],
    )
    .await;
    let r = post(down.addr, "/v1/payments", Some("d-1"), "{}").await;
    assert_eq!(r.status, 502);
    assert_eq!(
        r.problem_type(),
        "https://idem.dev/problems/upstream-unavailable"
    );
    // Released: the same key again is forwarded again (still down), not 409.
    let r = post(down.addr, "/v1/payments", Some("d-1"), "{}").await;
    assert_eq!(r.status, 502);
    assert_eq!(
        down.proc().log().matches("upstream unreachable").count(),
        2,
        "each refusal is logged"
    );
}

/// Killed mid-forward (`kill -9` while the upstream holds its answer):
/// during the lease a retry is in flight; after it, a retry forwards again
/// with the same derived key (reforward), or gets 409 outcome-unknown and
/// waits for `idem keys resolve` (reject).
pub async fn killed_mid_forward(db: ShopDb, on_unknown: &'static str) {
    let up = Upstream::start().await;
    let dir = idem_testkit::TempDir::new("gateway");
    let config = config_file(&dir, &up, on_unknown);
    let mut gw = gateway(&db, &config, None).await;
    up.hold();
    let addr = gw.addr;
    let first =
        tokio::spawn(async move { try_call(addr, "POST", "/hold", Some("h-1"), "{}").await });
    for _ in 0..200 {
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
    assert!(first.await.unwrap().is_err(), "the client lost its answer");
    up.open();
    gw.restart().await;
    // The lease (3 s) may still run: in flight, never a second forward.
    let mut r = post(gw.addr, "/hold", Some("h-1"), "{}").await;
    let mut in_flight = 0;
    while r.status == 409 && r.problem_type().ends_with("/request-in-flight") {
        in_flight += 1;
        assert_eq!(
            up.seen_at("/hold").len(),
            1,
            "nothing forwarded during the lease"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        r = post(gw.addr, "/hold", Some("h-1"), "{}").await;
    }
    let seen = up.seen_at("/hold");
    match on_unknown {
        "reforward" => {
            assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
            assert_eq!(seen.len(), 2, "forwarded once more after the lease");
            assert_eq!(seen[0].key(), seen[1].key(), "with the same derived key");
            let replay = post(gw.addr, "/hold", Some("h-1"), "{}").await;
            assert!(replay.replayed());
            assert_eq!(replay.body, r.body);
        }
        _ => {
            assert_eq!(r.status, 409, "{}", String::from_utf8_lossy(&r.body));
            assert_eq!(
                r.problem_type(),
                "https://idem.dev/problems/outcome-unknown"
            );
            assert_eq!(seen.len(), 1, "never forwarded again by itself");
            let again = post(gw.addr, "/hold", Some("h-1"), "{}").await;
            assert_eq!(again.status, 409);
            // The operator: show, then resolve as not sent.
            let show = crate::idem_cli(&[
                "keys",
                "show",
                "--database-url",
                &db.url(),
                "--operation",
                "hold",
                "h-1",
            ]);
            assert!(
                show.status.success(),
                "{}",
                String::from_utf8_lossy(&show.stderr)
            );
            let shown: Value = serde_json::from_slice(&show.stdout).unwrap();
            assert_eq!(
                (shown["state"].as_str(), shown["abandoned"].as_bool()),
                (Some("pending"), Some(true))
            );
            let resolved = crate::idem_cli(&[
                "keys",
                "resolve",
                "--database-url",
                &db.url(),
                "--operation",
                "hold",
                "h-1",
                "--as",
                "not-sent",
            ]);
            assert!(
                resolved.status.success(),
                "{}",
                String::from_utf8_lossy(&resolved.stderr)
            );
            let twice = crate::idem_cli(&[
                "keys",
                "resolve",
                "--database-url",
                &db.url(),
                "--operation",
                "hold",
                "h-1",
                "--as",
                "sent",
            ]);
            assert_eq!(twice.status.code(), Some(1), "nothing left to resolve");
            let after = post(gw.addr, "/hold", Some("h-1"), "{}").await;
            assert_eq!(after.status, 201);
            let seen = up.seen_at("/hold");
            assert_eq!(seen.len(), 2);
            assert_eq!(seen[0].key(), seen[1].key(), "the same derived key");
        }
    }
    println!(
        "gateway killed mid-forward ({on_unknown}): in_flight_answers={in_flight} forwards={} same_key=true",
        up.seen_at("/hold").len()
    );
}

/// `idem-client` through the gateway: the upstream's 503s, which the route
/// names as not processed, are retried with the client's one key; the
/// gateway forwards one derived key each time; one effect, and the same
/// intent sent again is a replay.
pub async fn a_retrying_client_through_the_gateway(db: ShopDb) {
    let up = Upstream::start().await;
    let dir = idem_testkit::TempDir::new("gateway");
    let config = config_file(&dir, &up, "reforward");
    let gw = gateway(&db, &config, None).await;
    let mut policy = idem_client::RetryPolicy::default();
    policy.initial_backoff = Duration::from_millis(20);
    let client = idem_client::Client::builder()
        .retry_policy(policy)
        .build(&format!("http://{}", gw.addr))
        .unwrap();
    let intent = client.post("/flaky").json(&json!({"amount": 7}));
    let first = intent.send().await.unwrap();
    assert_eq!(first.status.as_u16(), 201);
    assert_eq!(first.attempts, 3, "two 503s retried");
    assert!(!first.replayed);
    let again = intent.send().await.unwrap();
    assert!(again.replayed, "the same intent is a replay");
    assert_eq!(again.body, first.body);
    assert_eq!(up.effects(), 1);
    let keys: Vec<_> = up
        .seen_at("/flaky")
        .iter()
        .map(|s| s.key().unwrap().to_owned())
        .collect();
    assert_eq!(keys.len(), 3);
    assert!(
        keys.iter().all(|k| *k == keys[0]),
        "one derived key for one intent"
    );
}

/// On a `reject` route an upstream that times out may have acted: the key
/// is kept, and the retry gets outcome-unknown, never a second forward.
pub async fn a_timeout_on_a_reject_route_keeps_the_key(db: ShopDb) {
    let up = Upstream::start().await;
    let dir = idem_testkit::TempDir::new("gateway");
    let config = config_file(&dir, &up, "reject");
    let gw = gateway(&db, &config, None).await;
    up.hold();
    let first = post(gw.addr, "/hold", Some("t-1"), "{}").await;
    assert_eq!(
        first.status,
        504,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    assert!(
        first.json()["detail"]
            .as_str()
            .unwrap()
            .contains("outcome-unknown")
    );
    up.open();
    let retry = post(gw.addr, "/hold", Some("t-1"), "{}").await;
    assert_eq!(
        retry.status,
        409,
        "{}",
        String::from_utf8_lossy(&retry.body)
    );
    assert_eq!(
        retry.problem_type(),
        "https://idem.dev/problems/outcome-unknown"
    );
    assert_eq!(
        up.seen_at("/hold").len(),
        1,
        "never forwarded again by itself"
    );
}

/// Two gateways on one PostgreSQL: concurrent requests with one key spread
/// over both make one effect.
pub async fn two_gateways_on_postgres() {
    let db = ShopDb::postgres().await;
    let up = Upstream::start().await;
    let dir = idem_testkit::TempDir::new("gateway");
    let config = config_file(&dir, &up, "reforward");
    let (a, b) = (
        gateway(&db, &config, None).await,
        gateway(&db, &config, None).await,
    );
    for round in 0..5 {
        let key = format!("two-{round}");
        let mut tasks = Vec::new();
        for i in 0..20 {
            let addr = if i % 2 == 0 { a.addr } else { b.addr };
            let key = key.clone();
            tasks.push(tokio::spawn(async move {
                post(addr, "/v1/payments", Some(&key), r#"{"amount":1}"#)
                    .await
                    .status
            }));
        }
        for t in tasks {
            let s = t.await.unwrap();
            assert!(s == 201 || s == 409, "{s}");
        }
        assert_eq!(
            up.effects(),
            round + 1,
            "one effect per key over two gateways"
        );
    }
    println!(
        "two gateways on postgres: keys=5 requests=100 effects={}",
        up.effects()
    );
}

on_both! {
    contract;
    concurrency;
    upstream_failures;
    killed_mid_forward_reforward;
    killed_mid_forward_reject;
    a_retrying_client_through_the_gateway;
    a_timeout_on_a_reject_route_keeps_the_key;
}

async fn killed_mid_forward_reforward(db: ShopDb) {
    killed_mid_forward(db, "reforward").await;
}

async fn killed_mid_forward_reject(db: ShopDb) {
    killed_mid_forward(db, "reject").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_share_one_postgres() {
    two_gateways_on_postgres().await;
}
