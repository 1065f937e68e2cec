//! Compensations never create what they undo (issue 20, finding 7), with
//! real processes: the shop (`idem serve --provider-url …`) on SQLite or
//! PostgreSQL, the provider (a second `idem serve`) behind the recording
//! proxy of `fakes.rs`.
//!
//! - The provider is a black hole past the order's deadline: the orders
//!   fail, and once it is back it holds nothing for them — no payment made
//!   by a compensation that "learns the outcome" by charging again.
//! - The charge lands and its answer is lost: the compensation finds it by
//!   the provider's lookup and refunds it once, never charging.

use std::time::{Duration, Instant};

use idem_core::steps::{StepKind, StepState};

use crate::call;
use crate::checkout::{ShopDb, World, order_body, set_stock, settle, stock};

/// The shop's flags here, on top of the drills' (`checkout::SHOP`, whose
/// landing margin is 2 s: the provider behind the proxy commits at once,
/// and the proxy never delivers what it swallowed): a 3 s order deadline.
const SHOP: &[&str] = &["--order-deadline", "3s"];

/// Waits until the shop has no run left that is not final.
async fn settled(w: &World, within: Duration) {
    let until = Instant::now() + within;
    while w.unfinished_runs().await > 0 {
        assert!(
            Instant::now() < until,
            "runs left unfinished: {:?}",
            w.attention().await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Finding 7: the provider black-holed for 6 s, order deadline 3 s, 10
/// orders. Every order fails with `424 payment-failed`; once the provider
/// is back and everything settled, it holds **no payment and no refund**
/// for them: the compensation looked the charge up (not found, after the
/// landing window) instead of re-sending it.
pub async fn a_black_holed_provider_is_not_charged_by_compensation(db: ShopDb) {
    let w = World::new(db).await;
    let shop = w.shop(SHOP, None).await;
    set_stock(shop.addr, "tee", 100).await;
    w.proxy.black_hole_for(Duration::from_secs(6));
    let n = 10;
    let mut clients = Vec::new();
    for i in 0..n {
        let addr = shop.addr;
        let body = order_body(&format!("cus_bh{i}"), "tee", 1, 1000 + i);
        clients.push(tokio::spawn(async move {
            settle(addr, &format!("bh-{i}"), &body, Duration::from_secs(120)).await
        }));
    }
    let mut answers = Vec::new();
    for c in clients {
        answers.push(c.await.unwrap());
    }
    settled(&w, Duration::from_secs(60)).await;
    // Anything a compensation sent after the hole closed has landed by now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let orders: Vec<String> = answers
        .iter()
        .map(|a| a.json()["order"].as_str().unwrap_or_default().to_owned())
        .collect();
    let payments = w.payments().await;
    let ours = payments.values().filter(|p| orders.contains(&p.0)).count();
    let refunds: i64 = w.refunds().await.values().sum();
    let charges = w.proxy.charges();
    let delivered = charges.iter().filter(|c| !c.swallowed).count();
    let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
    println!(
        "black hole: answers={statuses:?} payments={ours} refunds={refunds} charges_sent={} \
         charges_delivered={delivered} refunds_sent={} lookups={}",
        charges.len(),
        w.proxy.refunds().len(),
        w.proxy.lookups().len(),
    );
    for a in &answers {
        assert_eq!(a.status, 424, "{}", String::from_utf8_lossy(&a.body));
        assert_eq!(a.problem_type(), "https://idem.dev/problems/payment-failed");
    }
    assert_eq!(
        (ours, refunds),
        (0, 0),
        "the provider holds no payment and no refund for the failed orders"
    );
    assert_eq!(
        delivered, 0,
        "no charge reached the provider, before or after"
    );
    assert!(
        w.proxy.lookups().iter().any(|l| !l.swallowed),
        "the compensations asked the provider once it was back"
    );
    assert_eq!(stock(shop.addr, "tee").await, (100, 0), "stock released");
    for order in &orders {
        let got = call(shop.addr, "GET", &format!("/v1/orders/{order}"), None, "")
            .await
            .json();
        assert_eq!(
            (got["status"].as_str(), got["reason"].as_str()),
            (Some("failed"), Some("payment_unavailable"))
        );
        let run = w.run(order).await;
        let refund = run.step("refund").expect("the compensation is recorded");
        assert_eq!(
            (refund.kind, refund.state),
            (StepKind::Undo, StepState::Done)
        );
        let learned = String::from_utf8_lossy(refund.result.as_deref().unwrap_or_default());
        assert!(learned.contains("not_found"), "{learned}");
    }
}

/// The charge lands and its answers are lost until past the deadline: the
/// order fails; its compensation finds the payment with the provider's
/// lookup (by the order id, the payment's reference) and refunds it once.
/// No charge is sent after the first lookup.
pub async fn a_lost_charge_answer_is_found_and_refunded_once(db: ShopDb) {
    let w = World::new(db).await;
    let shop = w.shop(SHOP, None).await;
    set_stock(shop.addr, "tee", 10).await;
    w.proxy.lose_charges_for(Duration::from_secs(5));
    let body = order_body("cus_la", "tee", 2, 2500);
    let done = settle(shop.addr, "la", &body, Duration::from_secs(60)).await;
    assert_eq!(done.status, 424, "{}", String::from_utf8_lossy(&done.body));
    let order = done.json()["order"].as_str().unwrap().to_owned();
    settled(&w, Duration::from_secs(30)).await;
    let payments = w.payments().await;
    assert_eq!(payments.len(), 1, "one payment: the charge that landed");
    let (reference, amount, refunded) = payments.values().next().unwrap().clone();
    assert_eq!(reference, order);
    assert_eq!(refunded, amount, "refunded in full");
    assert_eq!(
        w.refunds().await.values().copied().collect::<Vec<_>>(),
        [1],
        "one refund"
    );
    assert_eq!(w.proxy.refunds().len(), 1, "sent once");
    let seen = w.proxy.seen();
    let first_lookup = seen
        .iter()
        .position(|s| s.method == "GET" && s.path == "/v1/payments")
        .expect("the compensation looked the charge up");
    assert!(
        seen[first_lookup..]
            .iter()
            .all(|s| !(s.method == "POST" && s.path == "/v1/payments")),
        "no charge after the lookup: {seen:?}"
    );
    let charges = w.proxy.charges();
    assert!(charges.iter().all(|c| c.key == charges[0].key));
    assert_eq!(stock(shop.addr, "tee").await, (10, 0));
    let run = w.run(&order).await;
    let refund = run.step("refund").unwrap();
    assert_eq!(
        (refund.kind, refund.state),
        (StepKind::Undo, StepState::Done)
    );
    let learned = String::from_utf8_lossy(refund.result.as_deref().unwrap_or_default());
    assert!(learned.contains("\"found\""), "{learned}");
    println!(
        "lost answer: charges_sent={} lookups={} refunds_sent=1 payments=1 refunded_in_full=true",
        charges.len(),
        w.proxy.lookups().len()
    );
}

on_both! {
    a_black_holed_provider_is_not_charged_by_compensation;
    a_lost_charge_answer_is_found_and_refunded_once;
}
