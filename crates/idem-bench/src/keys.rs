//! The key engine's fresh and replay paths against the same business insert
//! without idempotency, through the library and through HTTP.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Completion, Engine, FingerprintSpec, IdempotencyKey, Operation, Policy, RequestParts, Scope,
    StoredResponse, Tenant,
};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Router};
use idem_http::{IdemTx, IdempotencyLayer, RouteConfig, TenantSource};
use idem_sql::dialect::{On, Stmt};
use idem_sql::{Dialect, SqlStore};

use super::measure::{Op, table};
use super::report::{HTTP, LIBRARY};

fn scope(key: &str) -> anyhow::Result<Scope> {
    Ok(Scope::new(
        Tenant::new("bench")?,
        Operation::new("bench.create")?,
        IdempotencyKey::new(key)?,
    ))
}

fn fingerprint(n: u64) -> anyhow::Result<idem_core::Fingerprint> {
    let op = Operation::new("bench.create")?;
    let body = format!(r#"{{"amount":{n}}}"#);
    Ok(FingerprintSpec::default().fingerprint(&RequestParts {
        method: "POST",
        operation: &op,
        target: "/bench",
        json: true,
        body: body.as_bytes(),
    }))
}

fn completion(id: &str) -> Completion {
    Completion::completed(StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: format!(r#"{{"id":"{id}","amount":100}}"#).into_bytes(),
    })
}

/// The three ops for a backend: baseline insert, fresh key, replayed key.
async fn ops<D: Dialect>(
    store: SqlStore<D>,
    run_id: u64,
) -> anyhow::Result<Vec<(&'static str, Op)>> {
    let base_pool = store.pool().clone();
    let baseline: Op = Arc::new(move |n| {
        let pool = base_pool.clone();
        Box::pin(async move {
            let mut tx = pool.begin().await?;
            let id = format!("b{run_id}-{n}");
            D::execute(On::Conn(&mut *tx), insert_payment(&id)).await?;
            tx.commit().await?;
            Ok(())
        })
    });
    let engine = Arc::new(Engine::new(store.clone()));
    // A new key per call, claimed under `policy`; `tag` keeps the
    // optimistic case's keys and ids apart from the pessimistic one's.
    let fresh_with = |policy: Policy, tag: &'static str| -> Op {
        let engine = engine.clone();
        Arc::new(move |n| {
            let engine = engine.clone();
            Box::pin(async move {
                let id = format!("{tag}{run_id}-{n}");
                let s = scope(&id)?;
                let fp = fingerprint(n)?;
                engine
                    .execute(&s, &fp, &policy, |tx| {
                        let id = id.clone();
                        Box::pin(async move {
                            D::execute(On::Conn(&mut **tx), insert_payment(&id)).await?;
                            Ok::<_, sqlx::Error>(completion(&id))
                        })
                    })
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                Ok(())
            })
        })
    };
    let fresh = fresh_with(Policy::default(), "f");
    let fresh_optimistic = fresh_with(Policy::default().optimistic(), "o");
    // The replayed key is one the fresh path stored, under an index the
    // run's sequence never reaches.
    fresh(u64::MAX).await?;
    let replay_scope = scope(&format!("f{run_id}-{}", u64::MAX))?;
    let replay_fp = fingerprint(u64::MAX)?;
    let replay: Op = Arc::new(move |_| {
        let (engine, s) = (engine.clone(), replay_scope.clone());
        Box::pin(async move {
            match engine
                .begin(&s, &replay_fp, &Policy::default())
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?
            {
                idem_core::Begun::Replay(_) => Ok(()),
                idem_core::Begun::Fresh(_) => anyhow::bail!("replay key was not stored"),
            }
        })
    });
    Ok(cases(baseline, fresh, fresh_optimistic, replay))
}

/// The same paths through HTTP: an axum server on a loopback socket in
/// this process, driven by a keep-alive hyper client. `/baseline` runs the
/// insert in a plain transaction; `/idem` runs it under the `IdempotencyLayer`.
async fn http_ops<D: Dialect>(
    store: SqlStore<D>,
    run_id: u64,
) -> anyhow::Result<Vec<(&'static str, Op)>> {
    let config = RouteConfig::required(
        Operation::new("bench.http")?,
        TenantSource::Static(Tenant::new("bench")?),
    );
    let mut optimistic = config.clone();
    optimistic.policy = Policy::default().optimistic();
    let app = Router::new()
        .route("/baseline", post(baseline::<D>))
        .route(
            "/idem",
            post(keyed::<D>).layer(IdempotencyLayer::new(store.clone(), config)),
        )
        .route(
            "/idem-optimistic",
            post(keyed::<D>).layer(IdempotencyLayer::new(store.clone(), optimistic)),
        )
        .with_state(store);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = crate::load::client();
    let post = move |path: &'static str, key: Option<String>| {
        crate::load::post(client.clone(), addr, path, key)
    };
    let p = post.clone();
    let baseline: Op = Arc::new(move |_| Box::pin(p("/baseline", None)));
    let p = post.clone();
    let fresh: Op = Arc::new(move |n| Box::pin(p("/idem", Some(format!("hf{run_id}-{n}")))));
    let p = post.clone();
    let fresh_optimistic: Op =
        Arc::new(move |n| Box::pin(p("/idem-optimistic", Some(format!("ho{run_id}-{n}")))));
    let replay_key = format!("hr{run_id}");
    post("/idem", Some(replay_key.clone())).await?;
    let replay: Op = Arc::new(move |_| Box::pin(post("/idem", Some(replay_key.clone()))));
    Ok(cases(baseline, fresh, fresh_optimistic, replay))
}

