//! `idem bench`, webhook part: accepted deliveries per second — verify,
//! persist the receipt with its inbox record, answer 202 — against a route
//! that only verifies, over the same HTTP path in the same run.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use hmac::{Hmac, Mac};
use idem_core::webhooks::WebhookStore;
use idem_webhooks::{Receiver, Verifier};

use super::measure::{Op, Stats, measure};

const SECRET: &str = "bench-webhook-secret";

fn signature(body: &[u8]) -> anyhow::Result<String> {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes())?;
    mac.update(body);
    let tag: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(format!("sha256={tag}"))
}

async fn deliver(client: super::load::Client, url: String, delivery: String) -> anyhow::Result<()> {
    use http_body_util::BodyExt;
    let body = format!(r#"{{"delivery":"{delivery}","action":"opened"}}"#);
    let req = axum::http::Request::post(url)
        .header("content-type", "application/json")
        .header("x-hub-signature-256", signature(body.as_bytes())?)
        .header("x-github-delivery", delivery)
        .header("x-github-event", "pull_request")
        .body(http_body_util::Full::new(Bytes::from(body)))?;
    let res = client.request(req).await?;
    let status = res.status();
    res.into_body().collect().await?;
    anyhow::ensure!(status == StatusCode::ACCEPTED, "answered {status}");
    Ok(())
}

fn row(backend: &str, path: &str, c: usize, s: &Stats, base: &Stats) {
    println!(
        "| {backend} | {path} | {c} | {:.0} | {:.2} ms | {:.2} ms | {:.2} |",
        s.ops_per_sec,
        s.p50.as_secs_f64() * 1e3,
        s.p99.as_secs_f64() * 1e3,
        s.ops_per_sec / base.ops_per_sec.max(f64::MIN_POSITIVE)
    );
}

/// Prints the header of the webhook table.
pub fn header() {
    println!("| backend | path | concurrency | deliveries/s | p50 | p99 | ratio to verify-only |");
    println!("|---|---|---:|---:|---:|---:|---:|");
}

/// Measures both routes on `store` at concurrency 1, 8 and 32.
pub async fn run<S: WebhookStore>(
    backend: &str,
    store: S,
    duration: Duration,
    run_id: u64,
) -> anyhow::Result<()> {
    let config: idem_webhooks::EndpointConfig = toml::from_str(&format!(
        r#"
        scheme = "github"
        secrets = ["{SECRET}"]
        forward_to = "http://127.0.0.1:9/unused"
        "#
    ))?;
    let endpoint = idem_webhooks::Endpoint::from_config("bench", config)?;
    let verifier = Arc::new(endpoint.verifier.clone());
    let receiver = Arc::new(Receiver::new(store, vec![endpoint]));
    async fn verify_only(
        State(v): State<Arc<Verifier>>,
        headers: HeaderMap,
        body: Bytes,
    ) -> StatusCode {
        let now = idem_core::Clock::now_ms(&idem_core::SystemClock) / 1000;
        match v.verify(&headers, &body, now) {
            Ok(_) => StatusCode::ACCEPTED,
            Err(_) => StatusCode::UNAUTHORIZED,
        }
    }
    let app = idem_webhooks::route::router(receiver).merge(
        Router::new()
            .route("/verify-only", post(verify_only))
            .with_state(verifier),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = super::load::client();
    let op = |path: &'static str, tag: &'static str| -> Op {
        let client = client.clone();
        Arc::new(move |n| {
            let (client, url) = (client.clone(), format!("http://{addr}{path}"));
            Box::pin(deliver(client, url, format!("{tag}-{run_id}-{n}")))
        })
    };
    let (base_op, real_op) = (op("/verify-only", "v"), op("/webhooks/bench", "w"));
    for c in [1, 8, 32] {
        let base = measure(base_op.clone(), c, duration).await?;
        row(backend, "verify only", c, &base, &base);
        let real = measure(real_op.clone(), c, duration).await?;
        row(backend, "verify + persist + 202", c, &real, &base);
    }
    Ok(())
}
