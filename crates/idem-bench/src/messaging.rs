//! `idem bench --nats-url`: relay throughput (outbox to acknowledged JetStream
//! publish) against publishing the same messages directly, and inbox consume
//! throughput against consuming without dedupe, both in the same run.

use std::marker::PhantomData;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use idem_core::inbox::{InboxStore, Subscriber};
use idem_core::outbox::{MessageId, OutboxMessage, OutboxRecord, OutboxStore, Topic};
use idem_core::{BoxFuture, StoreError};
use idem_inbox::{
    Consumer, ConsumerConfig, Delivery, Handler, HandlerError, Inbox, InboxMessage, MessageSource,
};
use idem_nats::{Context, NatsPublisher, NatsSource, SourceConfig};
use idem_outbox::{Dispatcher, DispatcherConfig, Publisher};
use idem_sql::Dialect;
use idem_sql::dialect::{On, Stmt};

/// A backend's `enqueue`.
pub type Enqueue<T> =
    for<'t> fn(&'t mut T, &'t OutboxMessage, i64) -> BoxFuture<'t, Result<i64, StoreError>>;

/// Messages per measured case.
const BATCH: usize = 100;

/// Writes one `bench_ledger` row per message, on any backend's transaction.
pub struct LedgerHandler<D>(PhantomData<fn() -> D>);

impl<D> LedgerHandler<D> {
    /// The handler for backend `D`.
    pub fn new() -> Self {
        Self(PhantomData)
    }
}

impl<D> Default for LedgerHandler<D> {
    fn default() -> Self {
        Self::new()
    }
}

impl<D: Dialect> Handler<D::Tx> for LedgerHandler<D> {
    fn handle<'a>(
        &'a self,
        tx: &'a mut D::Tx,
        m: &'a InboxMessage,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(async move {
            let s = Stmt::new("INSERT INTO bench_ledger (message_id) VALUES ($1)")
                .bind(m.message_id.as_str());
            D::execute(On::Conn(&mut **tx), s)
                .await
                .map(drop)
                .map_err(|e| HandlerError::Retry(e.into()))
        })
    }
}

fn row(backend: &str, stage: &str, n: usize, took: Duration, baseline: Option<f64>) -> f64 {
    let rate = n as f64 / took.as_secs_f64().max(f64::MIN_POSITIVE);
    let ratio = baseline.map_or(1.0, |b| rate / b);
    println!(
        "| {backend} | {stage} | {n} | {:.2} s | {rate:.0} | {ratio:.2} |",
        took.as_secs_f64()
    );
    rate
}

/// Prints the header of the messaging table.
pub fn header() {
    println!("| backend | stage | messages | time | msgs/s | ratio to baseline |");
    println!("|---|---|---:|---:|---:|---:|");
}

/// Runs the four cases on one backend.
pub async fn run<S, H>(
    backend: &str,
    store: S,
    enqueue: Enqueue<S::Tx>,
    handler: H,
    js: &Context,
    n: usize,
    run_id: u64,
) -> anyhow::Result<()>
where
    S: OutboxStore + InboxStore,
    H: Handler<S::Tx>,
{
    let prefix = format!("bench{run_id}{backend}");
    let stream = format!("BENCH_{run_id}_{backend}");
    idem_nats::ensure_stream(
        js,
        &stream,
        &[&format!("{prefix}.>")],
        Duration::from_secs(300),
    )
    .await?;
    let topic = |t: &str| Topic::new(format!("{prefix}.{t}"));

    // Baseline: the same publishes, straight to JetStream, as concurrent as
    // the dispatcher's batches.
    let direct: Vec<OutboxRecord> = (0..n)
        .map(|i| {
            Ok(OutboxRecord {
                id: i as i64,
                message_id: MessageId::generate(),
                topic: topic("direct")?,
                key: format!("k{i}"),
                payload: br#"{"amount":100}"#.to_vec(),
                headers: vec![],
                attempts: 0,
                created_at_ms: 0,
            })
        })
        .collect::<Result<_, idem_core::outbox::MessageError>>()?;
    let publisher = NatsPublisher::new(js.clone());
    let started = Instant::now();
    for chunk in direct.chunks(BATCH) {
        for r in join_all(chunk.iter().map(|r| publisher.publish(r))).await {
            r?;
        }
    }
    let base = row(
        backend,
        "baseline: publish directly",
        n,
        started.elapsed(),
        None,
    );

    // The relay: the same number of messages, written to the outbox first
    // (not timed), then published by the dispatcher.
    let mut tx = store.begin().await?;
    let now = idem_core::Clock::now_ms(&idem_core::SystemClock);
    for i in 0..n {
        let m = OutboxMessage::new(
            topic("relay")?,
            format!("k{i}"),
            br#"{"amount":100}"#.to_vec(),
        )?;
        enqueue(&mut tx, &m, now).await?;
    }
    store.commit(tx).await?;
    let config = DispatcherConfig {
        batch_size: BATCH as u32,
        ..DispatcherConfig::default()
    };
    let dispatcher = Dispatcher::new(store.clone(), NatsPublisher::new(js.clone()), config)?;
    let started = Instant::now();
    let mut sent = 0;
    while sent < n {
        let round = dispatcher.run_once().await?;
        anyhow::ensure!(round.claimed > 0, "the outbox ran dry at {sent} of {n}");
        sent += round.sent;
    }
    row(
        backend,
        "relay: outbox to JetStream ack",
        n,
        started.elapsed(),
        Some(base),
    );

    // Consuming the relayed messages: without dedupe, then through the inbox.
    let source = |durable: &str| {
        NatsSource::new(
            js.clone(),
            SourceConfig {
                stream: stream.clone(),
                durable: durable.into(),
                filter_subject: format!("{prefix}.relay"),
                ack_wait: Duration::from_secs(30),
                dead_letter_subject: format!("{prefix}.dead"),
            },
        )
    };
    let mut plain = source("plain").await?;
    let started = Instant::now();
    let mut done = 0;
    while done < n {
        for d in plain.fetch(BATCH, Duration::from_secs(1)).await? {
            let m = d.message().map_err(anyhow::Error::msg)?;
            let mut tx = store.begin().await?;
            handler.handle(&mut tx, &m).await?;
            store.commit(tx).await?;
            d.ack().await?;
            done += 1;
        }
    }
    let base = row(
        backend,
        "baseline: consume without dedupe",
        n,
        started.elapsed(),
        None,
    );
    let mut consumer = Consumer::new(
        source("inbox").await?,
        Inbox::new(store.clone()),
        Subscriber::new("bench")?,
        handler,
        ConsumerConfig {
            batch_size: BATCH as u32,
            ..ConsumerConfig::default()
        },
    )?;
    let started = Instant::now();
    while (consumer
        .stats()
        .applied
        .load(std::sync::atomic::Ordering::Relaxed) as usize)
        < n
    {
        consumer.run_once().await?;
    }
    row(
        backend,
        "consume through the inbox",
        n,
        started.elapsed(),
        Some(base),
    );
    let _ = js.delete_stream(&stream).await;
    Ok(())
}
