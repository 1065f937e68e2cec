//! The benchmarked work, recorded and not: a provider and a relay on
//! loopback that answer at once, the three-step workflow, and the same
//! insert and calls with nothing recorded.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use idem_core::steps::{Failure, RunStore};
use idem_core::{
    BoxFuture, Completion, FingerprintSpec, IdempotencyKey, Operation, Policy, RequestParts, Scope,
    StoredResponse, Tenant,
};
use idem_sql::patterns::{PatternExec, Value};
use idem_steps::{Ended, Run, Runs, RunsConfig, SendCtx, Started, Stop, Workflow, WorkflowPolicy};

use super::calls::{Provider, Relay};
use crate::measure::Op;

const OPERATION: &str = "bench.checkout";
const TABLE: &str =
    "CREATE TABLE IF NOT EXISTS bench_orders (id TEXT PRIMARY KEY, amount BIGINT NOT NULL)";

/// A provider and a relay that answer at once.
pub(super) async fn fakes() -> anyhow::Result<(SocketAddr, SocketAddr)> {
    let seq = Arc::new(AtomicUsize::new(0));
    let provider = Router::new().route(
        "/v1/payments",
        post(move || {
            let n = seq.fetch_add(1, Ordering::Relaxed);
            async move {
                (
                    axum::http::StatusCode::CREATED,
                    [("content-type", "application/json")],
                    format!(r#"{{"id":"pay_{n}"}}"#),
                )
            }
        }),
    );
    let relay = Router::new()
        .route(
            "/messages",
            post(|| async { axum::http::StatusCode::ACCEPTED }),
        )
        .route(
            "/messages/{id}",
            get(|| async { axum::http::StatusCode::NOT_FOUND }),
        );
    let mut addrs = Vec::new();
    for app in [provider, relay] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        addrs.push(listener.local_addr()?);
        tokio::spawn(async move { axum::serve(listener, app).await });
    }
    Ok((addrs[0], addrs[1]))
}

/// The three steps, recorded.
struct Three {
    provider: Provider,
    mail: Relay,
}

impl<S: RunStore<Tx: PatternExec>> Workflow<S> for Three {
    fn run<'r>(&'r self, run: &'r mut Run<S>) -> BoxFuture<'r, Result<Completion, Stop>> {
        Box::pin(async move {
            let id = format!("ord_{}", run.id().suffix());
            let i = id.clone();
            run.phase("order", move |tx| {
                Box::pin(async move {
                    tx.execute(
                        "INSERT INTO bench_orders (id, amount) VALUES ($1, 100)",
                        &[Value::Text(&i)],
                    )
                    .await?;
                    Ok(())
                })
            })
            .await?;
            let (p, i) = (self.provider.clone(), id.clone());
            let charge: String = run
                .call("charge", move |ctx| {
                    let (p, i) = (p.clone(), i.clone());
                    async move { p.charge(ctx.key.as_str(), &i).await }
                })
                .await?;
            let (m, v) = (self.mail.clone(), self.mail.clone());
            run.send(
                "mail",
                move |ctx: SendCtx| {
                    let v = v.clone();
                    async move { v.has(&ctx.message_id).await }
                },
                move |ctx: SendCtx| {
                    let m = m.clone();
                    async move { m.send(&ctx.message_id).await }
                },
            )
            .await?;
            let body = serde_json::json!({"id": id, "charge": charge}).to_string();
            Ok(Completion::completed(StoredResponse {
                status: 201,
                headers: vec![("content-type".into(), "application/json".into())],
                body: body.into_bytes(),
            }))
        })
    }

    fn failed<'r>(
        &'r self,
        _: &'r mut Run<S>,
        f: &'r Failure,
    ) -> BoxFuture<'r, Result<Completion, Stop>> {
        let body = f.reason.clone().into_bytes();
        Box::pin(async move {
            Ok(Completion::failed(StoredResponse {
                status: 424,
                headers: vec![],
                body,
            }))
        })
    }
}

pub(super) fn clients(
    provider: SocketAddr,
    relay: SocketAddr,
) -> anyhow::Result<(Provider, Relay)> {
    let t = Duration::from_secs(5);
    Ok((Provider::new(provider, t)?, Relay::new(relay, t)?))
}

