//! The history run: payments and refunds are created while the API, the relay
//! and the consumer are killed at random points (SIGKILL, or an abort at a
//! failpoint armed at random) and restarted, and published events are
//! replayed on top. Afterwards, checked like a queue history: every
//! acknowledged intent has exactly one payment, every payment one charge in
//! the ledger and one receipt, every refund one ledger entry, no event is
//! dead, and each payment's events were published in order (in the stream,
//! a payment's `created` comes before its `refunded`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use idem_testkit::Rng;

use crate::messaging::{Rig, consumer_state, eventually, replay_stream, stream_events};
use crate::process::{Proc, Server};
use crate::{Reply, try_call};

/// One intent of a client, retried with the same key until it is answered.
async fn settle(addr: std::net::SocketAddr, path: &str, key: &str, body: &str) -> Reply {
    for _ in 0..2000 {
        match try_call(addr, "POST", path, Some(key), body).await {
            Ok(r) if r.status < 500 && r.status != 409 => return r,
            // Down, restarting, busy, or in flight: the same intent again.
            _ => tokio::time::sleep(Duration::from_millis(25)).await,
        }
    }
    panic!("{key} was never answered");
}

/// What the database says happened, per payment.
#[derive(Debug, Default)]
pub struct Effects {
    pub charges: i64,
    pub refunds: i64,
    pub receipts: i64,
}

/// The payments, and the effects per payment.
pub async fn effects_by_payment(db_url: &str) -> (Vec<String>, BTreeMap<String, Effects>) {
    type Ledger = Vec<(String, String)>;
    const PAYMENTS: &str = "SELECT id FROM demo_payments";
    const LEDGER: &str = "SELECT payment_id, kind FROM demo_ledger_entries";
    const RECEIPTS: &str = "SELECT payment_id FROM demo_notifications";
    let (payments, ledger, receipts): (Vec<String>, Ledger, Vec<String>) =
        if db_url.starts_with("sqlite:") {
            let pool = sqlx::SqlitePool::connect(db_url).await.unwrap();
            (
                sqlx::query_scalar(PAYMENTS).fetch_all(&pool).await.unwrap(),
                sqlx::query_as(LEDGER).fetch_all(&pool).await.unwrap(),
                sqlx::query_scalar(RECEIPTS).fetch_all(&pool).await.unwrap(),
            )
        } else {
            let pool = sqlx::PgPool::connect(db_url).await.unwrap();
            (
                sqlx::query_scalar(PAYMENTS).fetch_all(&pool).await.unwrap(),
                sqlx::query_as(LEDGER).fetch_all(&pool).await.unwrap(),
                sqlx::query_scalar(RECEIPTS).fetch_all(&pool).await.unwrap(),
            )
        };
    let mut out: BTreeMap<String, Effects> = BTreeMap::new();
    for (payment, kind) in ledger {
        let e = out.entry(payment).or_default();
        if kind == "charge" {
            e.charges += 1;
        } else {
            e.refunds += 1;
        }
    }
    for payment in receipts {
        out.entry(payment).or_default().receipts += 1;
    }
    (payments, out)
}

/// Payments whose `refunded` event is not after their `created` event in
/// the stream (where each event first appears: a republished or replayed
/// copy comes later).
pub async fn misordered(js: &async_nats::jetstream::Context) -> usize {
    let mut first_seen: BTreeMap<String, (u64, String, String)> = BTreeMap::new();
    for (seq, id, key, subject) in stream_events(js).await {
        first_seen.entry(id).or_insert((seq, key, subject));
    }
    let mut created_at: BTreeMap<String, u64> = BTreeMap::new();
    let mut refunded_at: BTreeMap<String, u64> = BTreeMap::new();
    for (seq, key, subject) in first_seen.into_values() {
        let slot = if subject.ends_with("created") {
            &mut created_at
        } else {
            &mut refunded_at
        };
        slot.insert(key, seq);
    }
    let mut misordered = 0usize;
    for (payment, r) in &refunded_at {
        misordered += usize::from(created_at.get(payment).is_none_or(|c| c >= r));
    }
    misordered
}

/// (lost, duplicated) effects of the acknowledged payments `done` (id,
/// refunded?): each has one charge, one receipt, and one refund entry if
/// it was refunded.
pub fn tally(done: &[(String, bool)], effects: &BTreeMap<String, Effects>) -> (i64, i64) {
    let (mut lost, mut duplicated) = (0i64, 0i64);
    for (id, refunded) in done {
        let e = effects.get(id);
        let (charges, refund_rows, receipts) =
            e.map_or((0, 0, 0), |e| (e.charges, e.refunds, e.receipts));
        let want_refunds = i64::from(*refunded);
        lost += (1 - charges).max(0) + (1 - receipts).max(0) + (want_refunds - refund_rows).max(0);
        duplicated +=
            (charges - 1).max(0) + (receipts - 1).max(0) + (refund_rows - want_refunds).max(0);
    }
    (lost, duplicated)
}

