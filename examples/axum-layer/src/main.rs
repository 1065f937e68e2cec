//! An axum service behind idemkit's `IdempotencyLayer`, on one SQLite file.
//!
//! `IDEM_DB` (default `./orders.db`) is the database, `IDEM_LISTEN`
//! (default `127.0.0.1:3000`) the address. `POST /orders` with
//! `Authorization: Bearer key-acme` and an `Idempotency-Key` header.
//!
//! Run it: `cargo run -p example-axum-layer` prints
//! `listening on 127.0.0.1:3000` (Ctrl-C stops it). From another shell,
//! `curl -i -w '\n' -X POST localhost:3000/orders -H 'Authorization: Bearer key-acme' -H 'Idempotency-Key: o-1' -d shirt`
//! answers `201` with `order <n>`; the same command again replays it
//! (`Idempotent-Replayed: true`), no second order.

use std::time::Duration;

use axum::{
    Extension, Router,
    body::Bytes,
    extract::Request,
    http::{StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::post,
};
use idemkit::http::{IdemTx, IdempotencyLayer, RouteConfig, TenantSource, problem};
use idemkit::sqlite::{SqliteConfig, SqliteStore, SqliteTx};
use idemkit::{Collector, CollectorConfig, Operation, Tenant};

/// The handler: its row is written in the transaction that holds the key,
/// so the row and the stored answer commit together or not at all.
async fn create_order(Extension(tx): Extension<IdemTx<SqliteTx>>, body: Bytes) -> Response {
    // Bad input is a problem document like the layer's own refusals (the
    // `String` extractor would answer text/plain).
    let Ok(body) = std::str::from_utf8(&body) else {
        return problem(
            StatusCode::BAD_REQUEST,
            "invalid-request",
            "The order must be UTF-8 text",
            None,
            None,
        );
    };
    let Ok(mut tx) = tx.lock().await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let inserted = sqlx::query("INSERT INTO orders (item) VALUES (?)")
        .bind(body)
        .execute(&mut **tx)
        .await;
    match inserted {
        Ok(done) => (
            StatusCode::CREATED,
            format!("order {}", done.last_insert_rowid()),
        )
            .into_response(),
        Err(e) => {
            // Say why: a 5xx rolls back the key too, so a retry runs again.
            eprintln!("insert failed: {e}");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// Authentication: an API key names the tenant. No key, no tenant: the
/// layer answers 401 `tenant-unresolved`.
async fn auth(mut req: Request, next: Next) -> Response {
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let tenant = match bearer {
        Some("Bearer key-acme") => Tenant::new("acme").ok(),
        _ => None,
    };
    if let Some(tenant) = tenant {
        req.extensions_mut().insert(tenant);
    }
    next.run(req).await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The layer logs store failures through `tracing`: print them.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let db = std::env::var("IDEM_DB").unwrap_or_else(|_| "orders.db".into());
    let listen = std::env::var("IDEM_LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".into());

    let store =
        SqliteStore::connect(&format!("sqlite://{db}?mode=rwc"), SqliteConfig::default()).await?;
    // Create idem's tables, then yours.
    store.migrate().await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)")
        .execute(store.pool())
        .await?;

    // Expired keys are purged by the Collector; without it the table grows.
    let collector = Collector::new(store.clone(), CollectorConfig::default())?;
    tokio::spawn(async move {
        collector
            .run(Duration::from_secs(60), std::future::pending())
            .await;
    });

    let config = RouteConfig::required(Operation::new("orders.create")?, TenantSource::Extension);
    let app = Router::new()
        .route(
            "/orders",
            post(create_order).layer(IdempotencyLayer::new(store, config)),
        )
        // Outermost: authentication runs before the idempotency layer.
        .layer(middleware::from_fn(auth));

    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
