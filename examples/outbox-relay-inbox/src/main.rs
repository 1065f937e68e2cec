//! Outbox → relay → inbox, on NATS JetStream, with a SQLite file per service.
//!
//! The *orders* service writes each order and its `orders.placed` message in
//! one transaction (`outbox-orders.db`); a `Dispatcher` relays what committed to
//! JetStream. The *shipping* service consumes the subject through an `Inbox`
//! (`shipping.db`): each message's shipment row is written in the same
//! transaction as its inbox record, so a message delivered twice ships once.
//!
//! `NATS_URL` (default `nats://127.0.0.1:4222`, JetStream on), `IDEM_DIR`
//! (default `.`) holds the two databases, `SUBJECTS` (default `shop`) is the
//! stream's name and subject prefix, `ORDERS` (default 3) how many orders are
//! placed. Prints `enqueued <order> <message id>` per order, then
//! `applied <n>, duplicates <n>` whenever the consumer's counts change.
//!
//! Run it: no HTTP port; it needs a NATS server with JetStream, and runs
//! until Ctrl-C.
//!
//! ```text
//! nats-server -js -a 127.0.0.1 -p 4222 -sd /tmp/example-nats &
//! cargo run -p example-outbox-relay-inbox   # enqueued order-1 …, …, then applied 3, duplicates 0
//! ```

use std::path::Path;
use std::time::Duration;

use idemkit::inbox::{
    Consumer, ConsumerConfig, Handler, HandlerError, Inbox, InboxMessage, Subscriber,
};
use idemkit::nats::{NatsPublisher, NatsSource, SourceConfig};
use idemkit::outbox::{Dispatcher, DispatcherConfig, Outbox, OutboxMessage, Topic};
use idemkit::sqlite::{SqliteConfig, SqliteStore, SqliteTx};
use idemkit::{BoxFuture, KeyStore, Polling};

async fn open(path: &Path) -> Result<SqliteStore, Box<dyn std::error::Error>> {
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let store = SqliteStore::connect(&url, SqliteConfig::default()).await?;
    store.migrate().await?;
    Ok(store)
}

/// The shipping service's effect: one shipment per order, written in the
/// inbox transaction. Nothing here dedupes — the inbox does.
struct Ship;

impl Handler<SqliteTx> for Ship {
    fn handle<'a>(
        &'a self,
        tx: &'a mut SqliteTx,
        message: &'a InboxMessage,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let order: i64 = std::str::from_utf8(&message.payload)
                .ok()
                .and_then(|s| s.parse().ok())
                // A message that can never apply is dead-lettered.
                .ok_or_else(|| HandlerError::Reject("the payload is not an order id".into()))?;
            sqlx::query("INSERT INTO shipments (order_id) VALUES (?)")
                .bind(order)
                .execute(&mut **tx)
                .await
                .map_err(|e| HandlerError::Retry(e.into()))?;
            Ok(())
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let nats_url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let dir = std::env::var("IDEM_DIR").unwrap_or_else(|_| ".".into());
    let prefix = std::env::var("SUBJECTS").unwrap_or_else(|_| "shop".into());
    let count: i64 = match std::env::var("ORDERS") {
        Ok(n) => n.parse().map_err(|_| "ORDERS: a number")?,
        Err(_) => 3,
    };
    let placed = format!("{prefix}.orders.placed");

    // The orders service: the order row and its message commit together.
    let orders = open(&Path::new(&dir).join("outbox-orders.db")).await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)")
        .execute(orders.pool())
        .await?;
    let outbox = Outbox::new(orders.clone());
    for n in 1..=count {
        let mut tx = orders.begin().await?;
        let id = sqlx::query("INSERT INTO orders (item) VALUES (?)")
            .bind(format!("item {n}"))
            .execute(&mut *tx)
            .await?
            .last_insert_rowid();
        let message = OutboxMessage::new(
            Topic::new(placed.clone())?,
            format!("order-{id}"),
            id.to_string().into_bytes(),
        )?;
        outbox.enqueue(&mut tx, &message).await?;
        orders.commit(tx).await?;
        println!("enqueued order-{id} {}", message.message_id.as_str());
    }

    // The relay: what committed goes to JetStream, each message under its id
    // (the stream drops a republished copy inside its duplicate window).
    let js = idemkit::nats::connect(&nats_url, "example-outbox-relay-inbox", true).await?;
    idemkit::nats::ensure_stream(
        &js,
        &prefix,
        &[&format!("{prefix}.>")],
        Duration::from_secs(300),
    )
    .await?;
    let relay = Dispatcher::new(
        orders,
        NatsPublisher::new(js.clone()),
        DispatcherConfig {
            poll_interval: Duration::from_millis(50),
            ..DispatcherConfig::default()
        },
    )?;
    tokio::spawn(async move { relay.run(Polling, std::future::pending()).await });

    // The shipping service: a durable consumer, applied through its inbox.
    let shipping = open(&Path::new(&dir).join("shipping.db")).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS shipments (id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL)",
    )
    .execute(shipping.pool())
    .await?;
    let source = NatsSource::new(
        js,
        SourceConfig {
            stream: prefix.clone(),
            durable: "shipping".into(),
            filter_subject: placed,
            ack_wait: Duration::from_secs(30),
            dead_letter_subject: format!("{prefix}.dead.shipping"),
        },
    )
    .await?;
    let mut consumer = Consumer::new(
        source,
        Inbox::new(shipping),
        Subscriber::new("shipping")?,
        Ship,
        ConsumerConfig {
            fetch_wait: Duration::from_millis(200),
            ..ConsumerConfig::default()
        },
    )?;
    // `consumer.run(gc_every, shutdown)` is the loop to use; this one also
    // prints the counts as they change.
    let mut shown = None;
    loop {
        if let Err(e) = consumer.run_once().await {
            eprintln!("fetch failed: {e}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let stats = consumer.stats();
        let now = (
            stats.applied.load(std::sync::atomic::Ordering::Relaxed),
            stats.duplicates.load(std::sync::atomic::Ordering::Relaxed),
        );
        if shown != Some(now) {
            println!("applied {}, duplicates {}", now.0, now.1);
            shown = Some(now);
        }
    }
}
