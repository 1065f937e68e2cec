//! The checkout saga with real processes: the shop (`idem serve
//! --provider-url …`) on SQLite or PostgreSQL, the payment provider (a
//! second `idem serve`, behind a recording proxy) and a mail relay that does
//! not deduplicate. Drill 7, a crash in the middle of compensation, a zombie
//! stopped with SIGSTOP, two recovery workers, an at-most-once effect with an
//! unknown outcome, hostile providers, and the history run.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idem_core::steps::{RunFilter, RunId, RunRecord, RunState, RunStore};
use idem_testkit::{PgDatabase, Rng, TempDir};
use serde_json::Value;

use crate::fakes::{ProviderProxy, Relay};
use crate::process::{Proc, Server};
use crate::{Reply, call, try_call};

/// Where the shop keeps its data.
pub enum ShopDb {
    Sqlite(TempDir),
    Postgres(PgDatabase),
}

impl ShopDb {
    pub async fn sqlite() -> Self {
        Self::Sqlite(TempDir::new("shop"))
    }
    pub async fn postgres() -> Self {
        Self::Postgres(PgDatabase::create("idem_shop").await)
    }
    pub fn url(&self) -> String {
        match self {
            Self::Sqlite(d) => d.sqlite_url(),
            Self::Postgres(db) => db.url.clone(),
        }
    }
}

/// The provider, the proxy in front of it, the relay, the shop's database.
pub struct World {
    _provider: Server,
    _provider_dir: TempDir,
    provider_db: String,
    pub proxy: ProviderProxy,
    pub relay: Relay,
    pub db: ShopDb,
}

/// The shop's settings in these drills: leases of 1 s, so a dead shop's
/// runs are taken over within a second or two; a landing margin of 2 s (the
/// provider behind the proxy commits what it receives at once, and the
/// proxy never delivers a request late).
const SHOP: &[&str] = &[
    "--run-lease",
    "1s",
    "--call-timeout",
    "2s",
    "--landing-margin",
    "2s",
];

impl World {
    pub async fn new(db: ShopDb) -> Self {
        let dir = TempDir::new("provider");
        let provider_db = dir.sqlite_url();
        let provider = Server::start(&provider_db, &[]).await;
        let proxy = ProviderProxy::start(provider.addr).await;
        let relay = Relay::start().await;
        Self {
            _provider: provider,
            _provider_dir: dir,
            provider_db,
            proxy,
            relay,
            db,
        }
    }

