//! A consumer (or relay) process for the drills (`tests/it/drill.rs`):
//! consumes a topic through the inbox into a `ledger` table, its positions
//! in the same database, until it is killed (`kill -9`, or a failpoint such
//! as `IDEM_FAILPOINTS=consume.after_commit=7`). With
//! `IDEM_DRILL_ROLE=relay` it relays the database's outbox to Kafka instead
//! (a 2 s lease, batches of 4; `relay.after_publish` aborts it between the
//! delivery reports and marking the messages sent).
//!
//! Environment: `IDEM_KAFKA_URL`, `IDEM_DRILL_DB` (`sqlite://…` or
//! `postgres://…`, migrated, with the ledger table), `IDEM_DRILL_TOPIC`,
//! `IDEM_DRILL_GROUP`, `IDEM_DRILL_DEAD`, `IDEM_DRILL_ROLE`.

use std::time::Duration;

use idem_core::Backoff;
use idem_core::inbox::Subscriber;
use idem_inbox::{Consumer, ConsumerConfig, Inbox};
use idem_kafka::{KafkaSource, SourceConfig};
use idem_sql::{Dialect, SqlStore};

#[path = "../tests/it/ledger.rs"]
mod ledger;
use ledger::Ledger;

fn env(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} is not set"))
}

async fn relay<D: Dialect>(store: SqlStore<D>) -> Result<(), Box<dyn std::error::Error>> {
    let kafka = idem_kafka::connect(&env("IDEM_KAFKA_URL")?)?;
    let config = idem_outbox::DispatcherConfig {
        batch_size: 4,
        lease: Duration::from_secs(2),
        poll_interval: Duration::from_millis(100),
        ..Default::default()
    };
    let relay =
        idem_outbox::Dispatcher::new(store, idem_kafka::KafkaPublisher::new(&kafka)?, config)?;
    eprintln!("drill relay: running");
    relay
        .run(idem_outbox::Polling, std::future::pending())
        .await;
    Ok(())
}

async fn run<D: Dialect>(store: SqlStore<D>) -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var("IDEM_DRILL_ROLE").is_ok_and(|r| r == "relay") {
        return relay(store).await;
    }
    let kafka = idem_kafka::connect(&env("IDEM_KAFKA_URL")?)?;
    let mut config = SourceConfig::new(
        &env("IDEM_DRILL_GROUP")?,
        &env("IDEM_DRILL_TOPIC")?,
        &env("IDEM_DRILL_DEAD")?,
    );
    config.session_timeout = Duration::from_secs(6);
    let source = KafkaSource::new(&kafka, store.clone(), config).await?;
    let mut consumer = Consumer::new(
        source,
        Inbox::new(store),
        Subscriber::new("ledger")?,
        Ledger::<D>::default(),
        ConsumerConfig {
            batch_size: 8,
            fetch_wait: Duration::from_millis(200),
            max_deliver: 5,
            nak_backoff: Backoff {
                initial: Duration::from_millis(50),
                max: Duration::from_millis(500),
            },
            handler_timeout: Duration::from_secs(5),
        },
    )?;
    eprintln!("drill consumer: running");
    consumer
        .run(Duration::from_secs(3600), std::future::pending())
        .await;
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = env("IDEM_DRILL_DB")?;
    if db.starts_with("sqlite:") {
        run(idem_sqlite::SqliteStore::connect(&db, Default::default()).await?).await
    } else {
        run(idem_postgres::PgStore::connect(&db, Default::default()).await?).await
    }
}
