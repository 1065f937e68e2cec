//! An axum app with idemkit's embedded webhook receiver on a route, on one
//! SQLite file: `POST /webhooks/payments` takes Standard Webhooks (Svix)
//! deliveries, a `Processor` applies each one once, and `GET /payments`
//! shows the effect.
//!
//! `IDEM_DB` (default `./example-webhooks.db`) is the database, `IDEM_LISTEN`
//! (default `127.0.0.1:3000`) the address, `WEBHOOK_SECRET` the endpoint's
//! `whsec_…` secret (required).
//!
//! ## Run it
//!
//! It prints `listening on 127.0.0.1:3000`; Ctrl-C stops it. A test
//! delivery is signed the Standard Webhooks way: HMAC-SHA256, keyed with the
//! secret's base64 part decoded, over `{webhook-id}.{webhook-timestamp}.{body}`,
//! sent base64-encoded as `webhook-signature: v1,…` (the timestamp must be
//! within 5 minutes of now):
//!
//! ```text
//! export WEBHOOK_SECRET=whsec_$(openssl rand -base64 24)
//! cargo run -p example-webhook-route
//! # in another shell, with the same WEBHOOK_SECRET:
//! ID=msg_1 TS=$(date +%s) BODY='{"type":"payment.succeeded","data":{"id":"pay_1","amount":4200}}'
//! SIG=$(python3 -c 'import base64,hashlib,hmac,sys; s,m=sys.argv[1:]; k=base64.b64decode(s.removeprefix("whsec_")); print(base64.b64encode(hmac.new(k,m.encode(),hashlib.sha256).digest()).decode())' "$WEBHOOK_SECRET" "$ID.$TS.$BODY")
//! curl -si -w '\n' localhost:3000/webhooks/payments -H 'Content-Type: application/json' \
//!   -H "webhook-id: $ID" -H "webhook-timestamp: $TS" -H "webhook-signature: v1,$SIG" --data-raw "$BODY"
//! # 202 "accepted"; the same command again: 200 "duplicate"
//! curl -s -w '\n' localhost:3000/payments   # payments 1, handler runs 1
//! ```
//!
//! `tests/run.rs` does the same with the Standard Webhooks library itself.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::{Router, extract::State, routing::get};
use idemkit::BoxFuture;
use idemkit::sqlite::{SqliteConfig, SqliteStore};
use idemkit::webhooks::{
    Endpoint, EndpointConfig, HandlerError, Processor, ProcessorConfig, Receipt, Receiver, Scheme,
    Secret, WebhookHandler, route,
};

/// Applies a payment delivery: one row in the app's own table. The processor
/// runs a handler at least once per receipt, so the row is keyed on the
/// delivery id and a rerun after a crash inserts nothing.
struct RecordPayment {
    store: SqliteStore,
    runs: Arc<AtomicU64>,
}

impl WebhookHandler for RecordPayment {
    fn handle<'a>(&'a self, receipt: &'a Receipt) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            self.runs.fetch_add(1, Ordering::Relaxed);
            let body = String::from_utf8_lossy(&receipt.receipt.body);
            sqlx::query(
                "INSERT INTO payments (delivery_id, body) VALUES (?, ?) \
                 ON CONFLICT (delivery_id) DO NOTHING",
            )
            .bind(&receipt.receipt.delivery_id)
            .bind(body.as_ref())
            .execute(self.store.pool())
            .await
            // A database hiccup: the processor retries with backoff.
            .map_err(|e| HandlerError::Retry(e.to_string()))?;
            Ok(())
        })
    }
}

/// What the app shows: its payments and how often the handler ran.
#[derive(Clone)]
struct Shown {
    store: SqliteStore,
    runs: Arc<AtomicU64>,
}

async fn payments(State(shown): State<Shown>) -> String {
    let rows = sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM payments")
        .fetch_one(shown.store.pool())
        .await
        .map_or_else(|e| format!("unreadable ({e})"), |n| n.to_string());
    let runs = shown.runs.load(Ordering::Relaxed);
    format!("payments {rows}, handler runs {runs}")
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let db = std::env::var("IDEM_DB").unwrap_or_else(|_| "example-webhooks.db".into());
    let listen = std::env::var("IDEM_LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let secret = std::env::var("WEBHOOK_SECRET").map_err(|_| "set WEBHOOK_SECRET=whsec_…")?;

    let store =
        SqliteStore::connect(&format!("sqlite://{db}?mode=rwc"), SqliteConfig::default()).await?;
    store.migrate().await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS payments \
         (id INTEGER PRIMARY KEY, delivery_id TEXT NOT NULL UNIQUE, body TEXT NOT NULL)",
    )
    .execute(store.pool())
    .await?;

    let endpoint = Endpoint::from_config(
        "payments",
        EndpointConfig {
            scheme: Scheme::Standard,
            secrets: vec![Secret::new(secret)],
            secrets_env: None,
            forward_to: None,
            forward_timeout_secs: None,
            tolerance_secs: None,
            max_body_bytes: None,
            retention_hours: None,
            entity_id: None,
            entity_version: None,
        },
    )?;

    // Receiving: verify, dedupe on the delivery id, persist, answer 202.
    let receiver = Arc::new(Receiver::new(store.clone(), vec![endpoint]));
    // Processing: claim stored receipts and run the handler, in the background.
    let runs = Arc::new(AtomicU64::new(0));
    let processor = Processor::new(
        store.clone(),
        ProcessorConfig {
            poll_interval: Duration::from_millis(50),
            ..ProcessorConfig::default()
        },
    )?
    .handler(
        "payments",
        RecordPayment {
            store: store.clone(),
            runs: runs.clone(),
        },
    );
    tokio::spawn(async move {
        processor
            .run(Duration::from_secs(3600), std::future::pending())
            .await;
    });

    let app = Router::new()
        .route("/payments", get(payments))
        .with_state(Shown { store, runs })
        // `POST /webhooks/{endpoint}` next to the app's own routes.
        .merge(route::router(receiver));

    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
