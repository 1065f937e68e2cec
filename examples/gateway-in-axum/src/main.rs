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
use idemkit::gateway::{Gateway, GatewayConfig, HttpBase, RouteSpec};
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

    let config = gateway_config(&upstream)?;
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

// ANCHOR: config
/// The gateway's settings, built in code: what `idem serve --upstream` and a
/// `[gateway]` table in its `--config` file give the server.
fn gateway_config(upstream: &str) -> Result<GatewayConfig, Box<dyn std::error::Error>> {
    // The default routes: every POST and PATCH keyed (the key optional),
    // one tenant; request bodies passed through up to 1 MiB.
    let mut config = GatewayConfig::new(HttpBase::parse("UPSTREAM", upstream)?, 1 << 20);
    config.timeout = Duration::from_secs(30); // one forward, answer read
    // A route of your own, before the defaults (the first match wins): the
    // same keys as a `[[gateway.routes]]` table, every one but method, path
    // and operation optional.
    let payments = RouteSpec {
        method: "POST".into(),
        path: "/v1/payments".into(),
        operation: "payments.create".into(),
        key: Some("required".into()),      // no key: 400
        ttl: Some("24h".into()),           // how long the answer is replayed
        on_unknown: Some("reject".into()), // a lost answer: held, never forwarded again
        ..RouteSpec::default()
    };
    config.routes.insert(0, payments.route()?);
    config.validate()?; // bounds, and each route against the timeout
    Ok(config)
}
// ANCHOR_END: config

#[cfg(test)]
mod tests {
    use axum::http::Method;

    #[test]
    fn the_named_route_comes_first_and_needs_a_key() -> Result<(), Box<dyn std::error::Error>> {
        let config = super::gateway_config("http://127.0.0.1:9000")?;
        let first = config
            .routes
            .iter()
            .find(|r| r.matches(&Method::POST, "/v1/payments"))
            .ok_or("no route covers POST /v1/payments")?;
        assert_eq!(first.config.operation.as_str(), "payments.create");
        assert!(first.config.key_required);
        // Any other POST still goes through the default route, key optional.
        let other = config
            .routes
            .iter()
            .find(|r| r.matches(&Method::POST, "/payments"))
            .ok_or("no route covers POST /payments")?;
        assert!(!other.config.key_required);
        Ok(())
    }
}
