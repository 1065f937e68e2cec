//! `idem drill` against small servers that behave like the third-party
//! idempotency middlewares it was tried on: a racy GET-then-SET cache, a
//! fingerprint of the body's bytes, keys kept in a UUID column, 500s for a
//! request racing its twin, another replay header, an optional key, a replay
//! that loses its `Content-Encoding`. Each server counts its effects itself
//! (the probe), and every round's verdict must agree with that count: a
//! contract FAIL exactly where the probe saw other than one effect. A server
//! right on every effect but different in conventions exits 0 (exit 1 only
//! with `--strict`).

use std::collections::HashMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

use crate::drill_runner::{drill, drill_args, drill_named, outcome, report};

/// How the key is claimed.
#[derive(Clone, Copy, PartialEq)]
enum Claim {
    /// A lock per key: the second request waits for nothing, it is refused.
    Atomic,
    /// GET then SET with no lock in between, for every `n`-th new key (the
    /// others atomic): a race passes now and then, not every time.
    GetThenSetEvery(u32),
}

/// What the fingerprint reads.
#[derive(Clone, Copy, PartialEq)]
enum Fingerprint {
    Json,
    Bytes,
}

/// How answers are encoded when the client accepts gzip.
#[derive(Clone, Copy, PartialEq)]
enum Gzip {
    Off,
    On,
    /// The replay sends the stored gzip bytes without `Content-Encoding`.
    LostOnReplay,
}

#[derive(Clone, Copy)]
struct Behaviour {
    claim: Claim,
    fingerprint: Fingerprint,
    /// Keys live in a UUID column: any other key is a 500.
    uuid_keys: bool,
    /// Requests without a key (or with an empty one) run unkeyed.
    key_optional: bool,
    /// Whether malformed keys (long, control characters) are refused.
    validate_keys: bool,
    /// The answer to a request racing its twin in flight.
    busy_status: u16,
    /// The answer to a bad key.
    bad_key_status: u16,
    /// The answer to another payload under a used key.
    mismatch_status: u16,
    /// The replay header's name.
    marker: &'static str,
    gzip: Gzip,
    /// How long the payment takes.
    work: Duration,
    /// The key is freed when the client disconnects mid-request, while the
    /// payment goes on (a middleware that cleans up on cancellation).
    release_on_disconnect: bool,
    /// Each replay queues a job that makes a second payment a little later
    /// (the answer itself is right).
    late_duplicate: bool,
    /// A finished key answers every later request with this status and the
    /// first body, whatever the payload (as `django-idempotency-key` does by
    /// default with `409`): a retry never gets its answer.
    replay_status: Option<u16>,
}

/// The defaults: a correct server with the usual conventions.
const CORRECT: Behaviour = Behaviour {
    claim: Claim::Atomic,
    fingerprint: Fingerprint::Json,
    uuid_keys: false,
    key_optional: false,
    validate_keys: true,
    busy_status: 409,
    bad_key_status: 400,
    mismatch_status: 422,
    marker: "idempotent-replayed",
    gzip: Gzip::Off,
    work: Duration::from_millis(20),
    release_on_disconnect: false,
    late_duplicate: false,
    replay_status: None,
};

enum Entry {
    InFlight,
    Done {
        fingerprint: Vec<u8>,
        status: u16,
        body: Vec<u8>,
        gzip: bool,
    },
}

#[derive(Default)]
struct Store {
    keys: HashMap<String, Entry>,
    /// Per key first seen: whether it is claimed GET-then-SET.
    racy: HashMap<String, bool>,
    new_keys: u32,
    /// The effects: one customer per payment.
    payments: Vec<String>,
}

#[derive(Clone)]
struct Peer {
    behaviour: Behaviour,
    store: Arc<Mutex<Store>>,
}

