//! The gateway as a real user meets it: real retrying clients none of us
//! wrote — python `requests` with urllib3's `Retry`, Stripe's own library
//! (`stripe.StripeClient`, `max_network_retries=3`) — and `idem-client`,
//! through `idem serve --upstream` in front of `idem upstream
//! --lose-first-answer`, a non-idempotent upstream that commits each key's
//! first POST and closes the connection without answering. The upstream's
//! own lookup (`GET /v1/payments?reference=…`) counts the effects.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};

use crate::checkout::ShopDb;
use crate::process::{Proc, Server, free_port};
use crate::{call, try_call};

/// `idem upstream --lose-first-answer`, answering `/healthz`.
async fn losing_upstream() -> (Proc, SocketAddr) {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut proc = Proc::spawn(
        &[
            "upstream".into(),
            "--listen".into(),
            addr.to_string(),
            "--lose-first-answer".into(),
        ],
        None,
    );
    for _ in 0..600 {
        if try_call(addr, "GET", "/healthz", None, "").await.is_ok() {
            return (proc, addr);
        }
        assert!(proc.alive(), "idem upstream exited early");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("idem upstream did not answer within 30 s");
}

/// The payments the upstream holds for `reference`.
async fn effects(upstream: SocketAddr, reference: &str) -> usize {
    let r = call(
        upstream,
        "GET",
        &format!("/v1/payments?reference={reference}"),
        None,
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    r.json()["data"].as_array().unwrap().len()
}

/// Runs `tests/clients/retrying_clients.py` against `base`: one JSON line
/// per intent.
async fn python_clients(base: &str, tag: &str, intents: usize) -> Vec<Value> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/retrying_clients.py"
    );
    let mut cmd = std::process::Command::new(idem_testkit::python());
    cmd.args([script, base, tag, &intents.to_string()]);
    let run = tokio::task::spawn_blocking(move || cmd.output());
    let out = tokio::time::timeout(Duration::from_secs(180), run)
        .await
        .expect("the clients finished within 3 min")
        .unwrap()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `idem-client`'s intents, each with its reference; their final statuses.
async fn idem_client(base: &str, tag: &str, intents: usize) -> Vec<(String, u16)> {
    let mut policy = idem_client::RetryPolicy::default();
    policy.initial_backoff = Duration::from_millis(20);
    let client = idem_client::Client::builder()
        .retry_policy(policy)
        .build(base)
        .unwrap();
    let mut out = Vec::new();
    for n in 0..intents {
        let reference = format!("{tag}-idem-client-{n}");
        let answer = client
            .post("/v1/payments")
            .json(&json!({"amount": 3000 + n, "currency": "EUR", "reference": reference}))
            .send()
            .await
            .unwrap();
        out.push((reference, answer.status.as_u16()));
    }
    out
}

const INTENTS: usize = 3;

/// Every intent of every client through `gateway`: exactly one effect
/// upstream; the statuses, for the summary line and the caller's checks.
async fn one_effect_per_intent(
    gateway: SocketAddr,
    upstream: SocketAddr,
    tag: &str,
) -> Vec<(String, String, Option<u64>)> {
    let base = format!("http://{gateway}");
    let mut results: Vec<(String, String, Option<u64>)> = python_clients(&base, tag, INTENTS)
        .await
        .into_iter()
        .map(|v| {
            (
                v["client"].as_str().unwrap().to_owned(),
                v["reference"].as_str().unwrap().to_owned(),
                v["status"].as_u64(),
            )
        })
        .collect();
    for (reference, status) in idem_client(&base, tag, INTENTS).await {
        results.push(("idem-client".into(), reference, Some(u64::from(status))));
    }
    assert_eq!(results.len(), 3 * INTENTS);
    for (client, reference, status) in &results {
        assert_eq!(
            effects(upstream, reference).await,
            1,
            "{client}: one effect for {reference} (final status {status:?})"
        );
    }
    results
}

/// `--upstream URL` alone: every retry of a lost answer is held (409
/// outcome-unknown), never forwarded again: one effect per intent.
pub async fn real_clients_through_a_default_gateway_make_one_effect_per_intent(db: ShopDb) {
    let (_up, upstream) = losing_upstream().await;
    let gw = Server::start(&db.url(), &["--upstream", &format!("http://{upstream}")]).await;
    let results = one_effect_per_intent(gw.addr, upstream, "default").await;
    for (client, reference, status) in &results {
        assert_eq!(
            *status,
            Some(409),
            "{client} {reference}: the lost answer's outcome is unknown, held"
        );
    }
    println!(
        "real clients, default gateway: clients=requests+urllib3,stripe-python,idem-client \
         intents={} effects_per_intent=1 final=409 outcome-unknown",
        results.len()
    );
}

/// A `verify` route: the lookup finds each lost answer's payment, so every
/// client gets it on its first try; one effect per intent.
pub async fn real_clients_through_a_verify_route_get_the_payment(db: ShopDb) {
    let (_up, upstream) = losing_upstream().await;
    let dir = idem_testkit::TempDir::new("real-clients");
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway]\nupstream = \"http://{upstream}\"\n\n[[gateway.routes]]\nmethod = \"POST\"\n\
             path = \"/v1/payments\"\noperation = \"payments.create\"\nkey = \"required\"\n\
             on_unknown = \"verify\"\nverify = \"GET /v1/payments?reference={{/reference}}\"\n\
             verify_found = \"/data/0\"\nverify_status = 201\nlanding = \"5s\"\n"
        ),
    )
    .unwrap();
    let gw = Server::start(&db.url(), &["--config", &config.display().to_string()]).await;
    let results = one_effect_per_intent(gw.addr, upstream, "verify").await;
    for (client, reference, status) in &results {
        assert!(
            status.is_some_and(|s| (200..300).contains(&s)),
            "{client} {reference}: found and answered, got {status:?}"
        );
    }
    println!(
        "real clients, verify route: clients=requests+urllib3,stripe-python,idem-client \
         intents={} effects_per_intent=1 final=2xx (found by the lookup)",
        results.len()
    );
}

on_both! {
    real_clients_through_a_default_gateway_make_one_effect_per_intent;
    real_clients_through_a_verify_route_get_the_payment;
}
