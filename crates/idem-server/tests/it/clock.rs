//! One clock for leases: two processes on one PostgreSQL database, the
//! second one's wall clock several leases ahead (libfaketime, the monotonic
//! clock left alone — two hosts whose clocks disagree). Every lease,
//! takeover and expiry is judged by the database's clock, so the process
//! that is ahead never takes over a holder that is alive: no second
//! forward, no second charge or mail, no takeover at all — while a holder
//! that really died is still taken over after its lease.
//!
//! SQLite has no counterpart here: processes sharing an SQLite file run on
//! one host and read one kernel clock; shifting one of them is a setup the
//! SQLite backend does not support (README, "Clocks").

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use idem_core::steps::{RunState, RunStore};

use crate::checkout::{ShopDb, World, order_body, set_stock};
use crate::gateway::Upstream;
use crate::process::Server;
use crate::{Reply, call, try_call};

/// How far the second process's wall clock is ahead: five leases.
const AHEAD_SECS: i64 = 10;
/// The lease of the gateway's route and of the shops' runs.
const LEASE: Duration = Duration::from_secs(2);
/// Intents (gateway) and orders (checkout) sent through the first process.
const INTENTS: usize = 20;

/// `idem serve` with its wall clock [`AHEAD_SECS`] ahead.
async fn start_ahead(database_url: &str, extra: &[&str]) -> Server {
    let env = idem_testkit::clock_offset_env(AHEAD_SECS);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let server = Server::start_env(database_url, extra, None, &env).await;
    assert_clock_ahead(server.addr, AHEAD_SECS).await;
    server
}

/// The server's `Date` header says its wall clock really is `secs` ahead
/// of ours (to the second): the offset took, so a pass is not vacuous.
async fn assert_clock_ahead(addr: SocketAddr, secs: i64) {
    let r = call(addr, "GET", "/healthz", None, "").await;
    let date = r.header("date").expect("a Date header");
    let theirs = httpdate::parse_http_date(&date).unwrap();
    let ahead = match theirs.duration_since(SystemTime::now()) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    };
    assert!(
        (ahead - secs as f64).abs() <= 2.0,
        "the server's wall clock is {ahead:.1} s ahead, not {secs} s (Date: {date})"
    );
}

/// The sum of a counter's series in `GET /metrics` (0 when never counted).
async fn counter(addr: SocketAddr, name: &str) -> u64 {
    let r = call(addr, "GET", "/metrics", None, "").await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    String::from_utf8_lossy(&r.body)
        .lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn gateway_config(dir: &idem_testkit::TempDir, up: &Upstream, on_unknown: &str) -> String {
    let path = dir.path().join("gateway.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[gateway]
upstream = "{}"
timeout = "60s"

[[gateway.routes]]
method = "POST"
path = "/hold"
operation = "hold"
lease = "{}s"
wait = "1s"
on_unknown = "{on_unknown}"
"#,
            up.url(),
            LEASE.as_secs()
        ),
    )
    .unwrap();
    path.display().to_string()
}

/// What a retry through the gateway that is ahead got while the first
/// gateway was still forwarding.
#[derive(Debug, Default)]
struct Retries {
    in_flight: usize,
    other: Vec<String>,
}

impl Retries {
    fn count(&mut self, r: Option<Reply>) {
        match r {
            Some(r) if r.status == 409 && r.problem_type().ends_with("/request-in-flight") => {
                self.in_flight += 1
            }
            Some(r) => {
                self.other
                    .push(format!("{} {}", r.status, String::from_utf8_lossy(&r.body)))
            }
            None => self.other.push("no answer within 5 s (forwarded)".into()),
        }
    }
}

