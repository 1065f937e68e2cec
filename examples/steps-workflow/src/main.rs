//! A durable workflow with a compensation, on one SQLite file: placing an
//! order reserves stock (a local phase, with `release` as its undo), then
//! charges the card at a payment provider (an external call). When the
//! charge fails for good, the run compensates — the reservation is released,
//! once — and the failure is the key's stored answer, replayed to retries.
//!
//! `IDEM_DB` (default `./steps.db`) is the database, `IDEM_KEY` (default
//! `order-1`) the request's idempotency key, `CARD` (default `ok`; `declined`
//! makes the provider refuse) its input. Prints the answer (`answer …`, or
//! `replayed …` for a key used before), then
//! `book: <n> of 10 available; reservations made <n>, released <n> (all runs so far)`:
//! the stock left, and how many reservations and releases every run on this
//! database has made in total.
//!
//! Run it: no server, no port; each run places one order and exits.
//!
//! ```text
//! CARD=declined cargo run -p example-steps-workflow   # answer 402 …; book: 10 of 10 available; reservations made 1, released 1 …
//! CARD=declined cargo run -p example-steps-workflow   # replayed 402 …: the same counts, nothing ran again
//! IDEM_KEY=order-2 cargo run -p example-steps-workflow   # answer 201 …; book: 9 of 10 available; reservations made 2, released 1 …
//! ```
//!
//! Delete `steps.db` to start again.

use std::time::Duration;

use idemkit::sqlite::{SqliteConfig, SqliteStore, SqliteTx};
use idemkit::steps::{
    Ended, Failure, Run, Runs, Started, StepCtx, StepError, Stop, Workflow, WorkflowPolicy,
};
use idemkit::{
    BoxError, BoxFuture, Completion, FingerprintSpec, IdempotencyKey, Operation, Policy,
    RequestParts, Scope, StoredResponse, Tenant,
};

/// Reserves one book: local work, committed with the step's record.
fn reserve(tx: &mut SqliteTx) -> BoxFuture<'_, Result<String, BoxError>> {
    Box::pin(async move {
        let taken = sqlx::query(
            "UPDATE stock SET available = available - 1 WHERE sku = 'book' AND available > 0",
        )
        .execute(&mut **tx)
        .await?;
        if taken.rows_affected() == 0 {
            return Err("out of stock".into());
        }
        sqlx::query("INSERT INTO stock_log (event) VALUES ('reserved')")
            .execute(&mut **tx)
            .await?;
        Ok("book".to_owned())
    })
}

/// The compensation of `reserve`: given what it reserved, puts it back. It
/// runs in a transaction committed with its own step record, so once.
fn release(tx: &mut SqliteTx, sku: String) -> BoxFuture<'_, Result<(), BoxError>> {
    Box::pin(async move {
        sqlx::query("UPDATE stock SET available = available + 1 WHERE sku = ?")
            .bind(&sku)
            .execute(&mut **tx)
            .await?;
        sqlx::query("INSERT INTO stock_log (event) VALUES ('released')")
            .execute(&mut **tx)
            .await?;
        Ok(())
    })
}

/// The payment provider (a stand-in): it would get `ctx.key` as its
/// `Idempotency-Key`, the same on every attempt.
async fn charge(card: String, ctx: StepCtx) -> Result<String, StepError> {
    match card.as_str() {
        "declined" => Err(StepError::Permanent("card declined".into())),
        _ => Ok(format!("pay_{}", ctx.key.as_str())),
    }
}

fn answer(status: u16, body: String) -> Completion {
    let response = StoredResponse {
        status,
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.into_bytes(),
    };
    if status < 400 {
        Completion::completed(response)
    } else {
        Completion::failed(response)
    }
}

/// The books in stock when the database is created.
const STOCK: i64 = 10;

struct PlaceOrder;