pub async fn history(rig: Rig, span: Duration) {
    let seed = idem_testkit::seed();
    let rng = Arc::new(Rng::new(seed));
    let mut api = Server::start(&rig.db_url, &["--events"]).await;
    let addr = api.addr;
    let relay = Arc::new(tokio::sync::Mutex::new(rig.relay(None)));
    let consumer = Arc::new(tokio::sync::Mutex::new(rig.consumer(None)));

    // Clients: four of them create intents for `span`.
    let next = Arc::new(AtomicUsize::new(0));
    let until = tokio::time::Instant::now() + span;
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (next, rng) = (next.clone(), rng.clone());
        clients.push(tokio::spawn(async move {
            let mut done = Vec::new();
            while tokio::time::Instant::now() < until {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let body = format!(
                    r#"{{"amount":{},"currency":"EUR","customer":"cus_h","reference":"ref-{i}"}}"#,
                    1000 + i
                );
                let created = settle(addr, "/v1/payments", &format!("h-{i}"), &body).await;
                assert_eq!(
                    created.status,
                    201,
                    "intent {i}: {}",
                    String::from_utf8_lossy(&created.body)
                );
                let id = created.json()["id"].as_str().unwrap().to_owned();
                let refunded = rng.chance(50);
                if refunded {
                    let path = format!("/v1/payments/{id}/refunds");
                    let r = settle(addr, &path, &format!("hr-{i}"), r#"{"amount":10}"#).await;
                    assert_eq!(r.status, 201, "refund {i}");
                }
                done.push((id, refunded));
            }
            done
        }));
    }

    // Chaos, until the clients are done.
    let clients_done = Arc::new(AtomicBool::new(false));
    let (mut kills, mut armed, mut aborted) = (0usize, 0usize, 0usize);
    let chaos = {
        let (rng, clients_done, relay, consumer) = (
            rng.clone(),
            clients_done.clone(),
            relay.clone(),
            consumer.clone(),
        );
        let rig_relay = rig.relay_args();
        let rig_consumer = rig.consumer_args();
        async move {
            while !clients_done.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(rng.range(50, 400))).await;
                // A process that reached its armed failpoint aborted by itself.
                for (proc, args) in [(&relay, &rig_relay), (&consumer, &rig_consumer)] {
                    let mut p = proc.lock().await;
                    if !p.alive() {
                        aborted += 1;
                        *p = Proc::spawn(args, None);
                    }
                }
                match rng.range(0, 3) {
                    0 => {
                        kills += 1;
                        api.restart().await;
                    }
                    victim => {
                        let (proc, args, point) = if victim == 1 {
                            (&relay, &rig_relay, "relay.after_publish")
                        } else {
                            (&consumer, &rig_consumer, "consume.after_commit")
                        };
                        let mut p = proc.lock().await;
                        p.kill9();
                        kills += 1;
                        tokio::time::sleep(Duration::from_millis(rng.range(20, 200))).await;
                        let failpoint = rng
                            .chance(40)
                            .then(|| format!("{point}={}", rng.range(1, 4)));
                        armed += usize::from(failpoint.is_some());
                        *p = Proc::spawn(args, failpoint.as_deref());
                    }
                }
            }
            (api, kills, armed, aborted)
        }
    };
    let chaos = tokio::spawn(chaos);
    let mut done = Vec::new();
    for c in clients {
        done.extend(c.await.unwrap());
    }
    clients_done.store(true, Ordering::SeqCst);
    let (api, kills, armed, aborted) = chaos.await.unwrap();

    // Calm: every process up without failpoints, then duplicates on top.
    for (proc, args) in [(&relay, rig.relay_args()), (&consumer, rig.consumer_args())] {
        let mut p = proc.lock().await;
        p.kill9();
        *p = Proc::spawn(&args, None);
    }
    let js = rig.js().await;
    eventually(Duration::from_secs(60), "the outbox drains", || async {
        rig.outbox()["pending"] == 0
    })
    .await;
    let replayed = replay_stream(&js, |seq| seq % 5 == seed % 5).await;
    eventually(
        Duration::from_secs(60),
        "every delivery is acked",
        || async { matches!(consumer_state(&js).await, Some((0, 0, _))) },
    )
    .await;

    // The history.
    let (all_payments, effects) = effects_by_payment(&rig.db_url).await;
    let payments = all_payments.len();
    let refunds = done.iter().filter(|(_, r)| *r).count();
    let misordered = misordered(&js).await;
    let (lost, duplicated) = tally(&done, &effects);
    let strays = effects.len().saturating_sub(done.len());
    let dead = rig.outbox()["dead"].as_u64().unwrap();
    let dead_letters = match js.get_stream(idem_server::messaging::DLQ_STREAM).await {
        Ok(s) => s.get_info().await.map_or(0, |i| i.state.messages),
        Err(_) => 0,
    };
    println!(
        "history: seed={seed} payments={payments} refunds={refunds} events={} kills={kills} \
         failpoints_armed={armed} aborted_at_failpoint={aborted} forced_duplicates={replayed} \
         lost={lost} duplicated_effects={duplicated} misordered={misordered} dead={dead} dead_letters={dead_letters}",
        done.len() + refunds
    );
    assert_eq!(
        payments,
        done.len(),
        "seed {seed}: one payment per acknowledged intent"
    );
    assert_eq!(
        (lost, duplicated, misordered, dead, strays),
        (0, 0, 0, 0, 0),
        "seed {seed}"
    );
    drop(api);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_run_on_postgres() {
    history(Rig::postgres().await, Duration::from_secs(12)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_run_on_sqlite() {
    history(Rig::sqlite().await, Duration::from_secs(12)).await;
}