impl Peer {
    async fn start(behaviour: Behaviour) -> (Peer, SocketAddr) {
        let peer = Peer {
            behaviour,
            store: Arc::default(),
        };
        let app = Router::new()
            .route("/v1/payments", post(create).get(list))
            .with_state(peer.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (peer, addr)
    }

    /// The probe: effects of `customer`, counted by the server itself.
    fn effects(&self, customer: &str) -> u64 {
        let store = self.store.lock().unwrap();
        store.payments.iter().filter(|c| *c == customer).count() as u64
    }
}

async fn list(State(peer): State<Peer>, Query(q): Query<HashMap<String, String>>) -> Response {
    let customer = q.get("customer").cloned().unwrap_or_default();
    let store = peer.store.lock().unwrap();
    let data: Vec<Value> = store
        .payments
        .iter()
        .enumerate()
        .filter(|(_, c)| **c == customer)
        .map(|(i, c)| json!({"id": format!("pay_{i}"), "customer": c}))
        .collect();
    answer(
        200,
        json!({ "data": data }).to_string().as_bytes(),
        false,
        None,
    )
}

fn answer(status: u16, body: &[u8], gzip: bool, marker: Option<&str>) -> Response {
    let mut res = (
        StatusCode::from_u16(status).unwrap(),
        [(header::CONTENT_TYPE, "application/json")],
        body.to_vec(),
    )
        .into_response();
    if gzip {
        res.headers_mut()
            .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    if let Some(name) = marker {
        res.headers_mut().insert(
            name.parse::<header::HeaderName>().unwrap(),
            HeaderValue::from_static("true"),
        );
    }
    res
}

fn problem(status: u16, title: &str) -> Response {
    answer(
        status,
        json!({ "title": title }).to_string().as_bytes(),
        false,
        None,
    )
}

fn gzipped(body: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(body).unwrap();
    gz.finish().unwrap()
}

/// The payment itself: the handler's work takes a moment, the window of a
/// GET-then-SET race.
async fn charge(peer: &Peer, customer: &str) -> Vec<u8> {
    tokio::time::sleep(peer.behaviour.work).await;
    let mut store = peer.store.lock().unwrap();
    store.payments.push(customer.to_owned());
    let id = store.payments.len();
    json!({"id": format!("pay_{id}"), "customer": customer, "status": "succeeded"})
        .to_string()
        .into_bytes()
}

async fn create(State(peer): State<Peer>, headers: HeaderMap, body: Bytes) -> Response {
    let b = peer.behaviour;
    let Ok(json) = serde_json::from_slice::<Value>(&body) else {
        return problem(400, "the body is not JSON");
    };
    let customer = json["customer"].as_str().unwrap_or_default().to_owned();
    let keys: Vec<&HeaderValue> = headers.get_all("idempotency-key").iter().collect();
    let key = match keys.as_slice() {
        [] => None,
        [k] => Some(String::from_utf8_lossy(k.as_bytes()).into_owned()),
        _ => return problem(b.bad_key_status, "one Idempotency-Key, please"),
    };
    let key = key.filter(|k| !(k.is_empty() && b.key_optional));
    let Some(key) = key else {
        if b.key_optional {
            return answer(201, &charge(&peer, &customer).await, false, None);
        }
        return problem(b.bad_key_status, "Idempotency-Key is required");
    };
    if b.validate_keys && (key.is_empty() || key.len() > 255 || key.chars().any(char::is_control)) {
        return problem(b.bad_key_status, "a malformed Idempotency-Key");
    }
    if b.uuid_keys && uuid::Uuid::parse_str(&key).is_err() {
        // As a UUID column answers a string that is not one.
        return problem(500, "invalid input syntax for type uuid");
    }
    let fingerprint = match b.fingerprint {
        Fingerprint::Bytes => body.to_vec(),
        Fingerprint::Json => canonical(&json).into_bytes(),
    };
    let gzip = b.gzip != Gzip::Off
        && headers
            .get(header::ACCEPT_ENCODING)
            .is_some_and(|v| v.to_str().unwrap_or_default().contains("gzip"));
    if let Some(early) = claim(&peer, &key, &fingerprint, &customer) {
        return early;
    }
    // The payment runs to its end whatever happens to the request (hyper
    // drops a request's future when its client goes away).
    let finish = move |peer: &Peer, key: String, sent: Vec<u8>| {
        let entry = Entry::Done {
            fingerprint,
            status: 201,
            body: sent,
            gzip,
        };
        peer.store.lock().unwrap().keys.insert(key, entry);
    };
    let sent = if b.release_on_disconnect {
        // The middleware records the answer in the request's future, and
        // frees the key if that future is dropped: the payment goes on.
        let release = Release {
            peer: peer.clone(),
            key: Some(key.clone()),
        };
        let task = {
            let peer = peer.clone();
            tokio::spawn(async move { charge(&peer, &customer).await })
        };
        let plain = task.await.unwrap();
        let sent = if gzip { gzipped(&plain) } else { plain };
        finish(&peer, key, sent.clone());
        release.disarm();
        sent
    } else {
        let peer = peer.clone();
        tokio::spawn(async move {
            let plain = charge(&peer, &customer).await;
            let sent = if gzip { gzipped(&plain) } else { plain };
            finish(&peer, key, sent.clone());
            sent
        })
        .await
        .unwrap()
    };
    answer(201, &sent, gzip, None)
}

/// Frees an in-flight key when dropped armed.
struct Release {
    peer: Peer,
    key: Option<String>,
}

impl Release {
    fn disarm(mut self) {
        self.key = None;
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let mut store = self.peer.store.lock().unwrap();
            if matches!(store.keys.get(&key), Some(Entry::InFlight)) {
                store.keys.remove(&key);
            }
        }
    }
}

/// Claims `key`: the stored answer or a refusal to send at once, or `None`
/// to run the request (claimed in flight, unless the key races).
fn claim(peer: &Peer, key: &str, fingerprint: &[u8], customer: &str) -> Option<Response> {
    let b = peer.behaviour;
    let mut store = peer.store.lock().unwrap();
    if !store.racy.contains_key(key) {
        store.new_keys += 1;
        let racy = match b.claim {
            Claim::Atomic => false,
            Claim::GetThenSetEvery(n) => store.new_keys.is_multiple_of(n),
        };
        store.racy.insert(key.to_owned(), racy);
    }
    let racy = store.racy[key];
    match store.keys.get(key) {
        Some(Entry::Done {
            fingerprint: f,
            status,
            body,
            gzip,
        }) => Some(if let Some(refused) = b.replay_status {
            answer(refused, body, *gzip && b.gzip == Gzip::On, None)
        } else if f != fingerprint {
            problem(b.mismatch_status, "another request under this key")
        } else {
            if b.late_duplicate {
                let (peer, customer) = (peer.clone(), customer.to_owned());
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    peer.store.lock().unwrap().payments.push(customer);
                });
            }
            answer(*status, body, *gzip && b.gzip == Gzip::On, Some(b.marker))
        }),
        Some(Entry::InFlight) => Some(problem(b.busy_status, "in flight")),
        // GET then SET: nothing written until the request is done.
        None if racy => None,
        None => {
            store.keys.insert(key.to_owned(), Entry::InFlight);
            None
        }
    }
}

