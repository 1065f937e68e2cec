//! idemkit's gateway mounted in an axum app, in front of an HTTP API that
//! knows nothing of idempotency keys: the app serves its own routes
//! (`GET /health`) and every other request goes through the gateway to the
//! upstream. A POST retried with the same `Idempotency-Key` reaches the
//! upstream once; the retry gets the stored answer.
//!
//! `UPSTREAM` (required, `http://host:port`) is the API, `IDEM_DB` (default
//! `./example-gateway.db`) the database, `IDEM_LISTEN` (default `127.0.0.1:3000`)
//! the address.
//!
//! Run it, with `idem upstream` (an in-memory payments API without
//! idempotency) as the upstream; it prints `listening on 127.0.0.1:3000`
//! and Ctrl-C stops it:
//!
//! ```text
//! idem upstream --listen 127.0.0.1:9000 &
//! UPSTREAM=http://127.0.0.1:9000 cargo run -p example-gateway-in-axum
//! # in another shell: twice, the second is the stored answer (Idempotent-Replayed: true)
//! curl -si -w '\n' -X POST localhost:3000/v1/payments -H 'Idempotency-Key: k-1' \
//!   -H 'Content-Type: application/json' -d '{"amount":100,"currency":"EUR","reference":"order-1"}'
//! curl -s -w '\n' 'localhost:3000/v1/payments?reference=order-1'   # one payment upstream
//! ```

use std::time::Duration;

use axum::{Router, routing::get};
use idemkit::gateway::{Gateway, GatewayConfig, HttpBase};
use idemkit::sqlite::{SqliteConfig, SqliteStore};
use idemkit::steps::Namespace;
use idemkit::{Collector, CollectorConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let upstream = std::env::var("UPSTREAM").map_err(|_| "set UPSTREAM=http://host:port")?;
    let db = std::env::var("IDEM_DB").unwrap_or_else(|_| "example-gateway.db".into());
    let listen = std::env::var("IDEM_LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".into());

    let store =
        SqliteStore::connect(&format!("sqlite://{db}?mode=rwc"), SqliteConfig::default()).await?;
    store.migrate().await?;
    // Expired keys are purged by the Collector; without it the table grows.
    let collector = Collector::new(store.clone(), CollectorConfig::default())?;
    tokio::spawn(async move {
        collector
            .run(Duration::from_secs(60), std::future::pending())
            .await;
    });

    // The default routes: every POST and PATCH keyed (the key optional),
    // one tenant. Build `config.routes` from `RouteSpec`s to name your own.
    let config = GatewayConfig::new(HttpBase::parse("UPSTREAM", &upstream)?, 1 << 20);
    config.validate()?;
    // Upstream keys are derived in this namespace: keep it fixed per
    // installation, so a retry after a restart sends the same key.
    let gateway = Gateway::new(store, Namespace::new("example-gateway")?, config);

    let app = Router::new()
        .route("/health", get(|| async { "ok" }))
        // Everything the app does not serve itself goes through the gateway.
        .fallback_service(gateway.into_router());

    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
