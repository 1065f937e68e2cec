//! `idem bench`: the key engine's fresh and replay paths against a baseline of
//! the same business insert without idempotency, on SQLite and PostgreSQL, at
//! several concurrencies. Prints ops/s, p50, p99 and the ratio to the baseline.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_core::{
    Completion, Engine, FingerprintSpec, IdempotencyKey, Operation, Policy, RequestParts, Scope,
    StoredResponse, Tenant,
};

type BoxFut = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;
type Op = Arc<dyn Fn(u64) -> BoxFut + Send + Sync>;

/// One measured case.
pub struct Stats {
    pub ops_per_sec: f64,
    pub p50: Duration,
    pub p99: Duration,
}

/// Runs `op` from `concurrency` tasks for `duration`.
pub async fn measure(op: Op, concurrency: usize, duration: Duration) -> anyhow::Result<Stats> {
    // One sequence for the whole run, so ids never repeat across cases.
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let deadline = Instant::now() + duration;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                op(SEQ.fetch_add(1, Ordering::Relaxed)).await?;
                lat.push(t.elapsed());
            }
            anyhow::Ok(lat)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    Ok(Stats {
        ops_per_sec: all.len() as f64 / elapsed,
        p50: pct(0.50),
        p99: pct(0.99),
    })
}

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
macro_rules! ops {
    ($store:expr, $run:expr) => {{
        let store = $store;
        let run_id: u64 = $run;
        let base_pool = store.pool().clone();
        let baseline: Op = Arc::new(move |n| {
            let pool = base_pool.clone();
            Box::pin(async move {
                let mut tx = pool.begin().await?;
                sqlx::query("INSERT INTO bench_payments (id, amount) VALUES ($1, $2)")
                    .bind(format!("b{run_id}-{n}"))
                    .bind(100_i64)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(())
            })
        });
        let engine = Arc::new(Engine::new(store.clone()));
        let fresh_engine = engine.clone();
        let fresh: Op = Arc::new(move |n| {
            let engine = fresh_engine.clone();
            Box::pin(async move {
                let id = format!("f{run_id}-{n}");
                let s = scope(&id)?;
                let fp = fingerprint(n)?;
                engine
                    .execute(&s, &fp, &Policy::default(), |tx| {
                        let id = id.clone();
                        Box::pin(async move {
                            sqlx::query("INSERT INTO bench_payments (id, amount) VALUES ($1, $2)")
                                .bind(&id)
                                .bind(100_i64)
                                .execute(&mut **tx)
                                .await?;
                            Ok::<_, sqlx::Error>(completion(&id))
                        })
                    })
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                Ok(())
            })
        });
        let replay_scope = scope(&format!("replay-{run_id}"))?;
        let replay_fp = fingerprint(0)?;
        let id = format!("r{run_id}");
        engine
            .execute(&replay_scope, &replay_fp, &Policy::default(), |tx| {
                let id = id.clone();
                Box::pin(async move {
                    sqlx::query("INSERT INTO bench_payments (id, amount) VALUES ($1, $2)")
                        .bind(&id)
                        .bind(100_i64)
                        .execute(&mut **tx)
                        .await?;
                    Ok::<_, sqlx::Error>(completion(&id))
                })
            })
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
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
        (baseline, fresh, replay)
    }};
}

pub async fn run(sqlite_url: &str, postgres_url: Option<&str>, secs: u64) -> anyhow::Result<()> {
    let duration = Duration::from_secs(secs.max(1));
    let run_id = idem_core::Clock::now_ms(&idem_core::SystemClock) as u64;
    println!("| backend | path | concurrency | ops/s | p50 | p99 | ratio to baseline |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    {
        let store =
            idem_sqlite::SqliteStore::connect(sqlite_url, idem_sqlite::SqliteConfig::default())
                .await?;
        store.migrate().await?;
        sqlx::raw_sql("CREATE TABLE IF NOT EXISTS bench_payments (id TEXT PRIMARY KEY, amount BIGINT NOT NULL)").execute(store.pool()).await?;
        let ops = ops!(store, run_id);
        table("sqlite", ops, duration).await?;
    }
    if let Some(url) = postgres_url {
        let store = idem_postgres::PgStore::connect(
            url,
            idem_postgres::PgConfig {
                max_connections: 40,
                ..Default::default()
            },
        )
        .await?;
        store.migrate().await?;
        sqlx::raw_sql("CREATE TABLE IF NOT EXISTS bench_payments (id TEXT PRIMARY KEY, amount BIGINT NOT NULL)").execute(store.pool()).await?;
        let ops = ops!(store, run_id);
        table("postgres", ops, duration).await?;
    }
    Ok(())
}

async fn table(
    backend: &str,
    (baseline, fresh, replay): (Op, Op, Op),
    duration: Duration,
) -> anyhow::Result<()> {
    for c in [1, 8, 32] {
        let base = measure(baseline.clone(), c, duration).await?;
        for (name, op) in [
            ("baseline insert", None),
            ("fresh key", Some(&fresh)),
            ("replay", Some(&replay)),
        ] {
            let s = match op {
                None => Stats {
                    ops_per_sec: base.ops_per_sec,
                    p50: base.p50,
                    p99: base.p99,
                },
                Some(op) => measure(op.clone(), c, duration).await?,
            };
            println!(
                "| {backend} | {name} | {c} | {:.0} | {:.2} ms | {:.2} ms | {:.2} |",
                s.ops_per_sec,
                s.p50.as_secs_f64() * 1e3,
                s.p99.as_secs_f64() * 1e3,
                s.ops_per_sec / base.ops_per_sec.max(f64::MIN_POSITIVE)
            );
        }
    }
    Ok(())
}
