//! The gateway at the boundary with an upstream it does not own: an
//! outcome that may have landed is never forwarded again blindly, an
//! upstream's "still running" is never stored, a replay is readable by
//! every client, and the answer bytes held for slow readers stay within
//! their budget. The upstream is [`Upstream`], deliberately not idempotent
//! (but for `/dedupe`); what it received is the evidence.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::checkout::ShopDb;
use crate::gateway::{Upstream, gateway, post};
use crate::process::Server;
use crate::{Reply, exchange};

const UNKNOWN: &str = "https://idem.dev/problems/outcome-unknown";
const IN_FLIGHT: &str = "https://idem.dev/problems/request-in-flight";

/// A `--config` file: the `[gateway]` table (`upstream` set) with `extra`
/// lines, then `routes` as written.
fn config(dir: &idem_testkit::TempDir, up: &Upstream, extra: &str, routes: &str) -> String {
    let path = dir.path().join("gateway.toml");
    std::fs::write(
        &path,
        format!("[gateway]\nupstream = \"{}\"\n{extra}\n{routes}", up.url()),
    )
    .unwrap();
    path.display().to_string()
}

fn body_of(r: &Reply) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// `--upstream URL` alone, in front of an upstream that commits each
/// key's first POST and loses its answer: the first try gets 502 saying
/// the key is kept, every retry 409 `outcome-unknown`; `idem-client`
/// retries the 502 and stops at the 409. One effect per intent.
pub async fn a_default_gateway_never_forwards_a_lost_answer_again(db: ShopDb) {
    let up = Upstream::start().await;
    let gw = Server::start(&db.url(), &["--upstream", &up.url()]).await;
    let intents = 5;
    for i in 0..intents {
        let key = format!("lost-{i}");
        let body = format!(r#"{{"amount":{i},"reference":"r-{i}"}}"#);
        let first = post(gw.addr, "/lose", Some(&key), &body).await;
        assert_eq!(first.status, 502, "{}", body_of(&first));
        assert!(
            body_of(&first).contains("409 outcome-unknown"),
            "{}",
            body_of(&first)
        );
        for _ in 0..3 {
            let retry = post(gw.addr, "/lose", Some(&key), &body).await;
            assert_eq!(retry.status, 409, "{}", body_of(&retry));
            assert_eq!(retry.problem_type(), UNKNOWN);
            assert!(
                retry.header("retry-after").is_none(),
                "held for an operator"
            );
        }
    }
    // A real retrying client: the 502 is retried, the 409 is its answer.
    let client = idem_client::Client::builder()
        .build(&format!("http://{}", gw.addr))
        .unwrap();
    let answer = client
        .post("/lose")
        .json(&json!({"amount": 9, "reference": "r-client"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        answer.status.as_u16(),
        409,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    assert!(answer.attempts >= 2, "the 502 was retried");
    assert_eq!(up.effects(), intents + 1, "one effect per intent");
    assert_eq!(
        up.seen_at("/lose").len(),
        intents + 1,
        "each forwarded once"
    );
    println!(
        "default gateway, lost answers: intents={} forwards={} effects={} client_attempts={}",
        intents + 1,
        up.seen_at("/lose").len(),
        up.effects(),
        answer.attempts
    );
}

const VERIFY_ROUTES: &str = r#"
[[gateway.routes]]
method = "POST"
path = "/{kind}"
operation = "verified"
on_unknown = "verify"
verify = "GET /v1/payments?reference={/reference}"
verify_found = "/data/0"
verify_status = 201
landing = "1s"
lease = "1s"

[[gateway.routes]]
method = "POST"
path = "/act-then/{status}"
operation = "verified-broken-lookup"
on_unknown = "verify"
verify = "GET /v1/payments/broken?reference={/reference}"
landing = "1s"
"#;

/// `on_unknown = "verify"`: a lost answer is found by the lookup and
/// answered (then replayed); a request that did not land is forwarded
/// again only after the landing window; a lookup that fails keeps the
/// outcome unknown; a request the lookup could not find is refused
/// before anything is sent.
pub async fn a_verify_route_finds_what_landed_and_forwards_again_only_what_did_not(db: ShopDb) {
    let up = Upstream::start().await;
    let dir = idem_testkit::TempDir::new("gateway-verify");
    let gw = gateway(&db, &config(&dir, &up, "", VERIFY_ROUTES), None).await;

    // Landed, answer lost: found and answered at once.
    let body = r#"{"amount":10,"reference":"r-1"}"#;
    let first = post(gw.addr, "/lose", Some("v-1"), body).await;
    assert_eq!(first.status, 201, "{}", body_of(&first));
    assert_eq!(first.json()["reference"], "r-1");
    let replay = post(gw.addr, "/lose", Some("v-1"), body).await;
    assert!(replay.replayed());
    assert_eq!((replay.status, &replay.body), (201, &first.body));
    assert_eq!(up.seen_at("/lose").len(), 1);

    // Did not land: unknown until the landing window passed, then
    // forwarded again, once.
    let body = r#"{"amount":20,"reference":"r-2"}"#;
    let first = post(gw.addr, "/drop", Some("v-2"), body).await;
    let unknown_at = Instant::now();
    assert_eq!(first.status, 502, "{}", body_of(&first));
    assert_eq!(first.header("retry-after").as_deref(), Some("1"));
    let early = post(gw.addr, "/drop", Some("v-2"), body).await;
    if unknown_at.elapsed() < Duration::from_millis(900) {
        assert_eq!(early.status, 409, "{}", body_of(&early));
        assert_eq!(early.problem_type(), UNKNOWN);
        assert!(early.header("retry-after").is_some(), "it resolves itself");
        assert_eq!(
            up.seen_at("/drop").len(),
            1,
            "nothing forwarded within the window"
        );
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let later = post(gw.addr, "/drop", Some("v-2"), body).await;
    assert_eq!(later.status, 201, "{}", body_of(&later));
    assert_eq!(
        up.seen_at("/drop").len(),
        2,
        "forwarded again once it did not land"
    );
    let seen = up.seen_at("/drop");
    assert_eq!(seen[0].key(), seen[1].key(), "with the same derived key");
    assert!(post(gw.addr, "/drop", Some("v-2"), body).await.replayed());

    // The lookup fails: still unknown, never forwarded again.
    let body = r#"{"amount":30,"reference":"r-3"}"#;
    let first = post(gw.addr, "/act-then/500", Some("v-3"), body).await;
    assert_eq!(
        first.status,
        500,
        "the upstream's own answer: {}",
        body_of(&first)
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let retry = post(gw.addr, "/act-then/500", Some("v-3"), body).await;
    assert_eq!(retry.status, 409, "{}", body_of(&retry));
    assert_eq!(retry.problem_type(), UNKNOWN);
    assert!(retry.header("retry-after").is_some());
    assert_eq!(up.seen_at("/act-then/500").len(), 1);

    // Nothing to look up by: refused before anything is sent.
    let r = post(gw.addr, "/lose", Some("v-4"), r#"{"amount":1}"#).await;
    assert_eq!(r.status, 400, "{}", body_of(&r));
    assert_eq!(
        r.problem_type(),
        "https://idem.dev/problems/unverifiable-request"
    );
    assert_eq!(up.effects(), 3, "r-1, r-2 and r-3, once each");
    println!(
        "verify route: found=1 forwarded_again_after_landing=1 lookup_failed=1 effects={}",
        up.effects()
    );
}

/// A `reject` route in front of an upstream that acts, then answers 500,
/// or a 502/503/504 as a load balancer would: three attempts with one key
/// make one effect; the retries get 409 `outcome-unknown`.
pub async fn a_reject_route_keeps_the_key_on_every_5xx(db: ShopDb) {
    let up = Upstream::start().await;
    let dir = idem_testkit::TempDir::new("gateway-5xx");
    let routes = "[[gateway.routes]]\nmethod = \"POST\"\npath = \"/act-then/{status}\"\noperation = \"acts\"\non_unknown = \"reject\"\n";
    let gw = gateway(&db, &config(&dir, &up, "", routes), None).await;
    let codes = [500, 502, 503, 504];
    for code in codes {
        let path = format!("/act-then/{code}");
        let key = format!("k-{code}");
        let first = post(gw.addr, &path, Some(&key), "{}").await;
        assert_eq!(first.status, code, "{}", body_of(&first));
        for _ in 0..2 {
            let retry = post(gw.addr, &path, Some(&key), "{}").await;
            assert_eq!(
                (retry.status, retry.problem_type()),
                (409, UNKNOWN.to_owned())
            );
        }
        assert_eq!(up.seen_at(&path).len(), 1, "{code}: never forwarded again");
    }
    assert_eq!(up.effects(), codes.len(), "one effect per intent");
    println!(
        "reject route, 5xx after acting: intents=4 attempts=12 effects={}",
        up.effects()
    );
}

/// Stripe's contract behind a `reforward` route with a timeout shorter
/// than the upstream: the first try times out (504), a retry while the
/// upstream still works gets its 409 as `request-in-flight` — not stored
/// — and a later retry the upstream's real answer, stored from then on.
pub async fn an_upstream_in_progress_answer_is_never_stored(db: ShopDb) {
    let up = Upstream::start().await;
    up.set_delay(Duration::from_secs(3));
    let dir = idem_testkit::TempDir::new("gateway-transient");
    let routes = "[[gateway.routes]]\nmethod = \"POST\"\npath = \"/dedupe\"\noperation = \"pay\"\non_unknown = \"reforward\"\nlease = \"1s\"\n";
    let gw = gateway(&db, &config(&dir, &up, "timeout = \"1s\"", routes), None).await;
    let started = Instant::now();
    let first = post(gw.addr, "/dedupe", Some("t-1"), r#"{"amount":5}"#).await;
    assert_eq!(first.status, 504, "{}", body_of(&first));
    let mut in_flight = 0;
    let answer = loop {
        let r = post(gw.addr, "/dedupe", Some("t-1"), r#"{"amount":5}"#).await;
        match r.status {
            201 => break r,
            409 => {
                assert_eq!(r.problem_type(), IN_FLIGHT, "{}", body_of(&r));
                assert!(r.header("retry-after").is_some());
                in_flight += 1;
            }
            s => panic!("unexpected {s}: {}", body_of(&r)),
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "never answered"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(
        in_flight >= 1,
        "a retry came while the upstream still worked"
    );
    assert_eq!(answer.json()["amount"], 5);
    let replay = post(gw.addr, "/dedupe", Some("t-1"), r#"{"amount":5}"#).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, answer.body, "the real answer, stored");
    assert_eq!(up.effects(), 1);
    println!(
        "transient 409s: in_flight_answers={in_flight} forwards={} stored=201 effects=1",
        up.seen_at("/dedupe").len()
    );
}

/// An upstream that compresses (when asked, and one that always does):
/// the first answer and the replay are the same readable bytes, to a
/// client that accepted gzip and one that did not; the headers that
/// describe them are replayed.
pub async fn replays_are_the_first_answer_readable_by_every_client(db: ShopDb) {
    let up = Upstream::start().await;
    let dir = idem_testkit::TempDir::new("gateway-gzip");
    let routes = "[[gateway.routes]]\nmethod = \"POST\"\npath = \"/{kind}\"\noperation = \"gz\"\n";
    let gw = gateway(&db, &config(&dir, &up, "", routes), None).await;
    for path in ["/gzip", "/always-gzip"] {
        let key = format!("gz{}", path.replace('/', "-"));
        let ask = |accept: &str| {
            format!(
                "POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: \
                 application/json\r\n{accept}Idempotency-Key: {key}\r\nContent-Length: 12\r\n\r\n\
                 {{\"amount\":7}}"
            )
        };
        let first = exchange(gw.addr, &ask("Accept-Encoding: gzip, deflate\r\n")).await;
        let replay = exchange(gw.addr, &ask("")).await;
        assert!(replay.replayed());
        for r in [&first, &replay] {
            assert_eq!(r.status, 201, "{path}: {}", body_of(r));
            assert!(r.header("content-encoding").is_none(), "{path}: {}", r.head);
            assert_eq!(r.json()["amount"], 7, "{path}: readable");
        }
        assert_eq!(first.body, replay.body);
        if path == "/always-gzip" {
            assert_eq!(replay.header("content-language").as_deref(), Some("en"));
            assert_eq!(replay.header("vary").as_deref(), Some("Accept-Encoding"));
        }
        let seen = up.seen_at(path);
        assert_eq!(seen[0].header("accept-encoding"), Some("identity"));
    }
    assert_eq!(up.effects(), 2);
}

/// An unknown outcome on a `reject` route outlives the key's TTL: a retry
/// long after it still gets 409 (it is never claimed afresh and forwarded
/// blindly), and a gateway restarted with a laxer policy (`reforward`) on
/// the same database honours the record's own.
pub async fn an_unknown_outcome_is_held_past_its_ttl_and_a_policy_change(db: ShopDb) {
    let up = Upstream::start().await;
    let dir = idem_testkit::TempDir::new("gateway-held");
    let route = |policy: &str| {
        format!(
            "[[gateway.routes]]\nmethod = \"POST\"\npath = \"/lose\"\noperation = \"held\"\n\
             on_unknown = \"{policy}\"\nttl = \"2s\"\nlease = \"1s\"\n"
        )
    };
    let mut gw = gateway(
        &db,
        &config(&dir, &up, "timeout = \"500ms\"", &route("reject")),
        None,
    )
    .await;
    let body = r#"{"amount":1,"reference":"held-1"}"#;
    assert_eq!(post(gw.addr, "/lose", Some("h-1"), body).await.status, 502);
    assert_eq!(post(gw.addr, "/lose", Some("h-1"), body).await.status, 409);
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let late = post(gw.addr, "/lose", Some("h-1"), body).await;
    assert_eq!(late.status, 409, "past the TTL: {}", body_of(&late));
    assert_eq!(late.problem_type(), UNKNOWN);
    // The same database, the route now says reforward: the record's reject holds.
    let dir2 = idem_testkit::TempDir::new("gateway-held-2");
    let lax = config(&dir2, &up, "timeout = \"500ms\"", &route("reforward"));
    gw.proc().kill9();
    gw = gateway(&db, &lax, None).await;
    let retry = post(gw.addr, "/lose", Some("h-1"), body).await;
    assert_eq!(retry.status, 409, "{}", body_of(&retry));
    assert_eq!(up.seen_at("/lose").len(), 1, "never forwarded again");
    assert_eq!(up.effects(), 1);
}

/// A gateway killed (`abort` at a failpoint, like `kill -9`) after the
/// upstream acted and before it could write a word about it leaves the key
/// as held as one whose answer was lost: on a `reject` route a retry
/// through another gateway long past the key's TTL, after `idem gc`, still
/// gets 409 `outcome-unknown` and nothing is forwarded again; on a
/// `verify` route the retry takes the key over and finds the payment.
pub async fn a_gateway_killed_mid_forward_leaves_its_key_held(db: ShopDb) {
    let up = Upstream::start().await;
    let dir = idem_testkit::TempDir::new("gateway-killed");
    let routes = r#"
[[gateway.routes]]
method = "POST"
path = "/v1/payments"
operation = "killed"
on_unknown = "reject"
ttl = "2s"
lease = "1s"

[[gateway.routes]]
method = "POST"
path = "/v1/orders/{order}/payments"
operation = "killed-verified"
on_unknown = "verify"
verify = "GET /v1/payments?reference={/reference}"
verify_found = "/data/0"
ttl = "2s"
lease = "1s"
landing = "1s"
"#;
    let file = config(&dir, &up, "timeout = \"500ms\"", routes);
    let (body, verified_body) = (
        r#"{"amount":4,"reference":"killed-1"}"#,
        r#"{"amount":4,"reference":"killed-2"}"#,
    );
    for (path, body) in [
        ("/v1/payments", body),
        ("/v1/orders/o-1/payments", verified_body),
    ] {
        let mut doomed = gateway(&db, &file, Some("gateway.after_forward")).await;
        let lost = crate::try_call(doomed.addr, "POST", path, Some("kk"), body).await;
        assert!(lost.is_err(), "{path}: the gateway died before answering");
        assert!(doomed.proc().exited_within(Duration::from_secs(5)).await);
    }
    assert_eq!(up.effects(), 2, "the upstream acted on both");
    let gw = gateway(&db, &file, None).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let gc = crate::idem_cli(&["gc", "--database-url", &db.url()]);
    assert!(
        gc.status.success(),
        "{}",
        String::from_utf8_lossy(&gc.stderr)
    );
    let held = post(gw.addr, "/v1/payments", Some("kk"), body).await;
    assert_eq!(held.status, 409, "past the TTL: {}", body_of(&held));
    assert_eq!(held.problem_type(), UNKNOWN);
    let verified = post(
        gw.addr,
        "/v1/orders/o-1/payments",
        Some("kk"),
        verified_body,
    )
    .await;
    assert_eq!(verified.status, 200, "found: {}", body_of(&verified));
    assert_eq!(verified.json()["reference"], "killed-2");
    let replay = post(
        gw.addr,
        "/v1/orders/o-1/payments",
        Some("kk"),
        verified_body,
    )
    .await;
    assert!(replay.replayed());
    assert_eq!(replay.body, verified.body);
    assert_eq!(up.seen_at("/v1/payments").len(), 1, "never forwarded again");
    assert_eq!(up.seen_at("/v1/orders/o-1/payments").len(), 1);
    assert_eq!(up.effects(), 2, "one effect per intent");
    println!(
        "killed mid-forward, retried past the TTL after gc: held=409 verified=200 effects={}",
        up.effects()
    );
}

/// Every spelling of a keyed route's path is keyed: a trailing slash, a
/// doubled or dotted segment, an escaped letter or slash, another case, a
/// lowercase method. Each is its own request under the key (422 with a key
/// used on another spelling, 400 without one), and what reaches the
/// upstream is the request as sent with the derived key, never the client's.
pub async fn every_spelling_of_a_keyed_path_is_keyed(db: ShopDb) {
    let up = Upstream::start().await;
    let dir = idem_testkit::TempDir::new("gateway-paths");
    let routes =
        "[[gateway.routes]]\nmethod = \"POST\"\npath = \"/v1/payments\"\noperation = \"pay\"\n";
    let gw = gateway(&db, &config(&dir, &up, "", routes), None).await;
    let body = r#"{"amount":3}"#;
    assert_eq!(
        post(gw.addr, "/v1/payments", Some("pk"), body).await.status,
        201
    );
    for (i, (method, path)) in [
        ("POST", "//v1/payments"),
        ("POST", "/v1/payments/"),
        ("POST", "/v1/./payments"),
        ("POST", "/v1//payments"),
        ("POST", "/v1/%70ayments"),
        ("POST", "/V1/payments"),
        ("POST", "/v1/payments;x"),
        ("POST", "/v1%2Fpayments"),
        ("POST", "/v1%5Cpayments"),
        ("post", "/v1/payments"),
    ]
    .into_iter()
    .enumerate()
    {
        let call = |key: Option<String>| async move {
            crate::call(gw.addr, method, path, key.as_deref(), body).await
        };
        let reused = call(Some("pk".into())).await;
        assert_eq!(reused.status, 422, "{method} {path}: {}", body_of(&reused));
        let keyless = call(None).await;
        assert_eq!(keyless.status, 400, "{method} {path}: the key is required");
        let before = up.seen().len();
        let own = call(Some(format!("pk-{i}"))).await;
        let seen = up.seen();
        assert_eq!(seen.len(), before + 1, "{method} {path}: forwarded once");
        let seen = seen.last().unwrap();
        assert_eq!((&*seen.method, &*seen.path), (method, path), "as sent");
        assert!(
            seen.key().is_some_and(|k| k.starts_with("idem:forward:")),
            "{method} {path}: forwarded with the derived key ({})",
            own.status
        );
    }
    // A `..` above the root (read outside the routes by an upstream with a
    // base path) is refused, keyed or not; nothing is sent.
    let before = up.seen().len();
    for path in ["/../v1/payments", "/%2e%2e/api/v1/payments", "/v1/../../x"] {
        let r = post(gw.addr, path, Some("pk-up"), body).await;
        assert_eq!(r.status, 400, "{path}: {}", body_of(&r));
        assert_eq!(r.problem_type(), "https://idem.dev/problems/invalid-path");
    }
    assert_eq!(up.seen().len(), before, "nothing forwarded");
    assert_eq!(up.effects(), 1, "one payment on the route itself");
}

/// The resident memory of a process, in bytes.
pub(crate) fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

/// Sends `raw` and reads the answer's head only, then stops reading: a
/// client that holds its answer, with a small receive window (as a
/// remote one has; loopback's would take megabytes off the server). The
/// status, and the open socket.
async fn slow_reader(addr: std::net::SocketAddr, raw: String) -> (u16, TcpStream) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(16 << 10).unwrap();
    let mut s = socket.connect(addr).await.unwrap();
    s.write_all(raw.as_bytes()).await.unwrap();
    let mut head = vec![0; 12];
    s.read_exact(&mut head).await.unwrap();
    let status = String::from_utf8_lossy(&head[9..12]).parse().unwrap();
    (status, s)
}

/// Many clients that never read large answers: a pass-through answer is
/// streamed (the gateway holds a little of each), and keyed answers take
/// their bytes from `max_held_bytes` — past it `503 gateway-busy`, nothing
/// sent — so the gateway's memory stays within the budget.
pub async fn answers_held_for_slow_readers_stay_within_the_budget(db: ShopDb) {
    const MIB: usize = 1 << 20;
    let up = Upstream::start().await;
    let dir = idem_testkit::TempDir::new("gateway-memory");
    let routes = format!(
        "[[gateway.routes]]\nmethod = \"POST\"\npath = \"/large\"\noperation = \"large\"\n\
         max_response_bytes = {}\n",
        12 * MIB
    );
    let extra = format!("max_held_bytes = {}", 32 * MIB);
    let mut gw = gateway(&db, &config(&dir, &up, &extra, &routes), None).await;
    let pid = gw.proc().pid();
    // Warm up (pools, allocator) before the baseline.
    let warm = crate::call(gw.addr, "GET", "/large?bytes=1024", None, "").await;
    assert_eq!(warm.status, 200);
    let baseline = rss(pid);

    let readers = 40;
    let mut held = Vec::new();
    for _ in 0..readers {
        let raw = format!(
            "GET /large?bytes={} HTTP/1.1\r\nHost: localhost\r\n\r\n",
            15 * MIB
        );
        let (status, socket) = slow_reader(gw.addr, raw).await;
        assert_eq!(status, 200);
        held.push(socket);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pass_through = rss(pid).saturating_sub(baseline);

    let mut statuses = Vec::new();
    let mut keyed_readers = Vec::new();
    for i in 0..readers {
        let raw = format!(
            "POST /large?bytes={} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Idempotency-Key: big-{i}\r\nContent-Length: 2\r\n\r\n{{}}",
            12 * MIB
        );
        let (status, socket) = slow_reader(gw.addr, raw).await;
        statuses.push(status);
        keyed_readers.push(socket);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let keyed = rss(pid).saturating_sub(baseline + pass_through);
    let created = statuses.iter().filter(|s| **s == 200).count();
    let busy = statuses.iter().filter(|s| **s == 503).count();
    println!(
        "slow readers: pass_through={readers}x15MiB rss_growth={} MiB; keyed={readers}x12MiB \
         budget=32MiB created={created} busy={busy} rss_growth={} MiB",
        pass_through / MIB as u64,
        keyed / MIB as u64
    );
    assert!(
        pass_through < 96 * MIB as u64,
        "streamed pass-through answers are not held: grew {} MiB",
        pass_through / MIB as u64
    );
    assert!(created >= 1 && busy >= 1, "{statuses:?}");
    assert_eq!(created + busy, readers, "{statuses:?}");
    // The budget, and twice as much again for the allocator's slack and
    // the buffers of the forwards as they read (without a budget: 40 x 12
    // MiB held).
    assert!(
        keyed < 96 * MIB as u64,
        "keyed answers within the budget: grew {} MiB",
        keyed / MIB as u64
    );
    // Refused before anything was sent: only admitted forwards reached it.
    let sent = up.seen_at("/large?bytes=12582912").len();
    assert_eq!(sent, created, "a refusal sends nothing");
    // An upstream's 5xx (an unknown outcome, passed on) holds its bytes too.
    drop(keyed_readers);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before_5xx = rss(pid);
    let mut failed = 0;
    for i in 0..readers {
        let raw = format!(
            "POST /large?bytes={}&status=500 HTTP/1.1\r\nHost: localhost\r\nContent-Type: \
             application/json\r\nIdempotency-Key: big5-{i}\r\nContent-Length: 2\r\n\r\n{{}}",
            12 * MIB
        );
        let (status, socket) = slow_reader(gw.addr, raw).await;
        assert!(status == 500 || status == 503, "{status}");
        failed += usize::from(status == 500);
        held.push(socket);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let failing = rss(pid).saturating_sub(before_5xx);
    println!(
        "slow readers of 5xx answers: {readers}x12MiB passed_on={failed} rss_growth={} MiB",
        failing / MIB as u64
    );
    assert!(failed >= 1 && failed < readers, "{failed} passed on");
    assert!(
        failing < 96 * MIB as u64,
        "5xx answers within the budget: grew {} MiB",
        failing / MIB as u64
    );
    drop(held);
    // The budget comes back when the slow readers go.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let again = post(gw.addr, "/large?bytes=1024", Some("after"), "{}").await;
    assert_eq!(again.status, 200, "the budget came back");
}

/// An operator's forced release of a key whose forward still runs, on a
/// `reject` route: refused while the lease lives without `--force`,
/// refused without `--upstream-checked`, and when done it says that the
/// running forward may still land upstream and writes the audit row.
pub async fn a_forced_release_says_what_it_cannot_stop(db: ShopDb) {
    let up = Upstream::start().await;
    up.hold();
    let dir = idem_testkit::TempDir::new("gateway-release");
    let routes = "[[gateway.routes]]\nmethod = \"POST\"\npath = \"/hold\"\noperation = \"hold\"\nlease = \"3s\"\n";
    let token = "c30a9894b5c0d5797c27c827e57bdee4";
    let gw = Server::start(
        &db.url(),
        &[
            "--config",
            &config(&dir, &up, "", routes),
            "--admin-token",
            token,
        ],
    )
    .await;
    let addr = gw.addr;
    let first =
        tokio::spawn(
            async move { crate::try_call(addr, "POST", "/hold", Some("h-1"), "{}").await },
        );
    for _ in 0..200 {
        if !up.seen_at("/hold").is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let url = db.url();
    let release = |extra: &[&str]| {
        let mut args = vec![
            "keys",
            "release",
            "--database-url",
            &url,
            "--operation",
            "hold",
        ];
        args.extend_from_slice(extra);
        args.push("h-1");
        crate::idem_cli(&args)
    };
    let live = release(&[]);
    assert_eq!(live.status.code(), Some(1));
    let said = String::from_utf8_lossy(&live.stderr);
    assert!(
        said.contains("lease-live") && said.contains("may still land"),
        "{said}"
    );
    let unchecked = release(&["--force"]);
    assert_eq!(unchecked.status.code(), Some(1));
    let said = String::from_utf8_lossy(&unchecked.stderr);
    assert!(
        said.contains("upstream-unchecked")
            && said.contains("on_unknown = \"reject\"")
            && said.contains("still running"),
        "{said}"
    );
    let done = release(&["--force", "--upstream-checked", "--actor", "ops-1"]);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let out: serde_json::Value = serde_json::from_slice(&done.stdout).unwrap();
    assert_eq!(out["released"], true);
    assert!(out["warning"].as_str().unwrap().contains("may still land"));
    let audit = exchange(
        gw.addr,
        &format!(
            "GET /admin/v1/audit?action=keys.release HTTP/1.1\r\nHost: localhost\r\nConnection: \
             close\r\nAuthorization: Bearer {token}\r\n\r\n"
        ),
    )
    .await;
    assert_eq!(audit.status, 200, "{}", body_of(&audit));
    let rows = audit.json()["items"].as_array().unwrap().clone();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["actor"], "ops-1");
    assert_eq!(rows[0]["detail"]["force"], true);
    assert_eq!(rows[0]["detail"]["upstream_checked"], true);
    up.open();
    assert_eq!(first.await.unwrap().unwrap().status, 201);
}

on_both! {
    a_default_gateway_never_forwards_a_lost_answer_again;
    a_verify_route_finds_what_landed_and_forwards_again_only_what_did_not;
    a_reject_route_keeps_the_key_on_every_5xx;
    an_upstream_in_progress_answer_is_never_stored;
    replays_are_the_first_answer_readable_by_every_client;
    answers_held_for_slow_readers_stay_within_the_budget;
    a_forced_release_says_what_it_cannot_stop;
    an_unknown_outcome_is_held_past_its_ttl_and_a_policy_change;
    every_spelling_of_a_keyed_path_is_keyed;
    a_gateway_killed_mid_forward_leaves_its_key_held;
    a_verifier_paused_past_its_lease_forwards_nothing;
    a_client_that_hangs_up_mid_forward_gets_the_answer_on_its_retry;
}

/// A client that hangs up while its request is at the upstream (a client
/// timeout, a closed tab) does not stop the forward: the gateway finishes
/// it and stores the answer, so the client's retry gets that answer — not a
/// `409 outcome-unknown` held for an operator about a forward the gateway
/// saw through. One effect.
pub async fn a_client_that_hangs_up_mid_forward_gets_the_answer_on_its_retry(db: ShopDb) {
    let up = Upstream::start().await;
    let gw = Server::start(&db.url(), &["--upstream", &up.url()]).await;
    let body = r#"{"amount":7,"reference":"hang-up"}"#;
    up.hold();
    let mut conn = TcpStream::connect(gw.addr).await.unwrap();
    let head = format!(
        "POST /hold HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
         idempotency-key: hang-1\r\ncontent-length: {}\r\n\r\n{body}",
        gw.addr,
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let at_upstream = Instant::now() + Duration::from_secs(10);
    while up.seen_at("/hold").is_empty() {
        assert!(
            Instant::now() < at_upstream,
            "the forward never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The client hangs up while the upstream works, then the upstream
    // answers.
    drop(conn);
    tokio::time::sleep(Duration::from_millis(300)).await;
    up.open();
    let deadline = Instant::now() + Duration::from_secs(10);
    let answer = loop {
        let retry = post(gw.addr, "/hold", Some("hang-1"), body).await;
        if retry.status == 201 || Instant::now() > deadline {
            break retry;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        (answer.status, answer.problem_type()),
        (201, String::new()),
        "the retry after the client hung up: {}",
        body_of(&answer)
    );
    assert!(answer.replayed(), "the stored answer of the first forward");
    assert_eq!(up.seen_at("/hold").len(), 1, "forwarded once");
    assert_eq!(up.effects(), 1, "one effect");
}

/// A verifying retry paused (`SIGSTOP`) during a slow lookup, past its
/// lease: a retry through gateway B takes the key over, finds nothing and
/// forwards it — one payment. Gateway A, resumed, reads its own (stale)
/// "not found" but forwards nothing: it renews the lease first, finds it
/// taken, and answers in flight.
pub async fn a_verifier_paused_past_its_lease_forwards_nothing(db: ShopDb) {
    let up = Upstream::start().await;
    let dir = idem_testkit::TempDir::new("gateway-paused-verify");
    let routes = "[[gateway.routes]]\nmethod = \"POST\"\npath = \"/drop\"\n\
                  operation = \"pay\"\non_unknown = \"verify\"\n\
                  verify = \"GET /held-lookup?reference={/reference}\"\n\
                  verify_found = \"/data/0\"\nverify_status = 201\nlanding = \"1s\"\n\
                  lease = \"1s\"\n";
    let file = config(&dir, &up, "", routes);
    let (mut a, b) = (
        gateway(&db, &file, None).await,
        gateway(&db, &file, None).await,
    );
    let body = r#"{"amount":9,"reference":"r-9"}"#;
    let first = post(a.addr, "/drop", Some("p-1"), body).await;
    assert_eq!(first.status, 502, "dropped: {}", body_of(&first));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    up.hold();
    let addr = a.addr;
    let verifying =
        tokio::spawn(
            async move { crate::try_call(addr, "POST", "/drop", Some("p-1"), body).await },
        );
    let lookups = || {
        let seen = up.seen();
        (seen.iter())
            .filter(|s| s.path.starts_with("/held-lookup"))
            .count()
    };
    let started = Instant::now();
    while lookups() < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "A never looked"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let paused = a.proc().pid();
    signal(paused, "-STOP");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // B waits out the landing window from A's lease end (A might have
    // forwarded before it stopped), then forwards.
    let taken = loop {
        let r = post(b.addr, "/drop", Some("p-1"), body).await;
        if r.status != 409 || started.elapsed() > Duration::from_secs(15) {
            break r;
        }
        assert_eq!(r.problem_type(), UNKNOWN, "{}", body_of(&r));
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        taken.status,
        201,
        "B took over and forwarded: {}",
        body_of(&taken)
    );
    assert_eq!(up.effects(), 1);
    up.open();
    signal(paused, "-CONT");
    let stale = verifying.await.unwrap().unwrap();
    assert_eq!(stale.status, 409, "{}", body_of(&stale));
    assert_eq!(stale.problem_type(), IN_FLIGHT);
    assert_eq!(up.seen_at("/drop").len(), 2, "A forwarded nothing");
    assert_eq!(up.effects(), 1, "one payment");
    let replay = post(a.addr, "/drop", Some("p-1"), body).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, taken.body);
    println!(
        "paused verifier: lookups={} forwards={} effects={}",
        lookups(),
        up.seen_at("/drop").len(),
        up.effects()
    );
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// A takeover that lands while the first forward still runs upstream:
/// gateway A is paused (`SIGSTOP`) past its lease mid-forward, a retry
/// through gateway B (one PostgreSQL) takes the key over and forwards it
/// again; the upstream's 409 "in use" is answered as in flight and never
/// stored; once the upstream finished, a retry gets its real answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_while_the_first_forward_runs_stores_nothing_transient() {
    let db = ShopDb::postgres().await;
    let up = Upstream::start().await;
    up.set_delay(Duration::from_secs(4));
    let dir = idem_testkit::TempDir::new("gateway-paused");
    let routes = "[[gateway.routes]]\nmethod = \"POST\"\npath = \"/dedupe\"\noperation = \"pay\"\non_unknown = \"reforward\"\nlease = \"1s\"\n";
    let file = config(&dir, &up, "timeout = \"10s\"", routes);
    let (mut a, b) = (
        gateway(&db, &file, None).await,
        gateway(&db, &file, None).await,
    );
    let body = r#"{"amount":8}"#;
    let addr = a.addr;
    let first =
        tokio::spawn(
            async move { crate::try_call(addr, "POST", "/dedupe", Some("z-1"), body).await },
        );
    for _ in 0..200 {
        if !up.seen_at("/dedupe").is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let paused = a.proc().pid();
    signal(paused, "-STOP");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let taken = post(b.addr, "/dedupe", Some("z-1"), body).await;
    signal(paused, "-CONT");
    assert_eq!(taken.status, 409, "{}", body_of(&taken));
    assert_eq!(taken.problem_type(), IN_FLIGHT);
    assert_eq!(up.seen_at("/dedupe").len(), 2, "B forwarded it again");
    let a_answer = first.await.unwrap().unwrap();
    assert_eq!(
        a_answer.status, 201,
        "A's client still gets the upstream's answer"
    );
    let started = Instant::now();
    let answer = loop {
        let r = post(b.addr, "/dedupe", Some("z-1"), body).await;
        match r.status {
            201 => break r,
            409 => assert_eq!(r.problem_type(), IN_FLIGHT, "{}", body_of(&r)),
            s => panic!("unexpected {s}: {}", body_of(&r)),
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never answered"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(answer.body, a_answer.body, "the one payment");
    let replay = post(a.addr, "/dedupe", Some("z-1"), body).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, answer.body);
    assert_eq!(up.effects(), 1);
    println!(
        "takeover during the first forward: forwards={} stored=201 effects=1",
        up.seen_at("/dedupe").len()
    );
}

/// The gateway's claim is one autocommit insert. When PostgreSQL commits
/// it and the answer is lost on the way back, the gateway answers `503
/// outcome-unknown` having forwarded nothing: the key must not then stay
/// held as "forwarded, its answer lost" (409 for an operator, though the
/// upstream never saw the request). The gateway gives its own claim back,
/// so a retry claims afresh and forwards once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_answer_is_lost_is_given_back_and_forwarded_once_on_retry() {
    let db = idem_testkit::PgDatabase::create("idem_gw_claim").await;
    let proxy = idem_testkit::Proxy::start(idem_testkit::url_addr(&db.url)).await;
    let url = idem_testkit::url_via(&db.url, proxy.addr);
    let up = Upstream::start().await;
    let gw = Server::start(&url, &["--upstream", &up.url()]).await;
    let key = "claim-answer-lost-1";
    let body = r#"{"amount":7,"reference":"r-claim-lost"}"#;
    // The key travels in the claim's Bind message, sent with its Execute.
    proxy.cut_after_next(key.as_bytes());
    let first = post(gw.addr, "/v1/payments", Some(key), body).await;
    assert_eq!(first.status, 503, "{}", body_of(&first));
    assert_eq!(first.problem_type(), UNKNOWN, "{}", body_of(&first));
    assert!(up.seen_at("/v1/payments").is_empty(), "nothing forwarded");
    let started = Instant::now();
    let answered = loop {
        let retry = post(gw.addr, "/v1/payments", Some(key), body).await;
        if retry.status == 201 || started.elapsed() > Duration::from_secs(15) {
            break retry;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(answered.status, 201, "{}", body_of(&answered));
    let replay = post(gw.addr, "/v1/payments", Some(key), body).await;
    assert_eq!(replay.status, 201, "{}", body_of(&replay));
    assert_eq!(
        replay.header("idempotent-replayed").as_deref(),
        Some("true")
    );
    assert_eq!(up.seen_at("/v1/payments").len(), 1, "forwarded once");
    assert_eq!(up.effects(), 1, "one effect");
    println!(
        "claim answer lost: first 503 outcome-unknown, forwarded once after {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