/// JSON with object keys sorted, so field order does not count.
fn canonical(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let fields: Vec<String> = keys
                .iter()
                .map(|k| format!("{}:{}", Value::String((*k).clone()), canonical(&m[*k])))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(canonical).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}

/// Runs the drill against `addr` with `extra` flags: exit status, report.
async fn run(addr: SocketAddr, extra: &[&str]) -> (Option<i32>, Value) {
    let mut args = drill_args(addr);
    args.extend(["--json", "--concurrency", "20"].map(String::from));
    args.extend(extra.iter().map(|s| s.to_string()));
    let out = drill(args).await;
    (out.status.code(), report(&out))
}

/// Every round of the drills run in rounds that count one case's effects
/// after a retry: a contract FAIL exactly where the server's own count is
/// other than one effect, and the effects the drill reports are the
/// server's.
fn assert_rounds_agree_with_the_probe(peer: &Peer, r: &Value) {
    for name in [
        "lost-response",
        "abandoned-request",
        "concurrency",
        "key-reuse",
        "reordered-fields",
    ] {
        let rounds = &drill_named(r, name)["rounds"];
        let each = rounds["each"].as_array().unwrap();
        assert_eq!(each.len() as u64, rounds["run"].as_u64().unwrap());
        for round in each {
            let probe = peer.effects(round["unique"].as_str().unwrap());
            assert_eq!(round["effects"], probe, "{name}: {round}");
            if probe != 1 {
                assert_eq!(round["outcome"], "fail", "{name}: {round}");
            } else {
                assert_ne!(round["outcome"], "fail", "{name}, one effect: {round}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_then_set_race_that_passes_now_and_then_fails_over_five_rounds() {
    let (peer, addr) = Peer::start(Behaviour {
        claim: Claim::GetThenSetEvery(3),
        ..CORRECT
    })
    .await;
    let (code, r) = run(addr, &[]).await;
    assert_eq!(code, Some(1), "{r:#}");
    assert_eq!(r["result"], "fail");
    assert_eq!(outcome(&r, "concurrency"), "fail", "{r:#}");
    let rounds = &drill_named(&r, "concurrency")["rounds"];
    let failed = rounds["failed"].as_u64().unwrap();
    assert!(
        (1..5).contains(&failed),
        "every third key races: some rounds pass, one sample could have passed: {rounds}"
    );
    let summary = drill_named(&r, "concurrency")["summary"].as_str().unwrap();
    assert!(
        summary.contains(&format!("{failed} of 5 rounds failed")),
        "{summary}"
    );
    assert_rounds_agree_with_the_probe(&peer, &r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_right_on_every_effect_but_not_the_conventions_exits_0_unless_strict() {
    let behaviour = Behaviour {
        fingerprint: Fingerprint::Bytes,
        key_optional: true,
        validate_keys: false,
        busy_status: 500,
        bad_key_status: 422,
        mismatch_status: 417,
        marker: "idempotency-replayed",
        ..CORRECT
    };
    let (peer, addr) = Peer::start(behaviour).await;
    let (code, r) = run(addr, &[]).await;
    assert_eq!(code, Some(0), "{r:#}");
    assert_eq!(r["result"], "warn", "{r:#}");
    assert_eq!(r["counts"]["fail"], 0, "{r:#}");
    assert_rounds_agree_with_the_probe(&peer, &r);
    for name in ["baseline", "lost-response"] {
        assert_eq!(outcome(&r, name), "pass", "{name}: {r:#}");
    }
    let warned = |name: &str, words: &str| {
        assert_eq!(outcome(&r, name), "warn", "{name}: {r:#}");
        let summary = drill_named(&r, name)["summary"].as_str().unwrap();
        assert!(summary.contains(words), "{name}: {summary}");
        assert!(!summary.contains("effects from a request"), "{summary}");
    };
    warned("concurrency", "server errors seen");
    warned("key-reuse", "417");
    warned("reordered-fields", "bytes");
    warned("duplicate-key", "422");
    warned("long-key", "none repeated");
    for name in ["missing-key", "empty-key"] {
        assert_eq!(outcome(&r, name), "info", "{name}: optional key: {r:#}");
    }
    let marker = drill_named(&r, "replay-marker")["summary"]
        .as_str()
        .unwrap();
    assert!(marker.contains("Idempotency-Replayed: true"), "{marker}");

    let (code, r) = run(addr, &["--strict"]).await;
    assert_eq!(code, Some(1), "--strict: {r:#}");
    assert_eq!((&r["result"], &r["strict"]), (&"fail".into(), &true.into()));
    assert_eq!(r["counts"]["fail"], 0, "still no contract failure: {r:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uuid_only_keys_need_a_key_format_and_the_baseline_says_so() {
    let (peer, addr) = Peer::start(Behaviour {
        uuid_keys: true,
        key_optional: true,
        ..CORRECT
    })
    .await;
    let (code, r) = run(addr, &[]).await;
    assert_eq!(code, Some(1), "{r:#}");
    assert_eq!(outcome(&r, "baseline"), "fail");
    let summary = drill_named(&r, "baseline")["summary"].as_str().unwrap();
    assert!(
        summary.contains("key's format") && summary.contains("--key-format uuid"),
        "{summary}"
    );
    assert_eq!(outcome(&r, "concurrency"), "skip", "the rest is skipped");

    let (code, r) = run(addr, &["--key-format", "uuid"]).await;
    assert_eq!(code, Some(0), "{r:#}");
    assert_eq!(r["counts"]["fail"], 0, "{r:#}");
    for name in [
        "baseline",
        "lost-response",
        "concurrency",
        "key-reuse",
        "reordered-fields",
    ] {
        assert_eq!(outcome(&r, name), "pass", "{name}: {r:#}");
    }
    assert_rounds_agree_with_the_probe(&peer, &r);
    // A template works the same way.
    let (code, r) = run(addr, &["--key-format", "{uuid}", "--rounds", "2"]).await;
    assert_eq!(code, Some(0), "{r:#}");
    assert_eq!(drill_named(&r, "concurrency")["rounds"]["run"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_that_loses_its_content_encoding_fails_lost_response() {
    let (peer, addr) = Peer::start(Behaviour {
        gzip: Gzip::LostOnReplay,
        ..CORRECT
    })
    .await;
    let (code, r) = run(addr, &["--rounds", "2"]).await;
    assert_eq!(code, Some(1), "{r:#}");
    assert_eq!(outcome(&r, "lost-response"), "fail", "{r:#}");
    let summary = drill_named(&r, "lost-response")["summary"]
        .as_str()
        .unwrap();
    assert!(summary.contains("without Content-Encoding"), "{summary}");
    for round in drill_named(&r, "lost-response")["rounds"]["each"]
        .as_array()
        .unwrap()
    {
        assert_eq!(
            peer.effects(round["unique"].as_str().unwrap()),
            1,
            "one effect: the answer is what broke"
        );
    }

    // The control: the same server keeping its Content-Encoding passes.
    let (_, addr) = Peer::start(Behaviour {
        gzip: Gzip::On,
        ..CORRECT
    })
    .await;
    let (code, r) = run(addr, &["--rounds", "2"]).await;
    assert_eq!(code, Some(0), "{r:#}");
    assert_eq!(r["result"], "pass", "{r:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_freed_when_the_client_gives_up_fails_abandoned_request() {
    let slow = Duration::from_millis(300);
    let (peer, addr) = Peer::start(Behaviour {
        release_on_disconnect: true,
        work: slow,
        ..CORRECT
    })
    .await;
    let (code, r) = run(addr, &["--rounds", "2"]).await;
    assert_eq!(code, Some(1), "{r:#}");
    assert_eq!(outcome(&r, "abandoned-request"), "fail", "{r:#}");
    assert_eq!(
        outcome(&r, "lost-response"),
        "pass",
        "the answer came: {r:#}"
    );
    for round in drill_named(&r, "abandoned-request")["rounds"]["each"]
        .as_array()
        .unwrap()
    {
        let probe = peer.effects(round["unique"].as_str().unwrap());
        assert_eq!(probe, 2, "the first payment and the retry's: {round}");
        assert_eq!(round["effects"], probe);
    }

    // The control: a slow target that keeps the key through a disconnect.
    let (peer, addr) = Peer::start(Behaviour {
        work: slow,
        ..CORRECT
    })
    .await;
    let (code, r) = run(addr, &["--rounds", "2"]).await;
    assert_eq!(code, Some(0), "{r:#}");
    assert_eq!(outcome(&r, "abandoned-request"), "pass", "{r:#}");
    assert_rounds_agree_with_the_probe(&peer, &r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_made_after_the_answers_is_caught_by_counting_again() {
    let (peer, addr) = Peer::start(Behaviour {
        late_duplicate: true,
        ..CORRECT
    })
    .await;
    let (code, r) = run(addr, &["--rounds", "2"]).await;
    assert_eq!(code, Some(1), "{r:#}");
    let settled = r["settled"].as_str().unwrap();
    assert!(settled.contains("grew"), "{settled}");
    let lost = drill_named(&r, "lost-response");
    assert_eq!(lost["outcome"], "fail", "{lost:#}");
    assert!(
        lost["summary"]
            .as_str()
            .unwrap()
            .contains("a duplicate made late"),
        "{lost:#}"
    );
    for round in lost["rounds"]["each"].as_array().unwrap() {
        let probe = peer.effects(round["unique"].as_str().unwrap());
        assert!(probe > 1, "the replays' jobs ran: {round}");
        assert_eq!(round["effects"], probe, "{round}");
        assert_eq!(round["outcome"], "fail", "{round}");
    }
    assert_eq!(lost["rounds"]["failed"], 2);

    // Without counting again, the same target looks right: what --settle is for.
    let (code, r) = run(addr, &["--rounds", "2", "--settle", "0s"]).await;
    assert_eq!(code, Some(0), "{r:#}");
    assert!(r["settled"].is_null());
}

/// A server that answers `409` with the first body to every request after
/// the first with a key, forever (`django-idempotency-key`'s default): the
/// first request finished — the target began answering before the drill's
/// proxy dropped the answer — so the `409` is no "still in flight", and a
/// retrying client never gets its answer: a contract FAIL, with one effect.
/// While the first request is still running (the client gave up before any
/// answer), the same `409`s stay inconclusive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_answered_409_forever_fails_lost_response() {
    let forever = Behaviour {
        replay_status: Some(409),
        ..CORRECT
    };
    let (peer, addr) = Peer::start(forever).await;
    // One round: each drill's retries wait out their pauses (about 6 s)
    // against a server that never answers them.
    let (code, r) = run(addr, &["--rounds", "1"]).await;
    let lost = drill_named(&r, "lost-response");
    assert_eq!(lost["outcome"], "fail", "{lost:#}");
    assert_eq!(code, Some(1), "{r:#}");
    let summary = lost["summary"].as_str().unwrap();
    assert!(
        summary.contains("began answering") && summary.contains("409"),
        "{summary}"
    );
    let evidence = lost["evidence"].to_string();
    assert!(
        evidence.contains("the target started answering"),
        "{evidence}"
    );
    for name in ["lost-response", "abandoned-request", "concurrency"] {
        for round in drill_named(&r, name)["rounds"]["each"].as_array().unwrap() {
            let probe = peer.effects(round["unique"].as_str().unwrap());
            assert_eq!(probe, 1, "one effect: the answer is what is lost: {round}");
            assert_eq!(round["effects"], probe, "{name}: {round}");
        }
    }
    for round in lost["rounds"]["each"].as_array().unwrap() {
        assert_eq!(round["outcome"], "fail", "{round}");
    }
    // abandoned-request: the 20 ms payment answers before the client's
    // 50 ms patience runs out, so a round is a lost answer again (FAIL);
    // a round where the client gave up first stays inconclusive (WARN).
    for round in drill_named(&r, "abandoned-request")["rounds"]["each"]
        .as_array()
        .unwrap()
    {
        let s = round["summary"].as_str().unwrap();
        match round["outcome"].as_str().unwrap() {
            "fail" => assert!(s.contains("began answering"), "{round}"),
            "warn" => assert!(s.contains("inconclusive"), "{round}"),
            other => panic!("{other}: {round}"),
        }
    }
    // The race answered one 2xx: the retry after it, 409 forever, is the
    // same lost answer.
    assert_eq!(outcome(&r, "concurrency"), "fail", "{r:#}");
    for name in ["lost-response", "abandoned-request", "concurrency"] {
        println!(
            "409 forever: {name} {}",
            drill_named(&r, name)["summary"].as_str().unwrap()
        );
    }

    // A slow payment (300 ms): the client of abandoned-request gives up
    // before any answer, while it runs; its retries' 409s cannot tell a
    // request still running from one that will never answer: WARN, as
    // before. lost-response waits for the answer to begin: FAIL.
    let (peer, addr) = Peer::start(Behaviour {
        work: Duration::from_millis(300),
        ..forever
    })
    .await;
    let (code, r) = run(addr, &["--rounds", "1"]).await;
    assert_eq!(code, Some(1), "{r:#}");
    assert_eq!(outcome(&r, "lost-response"), "fail", "{r:#}");
    let abandoned = drill_named(&r, "abandoned-request");
    assert_eq!(abandoned["outcome"], "warn", "{abandoned:#}");
    assert!(
        abandoned["summary"]
            .as_str()
            .unwrap()
            .contains("inconclusive"),
        "{abandoned:#}"
    );
    for round in abandoned["rounds"]["each"].as_array().unwrap() {
        assert_eq!(peer.effects(round["unique"].as_str().unwrap()), 1);
    }
}

/// A `409` followed by the first answer is a PASS, however late within the
/// retries: a payment of 4.5 s outlasts the first retry's pauses (about
/// 3.1 s) after the client of abandoned-request gave up at 50 ms; the second
/// retry gets the answer, and a third is compared with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_409_followed_by_the_first_answer_passes_even_late() {
    let (peer, addr) = Peer::start(Behaviour {
        work: Duration::from_millis(4500),
        ..CORRECT
    })
    .await;
    let (code, r) = run(addr, &["--rounds", "1", "--settle", "0s"]).await;
    assert_eq!(code, Some(0), "{r:#}");
    let abandoned = drill_named(&r, "abandoned-request");
    assert_eq!(abandoned["outcome"], "pass", "{abandoned:#}");
    let evidence = abandoned["evidence"].to_string();
    assert!(
        evidence.contains("the client gave up") && evidence.contains("retry 1: 409 "),
        "the first retry ended on a 409: {evidence}"
    );
    assert!(
        evidence.contains("retry 3: the same status and body"),
        "{evidence}"
    );
    assert_rounds_agree_with_the_probe(&peer, &r);
}