/// The business insert of the benchmark, as a statement.
fn insert_payment(id: &str) -> Stmt<'_> {
    Stmt::new("INSERT INTO bench_payments (id, amount) VALUES ($1, $2)")
        .bind(id)
        .bind(100_i64)
}

fn created(id: &str) -> Response {
    (
        axum::http::StatusCode::CREATED,
        [("content-type", "application/json")],
        format!(r#"{{"id":"{id}","amount":100}}"#),
    )
        .into_response()
}

/// `/baseline`: the insert in a plain transaction.
async fn baseline<D: Dialect>(State(store): State<SqlStore<D>>) -> Response {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let result = async {
        let mut tx = store.pool().begin().await?;
        D::execute(On::Conn(&mut *tx), insert_payment(&id)).await?;
        tx.commit().await
    }
    .await;
    match result {
        Ok(()) => created(&id),
        Err(_) => axum::http::StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// `/idem`: the insert in the key's transaction.
async fn keyed<D: Dialect>(Extension(tx): Extension<IdemTx<D::Tx>>) -> Response {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let Ok(mut tx) = tx.lock().await else {
        return axum::http::StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    match D::execute(On::Conn(&mut **tx), insert_payment(&id)).await {
        Ok(_) => created(&id),
        Err(_) => axum::http::StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// The key-engine table's cases, in the order they are measured.
pub fn cases(baseline: Op, fresh: Op, fresh_optimistic: Op, replay: Op) -> Vec<(&'static str, Op)> {
    use super::report::{BASELINE, FRESH, FRESH_OPTIMISTIC, REPLAY};
    vec![
        (BASELINE, baseline),
        (FRESH, fresh),
        (FRESH_OPTIMISTIC, fresh_optimistic),
        (REPLAY, replay),
    ]
}

const BENCH_PAYMENTS: &str =
    "CREATE TABLE IF NOT EXISTS bench_payments (id TEXT PRIMARY KEY, amount BIGINT NOT NULL)";

/// The library and in-process HTTP cases on SQLite.
pub async fn sqlite(sqlite_url: &str, duration: Duration, run_id: u64) -> anyhow::Result<()> {
    let store =
        idem_sqlite::SqliteStore::connect(sqlite_url, idem_sqlite::SqliteConfig::default()).await?;
    store.migrate().await?;
    sqlx::raw_sql(BENCH_PAYMENTS).execute(store.pool()).await?;
    let ops = ops(store.clone(), run_id).await?;
    table("sqlite", LIBRARY, &ops, duration).await?;
    let ops = http_ops(store, run_id).await?;
    table("sqlite", HTTP, &ops, duration).await
}

/// The library and in-process HTTP cases on PostgreSQL.
/// Idem's tables and `bench_payments` on PostgreSQL, for the Powertools
/// peer and pgbench when the key cases do not run (`idem bench --only
/// peer` or `--only pgbench`).
pub async fn postgres_table(url: &str) -> anyhow::Result<()> {
    let store = idem_postgres::PgStore::connect(url, idem_postgres::PgConfig::default()).await?;
    store.migrate().await?;
    sqlx::raw_sql(BENCH_PAYMENTS).execute(store.pool()).await?;
    Ok(())
}

pub async fn postgres(url: &str, duration: Duration, run_id: u64) -> anyhow::Result<()> {
    let store = idem_postgres::PgStore::connect(
        url,
        idem_postgres::PgConfig {
            max_connections: 40,
            ..Default::default()
        },
    )
    .await?;
    store.migrate().await?;
    sqlx::raw_sql(BENCH_PAYMENTS).execute(store.pool()).await?;
    let ops = ops(store.clone(), run_id).await?;
    table("postgres", LIBRARY, &ops, duration).await?;
    let ops = http_ops(store, run_id).await?;
    table("postgres", HTTP, &ops, duration).await
}