/// The unrecorded run: the insert in a transaction, then the two calls.
pub(super) fn baseline<S: RunStore<Tx: PatternExec>>(
    store: S,
    provider: Provider,
    mail: Relay,
    run_id: u64,
) -> Op {
    Arc::new(move |n| {
        let (store, provider, mail) = (store.clone(), provider.clone(), mail.clone());
        Box::pin(async move {
            let id = format!("b{run_id}-{n}");
            let mut tx = store.begin().await?;
            tx.execute(
                "INSERT INTO bench_orders (id, amount) VALUES ($1, 100)",
                &[Value::Text(&id)],
            )
            .await?;
            store.commit(tx).await?;
            let key = uuid::Uuid::new_v4().simple().to_string();
            provider
                .charge(&key, &id)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            mail.send(&key).await.map_err(|e| anyhow::anyhow!("{e}"))?;
            Ok(())
        })
    })
}

/// The recorded run: a fresh key, its run started and awaited.
pub(super) fn recorded<S: RunStore<Tx: PatternExec>>(runs: Runs<S>, run_id: u64) -> Op {
    Arc::new(move |n| {
        let runs = runs.clone();
        Box::pin(async move {
            let op = Operation::new(OPERATION)?;
            let scope = Scope::new(
                Tenant::new("bench")?,
                op.clone(),
                IdempotencyKey::new(format!("s{run_id}-{n}"))?,
            );
            let fp = FingerprintSpec::default().fingerprint(&RequestParts {
                method: "POST",
                operation: &op,
                target: "/orders",
                json: false,
                body: b"",
            });
            match runs
                .start(&scope, &fp, &Policy::default(), Vec::new())
                .await?
            {
                Started::Running(mut h) => match h.ended(Duration::from_secs(30)).await {
                    Some(Ended::Finished(c)) if c.response.status == 201 => Ok(()),
                    other => anyhow::bail!("the run ended {other:?}"),
                },
                other => anyhow::bail!("a fresh key did not start a run: {other:?}"),
            }
        })
    })
}

pub(super) fn runs<S: RunStore<Tx: PatternExec>>(
    store: S,
    provider: Provider,
    mail: Relay,
) -> anyhow::Result<Runs<S>> {
    Ok(Runs::builder(store)
        .config(RunsConfig {
            max_concurrent: 64,
            ..RunsConfig::default()
        })
        .workflow(
            Operation::new(OPERATION)?,
            Three { provider, mail },
            WorkflowPolicy::default(),
        )
        .build()?)
}

pub(super) async fn sqlx_table<S: RunStore<Tx: PatternExec>>(store: &S) -> anyhow::Result<()> {
    let mut tx = store.begin().await?;
    tx.execute(TABLE, &[]).await?;
    store.commit(tx).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One run of each path against a real SQLite file: the calls go
    /// through `idem-client` to the fakes, the recorded run ends `201`,
    /// and each path wrote its order.
    #[tokio::test]
    async fn one_unrecorded_and_one_recorded_run_complete_through_the_fakes() {
        let dir = idem_testkit::TempDir::new("bench-steps");
        let store = idem_sqlite::SqliteStore::connect(
            &dir.sqlite_url(),
            idem_sqlite::SqliteConfig::default(),
        )
        .await
        .unwrap();
        store.migrate().await.unwrap();
        sqlx_table(&store).await.unwrap();
        let (p, r) = fakes().await.unwrap();
        let (provider, relay) = clients(p, r).unwrap();
        let base = baseline(store.clone(), provider.clone(), relay.clone(), 7);
        let rec = recorded(runs(store.clone(), provider, relay).unwrap(), 7);
        base(1).await.unwrap();
        rec(1).await.unwrap();
        let orders: Vec<String> = sqlx::query_scalar("SELECT id FROM bench_orders ORDER BY id")
            .fetch_all(store.pool())
            .await
            .unwrap();
        assert_eq!(orders.len(), 2, "{orders:?}");
        assert!(orders.contains(&"b7-1".to_owned()), "{orders:?}");
        assert!(orders.iter().any(|id| id.starts_with("ord_")), "{orders:?}");
    }
}