/// Two gateways on one PostgreSQL, B's clock five leases ahead; every intent
/// goes through A, whose upstream holds its answer for several leases, and
/// is retried through B twice meanwhile: B answers "in flight" and never
/// forwards, and once A has its answer B replays it. One effect per intent.
async fn gateway_ahead(on_unknown: &str) {
    let db = ShopDb::postgres().await;
    let up = Upstream::start().await;
    let dir = idem_testkit::TempDir::new("clock");
    let config = gateway_config(&dir, &up, on_unknown);
    let a = Server::start(&db.url(), &["--config", &config, "--public-metrics"]).await;
    let b = start_ahead(&db.url(), &["--config", &config, "--public-metrics"]).await;
    up.hold();
    let body = |i: usize| format!(r#"{{"intent":{i}}}"#);
    let firsts: Vec<_> = (0..INTENTS)
        .map(|i| {
            let (addr, body) = (a.addr, body(i));
            tokio::spawn(async move {
                call(addr, "POST", "/hold", Some(&format!("clock-{i}")), &body).await
            })
        })
        .collect();
    let until = Instant::now() + Duration::from_secs(20);
    while up.seen_at("/hold").len() < INTENTS {
        assert!(Instant::now() < until, "A did not forward every intent");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut retries = Retries::default();
    let started = Instant::now();
    for round in 0..2 {
        if round > 0 {
            // A's forwards outlive several leases: its heartbeats keep them.
            tokio::time::sleep(LEASE * 3).await;
        }
        let tasks: Vec<_> = (0..INTENTS)
            .map(|i| {
                let (addr, body) = (b.addr, body(i));
                tokio::spawn(async move {
                    let key = format!("clock-{i}");
                    let retry = try_call(addr, "POST", "/hold", Some(&key), &body);
                    tokio::time::timeout(Duration::from_secs(5), retry)
                        .await
                        .ok()
                        .and_then(Result::ok)
                })
            })
            .collect();
        for t in tasks {
            retries.count(t.await.unwrap());
        }
    }
    let held = started.elapsed();
    let forwards_while_held = up.seen_at("/hold").len();
    up.open();
    let mut answers = Vec::new();
    for t in firsts {
        answers.push(t.await.unwrap());
    }
    let mut replays = 0;
    for (i, first) in answers.iter().enumerate() {
        assert_eq!(
            first.status,
            201,
            "{}",
            String::from_utf8_lossy(&first.body)
        );
        let r = call(
            b.addr,
            "POST",
            "/hold",
            Some(&format!("clock-{i}")),
            &body(i),
        )
        .await;
        if r.status == 201 && r.replayed() && r.body == first.body {
            replays += 1;
        }
    }
    let (effects, forwards) = (up.effects(), up.seen_at("/hold").len());
    let takeovers = counter(b.addr, "idem_lease_takeovers_total").await;
    println!(
        "one clock, gateway ({on_unknown}): intents={INTENTS} b_ahead=+{AHEAD_SECS}s lease={LEASE:?} \
         held={held:.1?} retries_through_b={} in_flight_409={} other={} forwards={forwards} \
         effects={effects} duplicate_effects={} takeovers_by_b={takeovers} replays_by_b={replays}",
        retries.in_flight + retries.other.len(),
        retries.in_flight,
        retries.other.len(),
        effects.saturating_sub(INTENTS),
    );
    assert_eq!(
        (forwards_while_held, effects),
        (INTENTS, INTENTS),
        "B forwarded intents A was still forwarding: one effect per intent, not {effects}"
    );
    assert!(
        retries.other.is_empty(),
        "every retry through B while A forwards is in flight; got {:?}",
        retries.other
    );
    assert_eq!(takeovers, 0, "B took over live forwards");
    assert_eq!(replays, INTENTS, "B replays A's answer once it is stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_ahead_never_takes_over_a_live_forward_reforward() {
    gateway_ahead("reforward").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_ahead_never_takes_over_a_live_forward_reject() {
    gateway_ahead("reject").await;
}

fn shop_args(w: &World) -> Vec<String> {
    [
        "--provider-url",
        &w.proxy.url(),
        "--mail-url",
        &w.relay.url(),
        "--run-lease",
        &format!("{}s", LEASE.as_secs()),
        "--call-timeout",
        "30s",
        "--respond-within",
        "30s",
        "--public-metrics",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The fences of every run in the shop's database: a run's fence goes up by
/// one at each takeover.
async fn fences(url: &str) -> Vec<i64> {
    let store = idem_postgres::PgStore::connect(url, Default::default())
        .await
        .unwrap();
    let mut fences = Vec::new();
    for state in RunState::ALL {
        let filter = idem_core::steps::RunFilter {
            state: Some(*state),
            limit: 1000,
        };
        for r in store.list_runs(&filter).await.unwrap() {
            fences.push(store.load_run(&r.id).await.unwrap().unwrap().fence.0);
        }
    }
    fences
}

/// Two checkout shops on one PostgreSQL, B's clock five leases ahead, orders
/// through A held at the provider for several leases and retried through B
/// meanwhile: B's retries are in flight, B's recovery worker takes no healthy
/// run over, one charge and one mail per order. Then A is killed mid-charge:
/// B takes over exactly those runs once their leases end, and finishes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkout_shop_ahead_never_takes_over_a_healthy_run() {
    let w = World::new(ShopDb::postgres().await).await;
    let args = shop_args(&w);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut a = Server::start(&w.db.url(), &args).await;
    let b = start_ahead(&w.db.url(), &args).await;
    set_stock(a.addr, "tee", 1000).await;
    w.proxy.hold();
    let body = |i: usize| order_body(&format!("cus_c{i}"), "tee", 1, 100 + i as i64);
    let orders: Vec<_> = (0..INTENTS)
        .map(|i| {
            let (addr, body) = (a.addr, body(i));
            tokio::spawn(async move {
                call(addr, "POST", "/v1/orders", Some(&format!("c-{i}")), &body).await
            })
        })
        .collect();
    let until = Instant::now() + Duration::from_secs(20);
    while w.proxy.charges().len() < INTENTS {
        assert!(Instant::now() < until, "not every order reached its charge");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Held at the provider for three leases, through several of B's
    // recovery rounds (one a second), each order retried through B once.
    let started = Instant::now();
    let retries: Vec<_> = (0..INTENTS)
        .map(|i| {
            let (addr, body) = (b.addr, body(i));
            tokio::spawn(async move {
                let key = format!("c-{i}");
                let retry = try_call(addr, "POST", "/v1/orders", Some(&key), &body);
                tokio::time::timeout(Duration::from_secs(5), retry)
                    .await
                    .ok()
                    .and_then(Result::ok)
            })
        })
        .collect();
    let mut other = Vec::new();
    let mut in_flight = 0;
    for r in retries {
        match r.await.unwrap() {
            Some(r) if r.status == 409 && r.problem_type().ends_with("/request-in-flight") => {
                in_flight += 1
            }
            Some(r) => other.push(format!("{} {}", r.status, String::from_utf8_lossy(&r.body))),
            None => other.push("no answer within 5 s (running at B)".into()),
        }
    }
    tokio::time::sleep((LEASE * 3).saturating_sub(started.elapsed())).await;
    let held = started.elapsed();
    w.proxy.open();
    let mut answered = 0;
    for o in orders {
        let r = o.await.unwrap();
        answered += usize::from(r.status == 201);
    }
    let healthy_takeovers = counter(b.addr, "idem_lease_takeovers_total").await;
    let fenced_out = counter(a.addr, "idem_fence_rejections_total").await;
    let bumped = fences(&w.db.url()).await.iter().filter(|f| **f > 1).count();
    let max_in_flight = w.proxy.max_in_flight_per_key();
    let (charges, mails) = (w.payments().await.len(), w.relay.accepted().len());
    println!(
        "one clock, checkout (healthy): orders={INTENTS} b_ahead=+{AHEAD_SECS}s run_lease={LEASE:?} \
         held={held:.1?} retries_through_b={INTENTS} in_flight_409={in_flight} a_answered_201={answered} \
         takeovers_by_b={healthy_takeovers} fence_rejections_at_a={fenced_out} runs_with_fence_bumped={bumped} \
         max_in_flight_per_key={max_in_flight} payments={charges} mails={mails} duplicate_mails={}",
        mails.saturating_sub(INTENTS)
    );
    assert_eq!(
        (healthy_takeovers, fenced_out, bumped),
        (0, 0, 0),
        "B took over healthy runs of A (takeovers, fenced writes at A, runs with a new fence)"
    );
    assert!(other.is_empty(), "retries through B: {other:?}");
    assert_eq!(answered, INTENTS, "A answers every order 201");
    assert_eq!(max_in_flight, 1, "one charge at a time per key");
    assert_eq!(
        (charges, mails),
        (INTENTS, INTENTS),
        "one payment, one mail per order"
    );

    // A dies mid-charge: B takes those runs over after their leases, by the
    // same clock, and finishes them.
    let dead = 5;
    w.proxy.reset_counts();
    w.proxy.hold();
    let addr = a.addr;
    let stuck: Vec<_> = (INTENTS..INTENTS + dead)
        .map(|i| {
            let body = body(i);
            tokio::spawn(async move {
                let _ = try_call(addr, "POST", "/v1/orders", Some(&format!("c-{i}")), &body).await;
            })
        })
        .collect();
    let until = Instant::now() + Duration::from_secs(20);
    while w.proxy.charges().len() < dead {
        assert!(Instant::now() < until, "not every order reached its charge");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.proc().kill9();
    for s in stuck {
        let _ = s.await;
    }
    let killed = Instant::now();
    w.proxy.open();
    let until = Instant::now() + Duration::from_secs(60);
    while w.unfinished_runs().await > 0 {
        assert!(
            Instant::now() < until,
            "B did not finish the dead shop's runs"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let finished_after = killed.elapsed();
    let takeovers = counter(b.addr, "idem_lease_takeovers_total").await;
    let mut mails = w.relay.accepted();
    let sent = mails.len();
    mails.sort();
    mails.dedup();
    let payments = w.payments().await.len();
    println!(
        "one clock, checkout (holder killed): orders={dead} takeovers_by_b={takeovers} \
         finished_after={finished_after:.1?} payments={payments} mails={sent} distinct_mails={}",
        mails.len()
    );
    assert_eq!(
        takeovers, dead as u64,
        "B takes over the dead shop's runs, and only those"
    );
    assert!(
        finished_after >= LEASE / 2,
        "taken over before the lease could have ended: {finished_after:?}"
    );
    assert_eq!(payments, INTENTS + dead, "one payment per order");
    assert_eq!(
        (sent, mails.len()),
        (INTENTS + dead, INTENTS + dead),
        "one mail per order"
    );
}