    pub fn shop_args(&self, extra: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = [
            "--provider-url",
            &self.proxy.url(),
            "--mail-url",
            &self.relay.url(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(SHOP.iter().map(|s| s.to_string()));
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    /// Starts a shop on the world's database.
    pub async fn shop(&self, extra: &[&str], failpoints: Option<&str>) -> Server {
        let args = self.shop_args(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Server::start_with(&self.db.url(), &args, failpoints).await
    }

    /// The provider's payments: `(reference, amount, amount_refunded)` per id.
    pub async fn payments(&self) -> BTreeMap<String, (String, i64, i64)> {
        let pool = sqlx::SqlitePool::connect(&self.provider_db).await.unwrap();
        let rows: Vec<(String, Option<String>, i64, i64)> =
            sqlx::query_as("SELECT id, reference, amount, amount_refunded FROM demo_payments")
                .fetch_all(&pool)
                .await
                .unwrap();
        rows.into_iter()
            .map(|(id, r, a, f)| (id, (r.unwrap_or_default(), a, f)))
            .collect()
    }

    /// Refunds per payment at the provider.
    pub async fn refunds(&self) -> BTreeMap<String, i64> {
        let pool = sqlx::SqlitePool::connect(&self.provider_db).await.unwrap();
        let rows: Vec<(String,)> = sqlx::query_as("SELECT payment_id FROM demo_refunds")
            .fetch_all(&pool)
            .await
            .unwrap();
        let mut out = BTreeMap::new();
        for (p,) in rows {
            *out.entry(p).or_default() += 1;
        }
        out
    }

    /// The shop's runs, with their steps.
    pub async fn run(&self, order: &str) -> RunRecord {
        let id = RunId::from_suffix(order.strip_prefix("ord_").unwrap()).unwrap();
        match &self.db {
            ShopDb::Sqlite(_) => {
                let s = idem_sqlite::SqliteStore::connect(&self.db.url(), Default::default())
                    .await
                    .unwrap();
                s.load_run(&id).await.unwrap().unwrap()
            }
            ShopDb::Postgres(_) => {
                let s = idem_postgres::PgStore::connect(&self.db.url(), Default::default())
                    .await
                    .unwrap();
                s.load_run(&id).await.unwrap().unwrap()
            }
        }
    }

    /// Runs not final: live or waiting for an operator.
    /// The runs in `state`, with their steps.
    pub async fn runs_in(&self, state: RunState) -> Vec<RunRecord> {
        async fn of<S: RunStore>(store: S, state: RunState) -> Vec<RunRecord> {
            let filter = RunFilter {
                state: Some(state),
                limit: 1000,
            };
            let mut runs = Vec::new();
            for r in store.list_runs(&filter).await.unwrap() {
                runs.extend(store.load_run(&r.id).await.unwrap());
            }
            runs
        }
        match &self.db {
            ShopDb::Sqlite(_) => {
                let store = idem_sqlite::SqliteStore::connect(&self.db.url(), Default::default())
                    .await
                    .unwrap();
                of(store, state).await
            }
            ShopDb::Postgres(_) => {
                let store = idem_postgres::PgStore::connect(&self.db.url(), Default::default())
                    .await
                    .unwrap();
                of(store, state).await
            }
        }
    }

    pub async fn unfinished_runs(&self) -> usize {
        let mut n = 0;
        for state in [
            RunState::Running,
            RunState::Compensating,
            RunState::NeedsAttention,
        ] {
            n += self.runs_in(state).await.len();
        }
        n
    }

    /// What the runs waiting for an operator say, with their steps and what
    /// the provider saw of each step's key, for a failure's message.
    pub async fn attention(&self) -> Vec<String> {
        let seen = self.proxy.seen();
        self.runs_in(RunState::NeedsAttention)
            .await
            .iter()
            .map(|r| {
                let steps: Vec<String> = r
                    .steps
                    .iter()
                    .map(|st| {
                        let sent: Vec<String> = seen
                            .iter()
                            .filter(|x| x.key.as_deref() == Some(st.key.as_str()))
                            .map(|x| format!("{} {} {:?}", x.method, x.path, x.status))
                            .collect();
                        format!(
                            "{} {:?} attempts={} failures={} error={:?} provider={sent:?}",
                            st.name, st.state, st.attempts, st.failures, st.error
                        )
                    })
                    .collect();
                format!(
                    "{} at {:?}: {:?} {steps:#?}",
                    r.id,
                    r.blocked_step,
                    r.attention.as_deref()
                )
            })
            .collect()
    }
}

pub fn order_body(customer: &str, sku: &str, quantity: i64, amount: i64) -> String {
    format!(
        r#"{{"customer":"{customer}","sku":"{sku}","quantity":{quantity},"amount":{amount},"currency":"EUR","email":"{customer}@example.com"}}"#
    )
}

pub async fn set_stock(shop: SocketAddr, sku: &str, n: i64) {
    let r = call(
        shop,
        "PUT",
        &format!("/v1/inventory/{sku}"),
        None,
        &format!(r#"{{"available":{n}}}"#),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

pub async fn stock(shop: SocketAddr, sku: &str) -> (i64, i64) {
    let r = call(shop, "GET", &format!("/v1/inventory/{sku}"), None, "").await;
    let v = r.json();
    (
        v["available"].as_i64().unwrap(),
        v["reserved"].as_i64().unwrap(),
    )
}

/// Whether an answer to `POST /v1/orders` is the intent's final answer.
pub fn is_final(r: &Reply) -> bool {
    match r.status {
        201 | 402 | 424 | 400 => true,
        409 => r.problem_type().ends_with("/out-of-stock"),
        _ => false,
    }
}

/// A client that retries one intent with its key until it has a final
/// answer (a shop that is down, restarting, busy or still running is asked
/// again).
pub async fn settle(shop: SocketAddr, key: &str, body: &str, within: Duration) -> Reply {
    match try_settle(shop, key, body, within).await {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    }
}

/// [`settle`], or why there was no final answer in time.
pub async fn try_settle(
    shop: SocketAddr,
    key: &str,
    body: &str,
    within: Duration,
) -> Result<Reply, String> {
    let until = Instant::now() + within;
    loop {
        let last = match try_call(shop, "POST", "/v1/orders", Some(key), body).await {
            Ok(r) if is_final(&r) => return Ok(r),
            Ok(r) => format!("{} {}", r.status, String::from_utf8_lossy(&r.body)),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= until {
            return Err(format!(
                "{key} got no final answer within {within:?}; last: {last}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn idem(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .output()
        .unwrap()
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// Drill 7: the shop is killed (an abort at a failpoint) after the provider
/// answered the charge and before the step was recorded. After a restart
/// the run resumes, the provider receives the same Idempotency-Key again
/// and holds one payment; the relay holds one confirmation.
pub async fn drill7(db: ShopDb) {
    let w = World::new(db).await;
    let mut shop = w.shop(&[], Some("steps.after_call=1")).await;
    set_stock(shop.addr, "tee", 10).await;
    let body = order_body("cus_d7", "tee", 2, 3000);
    let first = try_call(shop.addr, "POST", "/v1/orders", Some("d7"), &body).await;
    assert!(
        first.is_err() || first.unwrap().status >= 500,
        "the shop died mid-request"
    );
    assert!(
        shop.proc().exited_within(Duration::from_secs(10)).await,
        "aborted at the failpoint"
    );
    let charges = w.proxy.charges();
    assert_eq!(charges.len(), 1);
    assert_eq!(
        charges[0].status,
        Some(201),
        "the provider answered the charge"
    );

    shop.restart().await;
    let done = settle(shop.addr, "d7", &body, Duration::from_secs(30)).await;
    assert_eq!(done.status, 201, "{}", String::from_utf8_lossy(&done.body));
    let order = done.json()["id"].as_str().unwrap().to_owned();
    let charges = w.proxy.charges();
    assert_eq!(charges.len(), 2, "the charge was sent again");
    assert_eq!(
        charges[0].key, charges[1].key,
        "with the same Idempotency-Key"
    );
    assert!(charges[1].replayed, "and the provider replayed its answer");
    let payments = w.payments().await;
    assert_eq!(payments.len(), 1, "one payment");
    assert_eq!(payments.values().next().unwrap().0, order);
    assert_eq!(
        w.relay.accepted(),
        [format!("confirm-{order}")],
        "one confirmation"
    );
    assert_eq!(stock(shop.addr, "tee").await, (8, 0));
    let run = w.run(&order).await;
    assert_eq!(run.step("charge").unwrap().attempts, 2);
    assert!(run.takeovers >= 1);
    let replay = settle(shop.addr, "d7", &body, Duration::from_secs(5)).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, done.body, "byte-identical");
    println!(
        "drill7: charges={} same_key=true payments={} confirmations={} takeovers={}",
        charges.len(),
        payments.len(),
        w.relay.accepted().len(),
        run.takeovers
    );
}

/// Killed in the middle of compensation (an abort after the refund call
/// returned, before it was recorded): the run resumes, the refund goes out
/// again with its own key and the provider holds one refund; the stock is
/// released once.
pub async fn compensation_crash(db: ShopDb) {
    let w = World::new(db).await;
    let mut shop = w
        .shop(&["--order-deadline", "2s"], Some("steps.undo.after_call=1"))
        .await;
    set_stock(shop.addr, "tee", 10).await;
    // The charge goes through, but its answers are lost past the deadline:
    // the run compensates, finding the charge with the provider's lookup.
    w.proxy.lose_charges_for(Duration::from_secs(3));
    let body = order_body("cus_cc", "tee", 3, 4500);
    let _ = try_call(shop.addr, "POST", "/v1/orders", Some("cc"), &body).await;
    assert!(
        shop.proc().exited_within(Duration::from_secs(30)).await,
        "aborted after the refund"
    );
    assert_eq!(w.proxy.refunds().len(), 1);
    shop.restart().await;
    let done = settle(shop.addr, "cc", &body, Duration::from_secs(30)).await;
    assert_eq!(done.status, 424, "{}", String::from_utf8_lossy(&done.body));
    assert_eq!(
        done.problem_type(),
        "https://idem.dev/problems/payment-failed"
    );
    let order = done.json()["order"].as_str().unwrap().to_owned();
    let refunds = w.proxy.refunds();
    assert_eq!(refunds.len(), 2, "the refund was sent again");
    assert_eq!(refunds[0].key, refunds[1].key, "with its own key, the same");
    assert!(refunds[1].replayed);
    assert_ne!(refunds[0].key, w.proxy.charges()[0].key);
    let payments = w.payments().await;
    assert_eq!(payments.len(), 1);
    let (_, amount, refunded) = payments.values().next().unwrap();
    assert_eq!(refunded, amount, "refunded in full: no net charge");
    assert_eq!(
        w.refunds().await.values().copied().collect::<Vec<_>>(),
        [1],
        "one refund"
    );
    assert_eq!(stock(shop.addr, "tee").await, (10, 0), "released once");
    assert!(w.relay.accepted().is_empty());
    let got = call(shop.addr, "GET", &format!("/v1/orders/{order}"), None, "")
        .await
        .json();
    assert_eq!(
        (got["status"].as_str(), got["reason"].as_str()),
        (Some("failed"), Some("payment_unavailable"))
    );
    println!(
        "compensation crash: refunds_sent={} refunds_held=1 stock_released_once=true",
        refunds.len()
    );
}

/// A zombie: the shop is stopped (SIGSTOP) while the provider holds its
/// charge's answer, past its lease; a second shop takes the run over and
/// completes it; the first, resumed (SIGCONT), has its writes refused by
/// the fence and stops. The run completed once.
pub async fn zombie(db: ShopDb) {
    let w = World::new(db).await;
    let mut a = w.shop(&[], None).await;
    set_stock(a.addr, "tee", 10).await;
    w.proxy.hold();
    let body = order_body("cus_z", "tee", 1, 1500);
    let addr = a.addr;
    let client = {
        let body = body.clone();
        tokio::spawn(async move { try_call(addr, "POST", "/v1/orders", Some("z"), &body).await })
    };
    for _ in 0..200 {
        if !w.proxy.charges().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(w.proxy.charges().len(), 1, "the charge is in flight");
    signal(a.proc().pid(), "-STOP");
    // Past the 1 s lease, another shop's recovery worker takes the run over.
    let b = w.shop(&[], None).await;
    for _ in 0..300 {
        if w.proxy.charges().len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(w.proxy.charges().len(), 2, "the successor charges again");
    w.proxy.open();
    let done = settle(b.addr, "z", &body, Duration::from_secs(30)).await;
    assert_eq!(done.status, 201);
    let order = done.json()["id"].as_str().unwrap().to_owned();
    let finished = w.run(&order).await;
    assert_eq!(finished.state, RunState::Completed);
    signal(a.proc().pid(), "-CONT");
    // The zombie gets its charge's answer now, and its lease is gone.
    let mut fenced = false;
    for _ in 0..200 {
        let log = a.proc().log();
        if log.contains("fenced out") || log.contains("lease lost") {
            fenced = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(fenced, "the zombie saw its lease gone:\n{}", a.proc().log());
    drop(client);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = w.run(&order).await;
    assert_eq!(after, finished, "the zombie recorded nothing");
    assert_eq!((after.fence.0, after.takeovers), (2, 1));
    assert!(
        after
            .steps
            .iter()
            .filter(|s| s.name != "reserve")
            .all(|s| s.fence.0 == 2)
    );
    let charges = w.proxy.charges();
    assert_eq!(charges[0].key, charges[1].key);
    assert_eq!(w.payments().await.len(), 1, "one payment");
    assert_eq!(w.relay.accepted().len(), 1, "one confirmation");
    assert_eq!(stock(b.addr, "tee").await, (9, 0));
    println!(
        "zombie: fence={} takeovers={} payments=1 confirmations=1",
        after.fence.0, after.takeovers
    );
}

/// Two `idem steps recover` workers on one PostgreSQL database resume the
/// runs of a shop that was killed: never both on one run (the provider
/// never sees one key twice at once), every order confirmed once.
pub async fn two_recovery_workers(db: ShopDb) {
    let w = World::new(db).await;
    let mut shop = w.shop(&[], None).await;
    set_stock(shop.addr, "tee", 100).await;
    w.proxy.hold();
    let n = 12;
    let addr = shop.addr;
    let mut clients = Vec::new();
    for i in 0..n {
        let body = order_body(&format!("cus_w{i}"), "tee", 1, 100 + i);
        clients.push(tokio::spawn(async move {
            let _ = try_call(addr, "POST", "/v1/orders", Some(&format!("w-{i}")), &body).await;
        }));
    }
    for _ in 0..500 {
        if w.proxy.charges().len() == n as usize {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        w.proxy.charges().len(),
        n as usize,
        "every order is at its charge"
    );
    shop.proc().kill9();
    for c in clients {
        let _ = c.await;
    }
    w.proxy.reset_counts();
    w.proxy.open();
    w.proxy.latency(Duration::from_millis(100));
    let workers: Vec<Proc> = (0..2)
        .map(|_| {
            let mut args = vec![
                "steps".to_string(),
                "recover".into(),
                "--database-url".into(),
                w.db.url(),
            ];
            // Two runs at a time each: the workers share the work.
            args.extend(w.shop_args(&["--max-runs", "2"]));
            Proc::spawn(&args, None)
        })
        .collect();
    let until = Instant::now() + Duration::from_secs(60);
    while w.unfinished_runs().await > 0 {
        assert!(
            Instant::now() < until,
            "the workers did not finish the runs"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let taken: Vec<usize> = workers
        .iter()
        .map(|p| {
            p.log()
                .matches("recovering a run whose lease expired")
                .count()
        })
        .collect();
    drop(workers);
    assert!(
        taken.iter().all(|n| *n > 0),
        "both workers ran runs: {taken:?}"
    );
    assert_eq!(
        w.proxy.max_in_flight_per_key(),
        1,
        "never one run twice at once"
    );
    let payments = w.payments().await;
    assert_eq!(payments.len(), n as usize, "one payment per order");
    let mut mails = w.relay.accepted();
    mails.sort();
    mails.dedup();
    assert_eq!(
        (w.relay.accepted().len(), mails.len()),
        (n as usize, n as usize),
        "one mail each"
    );
    println!(
        "two recovery workers: runs={n} taken_per_worker={taken:?} charges_after_kill={} max_in_flight_per_key={} payments={}",
        w.proxy.charges().len(),
        w.proxy.max_in_flight_per_key(),
        payments.len()
    );
}

/// An at-most-once confirmation whose answer is lost: the run waits in
/// `needs_attention` (`409 needs-attention` to retries), the relay holds one
/// message, nothing is sent again; an operator resolves it with `idem steps
/// resolve … --as sent` and the order completes without a second message.
pub async fn at_most_once_needs_attention(db: ShopDb) {
    let w = World::new(db).await;
    let shop = w.shop(&["--mail-delivery", "at-most-once"], None).await;
    set_stock(shop.addr, "tee", 10).await;
    w.relay.lose_next(1);
    let body = order_body("cus_amo", "tee", 1, 900);
    let first = call(shop.addr, "POST", "/v1/orders", Some("amo"), &body).await;
    assert_eq!(first.status, 409);
    assert_eq!(
        first.problem_type(),
        "https://idem.dev/problems/needs-attention"
    );
    for _ in 0..3 {
        let again = call(shop.addr, "POST", "/v1/orders", Some("amo"), &body).await;
        assert_eq!(
            again.problem_type(),
            "https://idem.dev/problems/needs-attention"
        );
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    assert_eq!(w.relay.accepted().len(), 1, "never sent again");
    let url = w.db.url();
    let listed = idem(&[
        "steps",
        "list",
        "--state",
        "needs_attention",
        "--database-url",
        &url,
    ]);
    let line = String::from_utf8(listed.stdout).unwrap();
    let run: Value =
        serde_json::from_str(line.lines().next().expect("one run needs attention")).unwrap();
    assert_eq!(run["blocked_step"], "confirmation");
    let id = run["id"].as_str().unwrap().to_owned();
    let shown = idem(&["steps", "show", &id, "--database-url", &url]);
    let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
    let step = shown["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "confirmation")
        .unwrap();
    assert_eq!(
        (step["kind"].as_str(), step["state"].as_str()),
        (Some("at_most_once"), Some("started"))
    );
    let resolved = idem(&[
        "steps",
        "resolve",
        &id,
        "--as",
        "sent",
        "--database-url",
        &url,
    ]);
    assert!(
        resolved.status.success(),
        "{}",
        String::from_utf8_lossy(&resolved.stderr)
    );
    let done = settle(shop.addr, "amo", &body, Duration::from_secs(30)).await;
    assert_eq!(done.status, 201);
    assert_eq!(w.relay.accepted().len(), 1, "sent once");
    let again = idem(&[
        "steps",
        "resolve",
        &id,
        "--as",
        "sent",
        "--database-url",
        &url,
    ]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("nothing to resolve"));
}

/// Bad input and hostile providers: an invalid order is a 400 that reserves
/// nothing and leaves the key unused; a provider answering garbage, or too
/// slowly, is asked again with the same key; one that stays away past the
/// deadline makes the order fail with nothing charged in the end.
pub async fn bad_input_and_hostile_providers(db: ShopDb) {
    let w = World::new(db).await;
    let shop = w.shop(&["--order-deadline", "3s"], None).await;
    set_stock(shop.addr, "tee", 10).await;
    for bad in [
        "{",
        r#"{"customer":"c","sku":"tee","quantity":0,"amount":1,"currency":"EUR","email":"a@b.c"}"#,
        r#"{"customer":"c","sku":"tee","quantity":1,"amount":1,"currency":"EUR","email":"nope"}"#,
    ] {
        let r = call(shop.addr, "POST", "/v1/orders", Some("bad"), bad).await;
        assert_eq!(r.status, 400, "{bad}");
    }
    assert_eq!(stock(shop.addr, "tee").await, (10, 0), "nothing reserved");
    let body = order_body("cus_g", "tee", 1, 700);
    // Garbage, then an answer too slow for the shop's 2 s call timeout.
    w.proxy.garble_next(1);
    w.proxy.delay_next(1, Duration::from_millis(2500));
    let done = settle(shop.addr, "bad", &body, Duration::from_secs(30)).await;
    assert_eq!(done.status, 201, "the key was not used up by the 400s");
    let charges = w.proxy.charges();
    assert!(charges.len() >= 2, "asked again");
    assert!(
        charges.iter().all(|c| c.key == charges[0].key),
        "always with the same key"
    );
    assert_eq!(w.payments().await.len(), 1);

    // Away past the deadline: the order fails, anything charged is refunded.
    w.proxy.reset_counts();
    w.proxy.refuse_charges_for(Duration::from_secs(4));
    let down = order_body("cus_down", "tee", 2, 800);
    let failed = settle(shop.addr, "down", &down, Duration::from_secs(60)).await;
    assert_eq!(
        failed.status,
        424,
        "{}",
        String::from_utf8_lossy(&failed.body)
    );
    let payments = w.payments().await;
    let net: i64 = payments
        .values()
        .filter(|p| p.0 == failed.json()["order"])
        .map(|p| p.1 - p.2)
        .sum();
    assert_eq!(net, 0, "no net charge");
    assert_eq!(
        stock(shop.addr, "tee").await,
        (9, 0),
        "the failed order's stock is back"
    );
}

/// The checkout tour of the README, literally: two `idem serve` processes
/// and `idem mail-sink`.
pub async fn tour() {
    let provider_dir = TempDir::new("tour-provider");
    let shop_dir = TempDir::new("tour-shop");
    let provider = Server::start(&provider_dir.sqlite_url(), &[]).await;
    let sink_addr: SocketAddr = format!("127.0.0.1:{}", crate::process::free_port())
        .parse()
        .unwrap();
    let _sink = Proc::spawn(
        &["mail-sink".into(), "--listen".into(), sink_addr.to_string()],
        None,
    );
    let provider_url = format!("http://{}", provider.addr);
    let mail_url = format!("http://{sink_addr}");
    let shop = Server::start(
        &shop_dir.sqlite_url(),
        &[
            "--provider-url",
            &provider_url,
            "--mail-url",
            &mail_url,
            "--max-body-bytes",
            "4096",
        ],
    )
    .await;
    let s = shop.addr;
    let put = call(s, "PUT", "/v1/inventory/tee-m", None, r#"{"available": 5}"#).await;
    assert_eq!(
        (put.status, put.json()["available"].as_i64()),
        (200, Some(5))
    );
    assert_eq!(put.header("etag").as_deref(), Some("\"1\""));
    // With If-Match, only over the version read: a writer that read an older
    // version changes nothing.
    let if_match = |version: &'static str, n: i64| async move {
        let body = format!(r#"{{"available":{n}}}"#);
        let req = crate::request("PUT", "/v1/inventory/tee-m", None, &body).replacen(
            "Host: localhost\r\n",
            &format!("Host: localhost\r\nIf-Match: {version}\r\n"),
            1,
        );
        let mut c = tokio::net::TcpStream::connect(s).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut c, req.as_bytes())
            .await
            .unwrap();
        let mut raw = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut c, &mut raw)
            .await
            .unwrap();
        raw
    };
    let moved = if_match("\"1\"", 6).await;
    assert!(
        moved.starts_with("HTTP/1.1 200") && moved.contains("etag: \"2\""),
        "{moved}"
    );
    let stale = if_match("\"1\"", 9).await;
    assert!(
        stale.starts_with("HTTP/1.1 412") && stale.contains("precondition-failed"),
        "{stale}"
    );
    assert!(if_match("nope", 9).await.starts_with("HTTP/1.1 400"));
    // The stock's body is bounded by --max-body-bytes like every other.
    let big = format!(r#"{{"available": 7, "pad": "{}"}}"#, "x".repeat(5000));
    let too_large = call(s, "PUT", "/v1/inventory/tee-m", None, &big).await;
    assert_eq!(too_large.status, 413);
    assert!(too_large.problem_type().ends_with("/body-too-large"));
    assert_eq!(stock(s, "tee-m").await.0, 6, "nothing changed");
    let put = call(s, "PUT", "/v1/inventory/tee-m", None, r#"{"available": 5}"#).await;
    assert_eq!(
        (put.status, put.header("etag").as_deref()),
        (200, Some("\"3\""))
    );
    let o = r#"{"customer":"cus_1","sku":"tee-m","quantity":2,"amount":3000,"currency":"EUR","email":"ada@example.com"}"#;
    let first = call(s, "POST", "/v1/orders", Some("o-1"), o).await;
    assert_eq!(
        first.status,
        201,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    let id = first.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(first.json()["status"], "confirmed");
    assert_eq!(first.header("location"), Some(format!("/v1/orders/{id}")));
    let replay = call(s, "POST", "/v1/orders", Some("o-1"), o).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body, "byte-identical");
    let got = call(s, "GET", &format!("/v1/orders/{id}"), None, "")
        .await
        .json();
    let steps: Vec<(&str, &str)> = got["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|st| (st["name"].as_str().unwrap(), st["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        steps,
        [
            ("reserve", "done"),
            ("charge", "done"),
            ("confirmation", "done"),
            ("confirm", "done")
        ]
    );
    assert_eq!(stock(s, "tee-m").await, (3, 0));
    let declined = r#"{"customer":"cus_decline_1","sku":"tee-m","quantity":1,"amount":500,"currency":"EUR","email":"bob@example.com"}"#;
    let d = call(s, "POST", "/v1/orders", Some("o-2"), declined).await;
    assert_eq!(
        (d.status, d.problem_type().as_str()),
        (402, "https://idem.dev/problems/card-declined")
    );
    let d2 = call(s, "POST", "/v1/orders", Some("o-2"), declined).await;
    assert!(d2.replayed());
    assert_eq!(d2.body, d.body);
    assert_eq!(stock(s, "tee-m").await, (3, 0), "released");
    let many = r#"{"customer":"cus_1","sku":"tee-m","quantity":50,"amount":500,"currency":"EUR","email":"ada@example.com"}"#;
    let oos = call(s, "POST", "/v1/orders", Some("o-3"), many).await;
    assert_eq!(
        (oos.status, oos.problem_type().as_str()),
        (409, "https://idem.dev/problems/out-of-stock")
    );
    assert!(
        call(s, "POST", "/v1/orders", Some("o-3"), many)
            .await
            .replayed()
    );
    let sink = call(sink_addr, "GET", "/messages", None, "").await.json();
    assert_eq!(sink["accepted"], 1, "one confirmation");
    let listed = call(s, "GET", "/v1/orders?customer=cus_decline_1", None, "")
        .await
        .json();
    assert_eq!(listed["data"][0]["reason"], "card_declined");
}

/// The history run: orders from concurrent clients that retry with their
/// key until they get a final answer, while the shop is killed at random
/// (SIGKILL, or an abort at a failpoint) and restarted, and the provider and
/// the relay lose answers at random. Checked afterwards from the provider's
/// and the relay's own records.
pub async fn history(db: ShopDb, orders: usize) {
    let seed = idem_testkit::seed();
    let rng = Arc::new(Rng::new(seed));
    let w = World::new(db).await;
    w.proxy.lose_percent(10, seed);
    w.proxy.latency(Duration::from_millis(40));
    w.relay.lose_percent(10, seed ^ 0x5555);
    // A short deadline: outages of the provider (below) make some orders
    // compensate — refund what went through, release the stock.
    let mut shop = w.shop(&["--order-deadline", "4s"], None).await;
    let skus = [("plenty", 10_000i64), ("scarce", 40), ("rare", 8)];
    for (sku, n) in skus {
        set_stock(shop.addr, sku, n).await;
    }
    let addr = shop.addr;
    let next = Arc::new(AtomicUsize::new(0));
    let stuck = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut clients = Vec::new();
    for _ in 0..6 {
        let (next, rng, stuck) = (next.clone(), rng.clone(), stuck.clone());
        clients.push(tokio::spawn(async move {
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= orders {
                    return done;
                }
                let customer = if rng.chance(15) {
                    format!("cus_decline_{i}")
                } else {
                    format!("cus_h{i}")
                };
                // Mostly plenty; the scarce and rare ones run out.
                let sku = match rng.range(0, 10) {
                    0..=6 => skus[0].0,
                    7 | 8 => skus[1].0,
                    _ => skus[2].0,
                };
                let quantity = rng.range(1, 4) as i64;
                let body = order_body(&customer, sku, quantity, 100 + i as i64);
                match try_settle(addr, &format!("h-{i}"), &body, Duration::from_secs(120)).await {
                    Ok(r) => done.push((i, sku, quantity, r)),
                    Err(e) => {
                        stuck.lock().unwrap().push(e);
                        return done;
                    }
                }
            }
        }));
    }
    let finished = Arc::new(AtomicUsize::new(0));
    let chaos = {
        let (rng, finished, proxy) = (rng.clone(), finished.clone(), w.proxy.clone());
        let points = [
            "steps.after_call",
            "steps.after_send",
            "steps.undo.after_call",
            "steps.before_call",
        ];
        async move {
            let (mut kills, mut armed, mut outages) = (0usize, 0usize, 1usize);
            // One provider outage early on, so some orders always reach
            // their deadline with a charge that went through: refunds.
            tokio::time::sleep(Duration::from_millis(rng.range(500, 1500))).await;
            let first = Duration::from_millis(rng.range(4500, 6000));
            proxy.lose_charges_for(first);
            // Outages are episodes, apart and few: a compensation retries a
            // refund for about 90 s before it waits for an operator (the
            // failures budget), and outages that never end would (rightly)
            // send it there.
            let mut calm_from = Instant::now() + first + Duration::from_secs(5);
            while finished.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(rng.range(200, 800))).await;
                if finished.load(Ordering::SeqCst) != 0 {
                    break;
                }
                // A shop that aborted at its failpoint is restarted at once.
                let aborted = !shop.proc().alive();
                if !aborted {
                    match rng.range(0, 100) {
                        // The provider takes charges but its answers are lost.
                        0..=9 if outages < 6 && Instant::now() >= calm_from => {
                            outages += 1;
                            let d = Duration::from_millis(rng.range(3000, 6000));
                            proxy.lose_charges_for(d);
                            calm_from = Instant::now() + d + Duration::from_secs(5);
                            continue;
                        }
                        10..=29 => continue,
                        _ => {}
                    }
                    kills += 1;
                }
                let failpoint = rng
                    .chance(50)
                    .then(|| format!("{}={}", points[rng.range(0, 4) as usize], rng.range(1, 4)));
                armed += usize::from(failpoint.is_some());
                shop.proc().kill9();
                tokio::time::sleep(Duration::from_millis(rng.range(0, 300))).await;
                let args = shop.proc().args.clone();
                *shop.proc() = Proc::spawn(&args, failpoint.as_deref());
                for _ in 0..400 {
                    if try_call(addr, "GET", "/healthz", None, "").await.is_ok()
                        || !shop.proc().alive()
                    {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
            }
            (shop, kills, armed, outages)
        }
    };
    let chaos = tokio::spawn(chaos);
    let mut results = Vec::new();
    for c in clients {
        results.extend(c.await.unwrap());
    }
    finished.store(1, Ordering::SeqCst);
    let (mut shop, kills, armed, outages) = chaos.await.unwrap();
    let stuck = stuck.lock().unwrap().clone();
    assert!(
        stuck.is_empty(),
        "seed {seed}: {stuck:?}; waiting for an operator: {:?}",
        w.attention().await
    );
    // Calm: a shop without failpoints finishes what is left.
    shop.restart().await;
    let until = Instant::now() + Duration::from_secs(60);
    while w.unfinished_runs().await > 0 {
        assert!(Instant::now() < until, "seed {seed}: runs left unfinished");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The history, from the provider's and the relay's own records.
    let t = w.tally(&results).await;
    for (sku, initial) in skus {
        let (available, reserved) = stock(shop.addr, sku).await;
        let want = initial - sold(&results, sku);
        assert_eq!(
            (available + reserved, reserved),
            (want, 0),
            "seed {seed}: stock of {sku}"
        );
    }
    println!(
        "checkout history: seed={seed} orders={} confirmed={} failed={} declined={} \
         out_of_stock={} kills={kills} failpoints_armed={armed} provider_outages={outages} charges_sent={} refunds_sent={} \
         double_charges={} lost={} duplicate_mails={} stray_payments={} over_refunded={} key_changes={}",
        results.len(),
        t.confirmed,
        t.failed,
        t.declined,
        t.out_of_stock,
        w.proxy.charges().len(),
        w.proxy.refunds().len(),
        t.double_charges,
        t.lost,
        t.duplicate_mails,
        t.stray,
        t.over_refunded,
        t.key_changes,
    );
    assert!(results.len() >= orders);
    assert_eq!(
        (
            t.double_charges,
            t.lost,
            t.duplicate_mails,
            t.stray,
            t.over_refunded,
            t.key_changes
        ),
        (0, 0, 0, 0, 0, 0),
        "seed {seed}"
    );
}

/// What a run of orders came to, from the provider's and the mail relay's
/// own records.
#[derive(Debug, Clone, Copy, Default)]
pub struct OrderTally {
    pub confirmed: usize,
    pub failed: usize,
    pub declined: usize,
    pub out_of_stock: usize,
    pub double_charges: usize,
    pub lost: usize,
    pub duplicate_mails: usize,
    pub stray: usize,
    pub over_refunded: usize,
    pub key_changes: usize,
}

/// Units of `sku` the confirmed orders among `results` took.
pub fn sold(results: &[(usize, &str, i64, Reply)], sku: &str) -> i64 {
    results
        .iter()
        .filter(|(_, s, _, r)| *s == sku && r.status == 201)
        .map(|(_, _, q, _)| *q)
        .sum()
}

impl World {
    /// The orders `results` (index, sku, quantity, final answer) against
    /// the provider's payments and refunds and the relay's mails: a
    /// confirmed order has one payment, not refunded, and one mail; a
    /// failed one no net charge and no mail; no payment belongs to no order;
    /// every charge of an order carried one key.
    pub async fn tally(&self, results: &[(usize, &str, i64, Reply)]) -> OrderTally {
        let w = self;
        let payments = w.payments().await;
        let refunds = w.refunds().await;
        let mut payments_by_order: HashMap<String, Vec<(String, i64, i64)>> = HashMap::new();
        for (id, (reference, amount, refunded)) in &payments {
            payments_by_order
                .entry(reference.clone())
                .or_default()
                .push((id.clone(), *amount, *refunded));
        }
        // Every charge of one order carried one key: the derived one.
        let mut keys_by_order: HashMap<String, std::collections::HashSet<String>> = HashMap::new();
        for c in w.proxy.charges() {
            keys_by_order
                .entry(c.reference.clone().unwrap_or_default())
                .or_default()
                .insert(c.key.clone().unwrap_or_default());
        }
        let key_changes: usize = keys_by_order.values().map(|k| k.len() - 1).sum();
        let mails = w.relay.accepted();
        let (mut confirmed, mut failed, mut declined, mut out_of_stock) = (0, 0, 0, 0);
        let (mut double_charges, mut lost, mut duplicate_mails, mut stray) = (0, 0, 0, 0);
        let mut known_orders = std::collections::HashSet::new();
        for (i, _, _, r) in results {
            let v = r.json();
            match r.status {
                201 => {
                    confirmed += 1;
                    let id = v["id"].as_str().unwrap().to_owned();
                    let p = payments_by_order.get(&id).cloned().unwrap_or_default();
                    double_charges += p.len().saturating_sub(1);
                    lost += usize::from(p.len() != 1 || p.iter().any(|x| x.2 != 0));
                    let copies = mails
                        .iter()
                        .filter(|m| **m == format!("confirm-{id}"))
                        .count();
                    lost += usize::from(copies == 0);
                    duplicate_mails += copies.saturating_sub(1);
                    known_orders.insert(id);
                }
                402 | 424 => {
                    failed += 1;
                    declined += usize::from(r.status == 402);
                    let id = v["order"].as_str().unwrap().to_owned();
                    let p = payments_by_order.get(&id).cloned().unwrap_or_default();
                    double_charges += p.len().saturating_sub(1);
                    // No net charge: none, or refunded in full.
                    lost += p.iter().filter(|x| x.2 != x.1).count();
                    duplicate_mails += mails
                        .iter()
                        .filter(|m| **m == format!("confirm-{id}"))
                        .count();
                    known_orders.insert(id);
                }
                409 => out_of_stock += 1,
                s => panic!("order {i} ended with {s}"),
            }
        }
        for reference in payments_by_order.keys() {
            stray += usize::from(!known_orders.contains(reference));
        }
        let over_refunded = refunds.values().filter(|n| **n > 1).count();
        OrderTally {
            confirmed,
            failed,
            declined,
            out_of_stock,
            double_charges,
            lost,
            duplicate_mails,
            stray,
            over_refunded,
            key_changes,
        }
    }
}

/// Drill 8 for orders: once the key's record expired and was collected, the
/// same intent is a new request; its run finds the order it would create
/// (the order id is derived from the key) and answers `409 order-exists`
/// with its `Location` — no second reservation, charge or mail. The key
/// reused for another order is refused with `422`.
pub async fn late_retry_after_the_ttl(db: ShopDb) {
    let w = World::new(db).await;
    let shop = w
        .shop(&["--key-ttl", "1s", "--gc-interval", "1s"], None)
        .await;
    set_stock(shop.addr, "tee", 10).await;
    let body = order_body("cus_late", "tee", 2, 1200);
    let first = settle(shop.addr, "late", &body, Duration::from_secs(30)).await;
    assert_eq!(first.status, 201);
    let order = first.json()["id"].as_str().unwrap().to_owned();
    let mut late = None;
    for _ in 0..100 {
        let r = call(shop.addr, "POST", "/v1/orders", Some("late"), &body).await;
        if !r.replayed() {
            late = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let late = late.expect("the key record expired and was collected within 10 s");
    assert_eq!(late.status, 409, "{}", String::from_utf8_lossy(&late.body));
    assert_eq!(
        late.problem_type(),
        "https://idem.dev/problems/order-exists"
    );
    assert_eq!(late.header("location"), Some(format!("/v1/orders/{order}")));
    assert_eq!(late.json()["order"], order.as_str());
    assert_eq!(w.payments().await.len(), 1, "no second charge");
    assert_eq!(w.relay.accepted().len(), 1, "no second mail");
    assert_eq!(stock(shop.addr, "tee").await, (8, 0), "reserved once");
    // The key reused for another order, once expired again: the run finds an
    // order with other fields under it and refuses, changing nothing.
    let other = order_body("cus_late", "tee", 3, 1800);
    let mut refused = None;
    for _ in 0..100 {
        let r = call(shop.addr, "POST", "/v1/orders", Some("late"), &other).await;
        assert_eq!(r.status, 422, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(
            r.problem_type(),
            "https://idem.dev/problems/idempotency-key-reused"
        );
        if r.json()["detail"]
            .as_str()
            .is_some_and(|d| d.contains("other fields"))
        {
            refused = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refused.is_some(), "the key expired again within 10 s");
    assert_eq!(w.payments().await.len(), 1, "no charge for the other order");
    assert_eq!(stock(shop.addr, "tee").await, (8, 0), "nothing reserved");
}

/// `idem steps` refuses what it cannot use, with one line and exit code 1.
#[test]
fn steps_commands_refuse_bad_input() {
    let dir = TempDir::new("steps-cli");
    let url = dir.sqlite_url();
    assert!(idem(&["migrate", "--database-url", &url]).status.success());
    for (args, says) in [
        (vec!["steps", "show", "not-a-run"], "run id must be run_"),
        (
            vec!["steps", "show", "run_0123456789abcdef0123456789abcdef"],
            "no run run_0123456789abcdef0123456789abcdef",
        ),
        (
            vec!["steps", "list", "--state", "bogus"],
            "--state bogus: expected",
        ),
        (
            vec!["steps", "list", "--limit", "0"],
            "--limit must be between 1 and 1000",
        ),
        (
            vec![
                "steps",
                "resolve",
                "ord_0123456789abcdef0123456789abcdef",
                "--as",
                "sent",
            ],
            "no run run_0123456789abcdef0123456789abcdef",
        ),
        (vec!["steps", "recover"], "needs --provider-url"),
        (
            vec!["steps", "recover", "--provider-url", "ftp://x"],
            "--provider-url must be an http:// URL",
        ),
        (
            vec![
                "steps",
                "recover",
                "--provider-url",
                "http://user:secret@127.0.0.1:9",
            ],
            "must not hold credentials",
        ),
        (
            vec![
                "steps",
                "recover",
                "--provider-url",
                "http://127.0.0.1:9",
                "--mail-delivery",
                "at-most-once",
            ],
            "--mail-delivery needs --mail-url",
        ),
        (
            vec![
                "steps",
                "recover",
                "--provider-url",
                "http://127.0.0.1:9",
                "--landing-margin",
                "2h",
            ],
            "--landing-margin must be between 0s and 1h",
        ),
    ] {
        let mut full = args.clone();
        full.extend(["--database-url", &url]);
        let out = idem(&full);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line: {err}");
        assert!(
            !err.contains("secret"),
            "{args:?}: no credentials in errors: {err}"
        );
    }
    let missing = idem(&[
        "steps",
        "list",
        "--database-url",
        "sqlite:///tmp/idem-no-such-dir-x/none.db",
    ]);
    assert_eq!(missing.status.code(), Some(1));
}

on_both! {
    drill7;
    compensation_crash;
    zombie;
    at_most_once_needs_attention;
    bad_input_and_hostile_providers;
    late_retry_after_the_ttl;
    history, 200;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_recovery_workers_on_postgres() {
    two_recovery_workers(ShopDb::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checkout_tour_works_as_written() {
    tour().await;
}

/// A stock write whose database stops answering mid-transaction is
/// answered `503 outcome-unknown`, not `store-unavailable`: its `COMMIT`
/// may have been applied, and "nothing was written" would be a guess. The
/// database goes silent right after the write's `COMMIT` reached it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stock_write_whose_commit_is_not_answered_is_outcome_unknown() {
    let db = PgDatabase::create("idem_stock_put").await;
    let proxy = idem_testkit::Proxy::start(idem_testkit::url_addr(&db.url)).await;
    let url = idem_testkit::url_via(&db.url, proxy.addr);
    let nowhere = format!("http://127.0.0.1:{}", crate::process::free_port());
    let shop = Server::start(&url, &["--provider-url", &nowhere, "--mail-url", &nowhere]).await;
    let put = call(
        shop.addr,
        "PUT",
        "/v1/inventory/tee-m",
        None,
        r#"{"available": 5}"#,
    )
    .await;
    assert_eq!(put.status, 200, "{}", String::from_utf8_lossy(&put.body));
    proxy.freeze_after_next(b"COMMIT");
    let started = Instant::now();
    let silent = call(
        shop.addr,
        "PUT",
        "/v1/inventory/tee-m",
        None,
        r#"{"available": 4}"#,
    )
    .await;
    assert_eq!(
        silent.status,
        503,
        "{}",
        String::from_utf8_lossy(&silent.body)
    );
    assert_eq!(
        silent.problem_type(),
        "https://idem.dev/problems/outcome-unknown",
        "{}",
        String::from_utf8_lossy(&silent.body)
    );
    proxy.thaw();
    println!(
        "stock write, commit unanswered: 503 outcome-unknown after {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