impl Workflow<SqliteStore> for PlaceOrder {
    fn run<'r>(&'r self, run: &'r mut Run<SqliteStore>) -> BoxFuture<'r, Result<Completion, Stop>> {
        Box::pin(async move {
            let card = String::from_utf8_lossy(run.input()).into_owned();
            let sku: String = run
                .phase("reserve", reserve)
                .undo("release", release)
                .await?;
            // A permanent failure here fails the run: `release` runs first,
            // then `failed` gives the answer.
            let payment: String = run.call("charge", |ctx| charge(card.clone(), ctx)).await?;
            Ok(answer(
                201,
                format!(r#"{{"sku":"{sku}","payment":"{payment}"}}"#),
            ))
        })
    }

    fn failed<'r>(
        &'r self,
        _run: &'r mut Run<SqliteStore>,
        failure: &'r Failure,
    ) -> BoxFuture<'r, Result<Completion, Stop>> {
        let step = failure.step.clone().unwrap_or_default();
        let body = format!(r#"{{"failed":"{}","step":"{step}"}}"#, failure.reason);
        Box::pin(async move { Ok(answer(402, body)) })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let db = std::env::var("IDEM_DB").unwrap_or_else(|_| "steps.db".into());
    let key = std::env::var("IDEM_KEY").unwrap_or_else(|_| "order-1".into());
    let card = std::env::var("CARD").unwrap_or_else(|_| "ok".into());

    let store =
        SqliteStore::connect(&format!("sqlite://{db}?mode=rwc"), SqliteConfig::default()).await?;
    store.migrate().await?;
    let seed = format!("INSERT OR IGNORE INTO stock (sku, available) VALUES ('book', {STOCK})");
    for ddl in [
        "CREATE TABLE IF NOT EXISTS stock (sku TEXT PRIMARY KEY, available INTEGER NOT NULL)",
        seed.as_str(),
        "CREATE TABLE IF NOT EXISTS stock_log (id INTEGER PRIMARY KEY, event TEXT NOT NULL)",
    ] {
        sqlx::query(ddl).execute(store.pool()).await?;
    }

    let op = Operation::new("orders.place")?;
    let runs = Runs::builder(store.clone())
        .workflow(op.clone(), PlaceOrder, WorkflowPolicy::default())
        .build()?;
    let scope = Scope::new(Tenant::new("acme")?, op.clone(), IdempotencyKey::new(key)?);
    let fingerprint = FingerprintSpec::default().fingerprint(&RequestParts {
        method: "POST",
        operation: &op,
        target: "/orders",
        json: false,
        body: card.as_bytes(),
    });
    let started = runs
        .start(
            &scope,
            &fingerprint,
            &Policy::default(),
            card.clone().into_bytes(),
        )
        .await?;
    match started {
        Started::Running(mut run) => match run.ended(Duration::from_secs(30)).await {
            Some(Ended::Finished(done)) => {
                let body = String::from_utf8_lossy(&done.response.body);
                println!("answer {} {body}", done.response.status);
            }
            other => return Err(format!("the run did not finish: {other:?}").into()),
        },
        Started::Replay(record) => {
            let response = record.response.ok_or("a finished run has its answer")?;
            let body = String::from_utf8_lossy(&response.body);
            println!("replayed {} {body}", response.status);
        }
        Started::Busy { attention, .. } => {
            return Err(format!("the run is busy elsewhere ({attention:?})").into());
        }
        other => return Err(format!("not started: {other:?}").into()),
    }

    let available: i64 = sqlx::query_scalar("SELECT available FROM stock WHERE sku = 'book'")
        .fetch_one(store.pool())
        .await?;
    let count = |event: &'static str| {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM stock_log WHERE event = ?")
            .bind(event)
            .fetch_one(store.pool())
    };
    let (reserved, released) = (count("reserved").await?, count("released").await?);
    println!(
        "book: {available} of {STOCK} available; \
         reservations made {reserved}, released {released} (all runs so far)"
    );
    Ok(())
}
