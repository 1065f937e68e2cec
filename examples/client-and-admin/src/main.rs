//! A SQLite-only app on idemkit's features `sqlite`, `http`, `admin` and
//! `client`: an axum route behind the `Idempotency-Key` contract and the
//! admin router (`/admin/v1`, `/console`) in one app, then idemkit's
//! client sending one order twice with the same key. No broker is built
//! (`cargo tree -p example-client-and-admin -e normal | grep -c async-nats`
//! says 0).
//!
//! `IDEM_ADMIN_TOKEN` (required, 24+ characters, hard to guess) is the
//! admin token. It serves on a free port of 127.0.0.1, sends, prints what
//! happened and exits:
//!
//! ```text
//! IDEM_ADMIN_TOKEN=$(openssl rand -hex 32) cargo run -p example-client-and-admin
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use idemkit::admin::v1::outcomes::{OutcomeRing, track};
use idemkit::admin::{AdminConfig, AdminToken};
use idemkit::client::{Client, ClientError, Method, RetryPolicy};
use idemkit::http::{IdempotencyLayer, RouteConfig, TenantSource};
use idemkit::sqlite::{SqliteConfig, SqliteStore};
use idemkit::{Operation, Tenant};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let token = std::env::var("IDEM_ADMIN_TOKEN").map_err(|_| "set IDEM_ADMIN_TOKEN")?;
    let admin_token = AdminToken::new(&token)?;
    let dir = std::env::temp_dir().join(format!("example-client-and-admin-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let url = format!("sqlite://{}?mode=rwc", dir.join("app.db").display());
    let store = SqliteStore::connect(&url, SqliteConfig::default()).await?;
    store.migrate().await?;

    // The app: one keyed route (it counts the orders it really makes) and
    // the admin router beside it, over the same store.
    let made = Arc::new(AtomicU32::new(0));
    let counter = made.clone();
    let tenant = TenantSource::Static(Tenant::new("acme")?);
    let keyed = RouteConfig::required(Operation::new("orders.create")?, tenant);
    let create =
        post(
            move || async move { format!("order {}", counter.fetch_add(1, Ordering::SeqCst) + 1) },
        );
    let app = Router::new()
        .route(
            "/orders",
            create.layer(IdempotencyLayer::new(store.clone(), keyed)),
        )
        .merge(idemkit::admin::router(
            store,
            AdminConfig::new(Some(admin_token)),
        ))
        // The admin overview's request counts: every answer, through the ring.
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(OutcomeRing::default()),
            track,
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });

    send_order(&base).await?;

    // The admin API lists the key the order was made under.
    let admin = Client::new(&base)?;
    let keys = admin
        .request(Method::GET, "/admin/v1/keys")
        .header("authorization", format!("Bearer {token}"))
        .send()
        .await?;
    let listed: serde_json::Value = keys.json()?;
    let items = listed["items"].as_array().map_or(0, Vec::len);
    println!("admin: {} {items} key(s)", keys.status.as_u16());
    let overview = admin
        .request(Method::GET, "/admin/v1/overview")
        .header("authorization", format!("Bearer {token}"))
        .send()
        .await?;
    let overview: serde_json::Value = overview.json()?;
    println!("overview: {}", overview["requests"]["outcomes"]);
    println!("orders made: {}", made.load(Ordering::SeqCst));
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

// ANCHOR: client
/// One intent, sent twice: the second send carries the same key and gets
/// the stored answer, not a second order.
async fn send_order(base: &str) -> Result<(), ClientError> {
    let mut policy = RetryPolicy::default(); // 5 attempts, 100 ms → 5 s, 10 s/attempt, 30 s total
    policy.deadline = Duration::from_secs(10);
    let client = Client::builder().retry_policy(policy).build(base)?;

    // One intent = one RequestBuilder = one key (a v4 UUID, or your own:
    // 1–255 visible ASCII).
    let order = client
        .post("/orders")
        .key("order-42")
        .json(&serde_json::json!({ "sku": "book", "qty": 1 }));
    for _ in 0..2 {
        match order.send().await {
            // answer.replayed: the server had already done it (Idempotent-Replayed: true);
            // also answer.attempts, answer.key, answer.headers
            Ok(answer) if answer.status.is_success() => println!(
                "{} {} replayed={}",
                answer.status.as_u16(),
                String::from_utf8_lossy(&answer.body),
                answer.replayed
            ),
            // A final 4xx (or 3xx): the server's verdict, never retried.
            Ok(answer) => println!("refused: {}", answer.status),
            // Deadline or attempts used up: it may have happened. Keep
            // e.key() and send the same intent again later to get its outcome.
            Err(e) if e.retryable() => println!("unknown, key {:?}: {e}", e.key()),
            // Invalid input (e.nothing_sent()), or a body over the limit.
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
// ANCHOR_END: client
