//! Recorded steps against the same work unrecorded: a three-step run — a
//! local phase, a call to a provider, a send through a relay (both fakes on
//! loopback answering at once) — through `idem-steps`, against the same
//! insert, the same two HTTP calls and nothing recorded; and, on
//! PostgreSQL, the commits (transaction ids consumed) and round trips
//! (counted on the wire by a proxy) each costs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use idem_core::patterns::{PatternExec, Value};
use idem_core::steps::{Failure, RunStore};
use idem_core::{
    BoxFuture, Completion, FingerprintSpec, IdempotencyKey, Operation, Policy, RequestParts, Scope,
    StoredResponse, Tenant,
};
use idem_steps::{Ended, Run, Runs, RunsConfig, SendCtx, Started, Stop, Workflow, WorkflowPolicy};

use super::measure::{Op, measure};
use crate::demo::checkout::clients::{Charge, Endpoint, Mail, Provider};

const OPERATION: &str = "bench.checkout";
const TABLE: &str =
    "CREATE TABLE IF NOT EXISTS bench_orders (id TEXT PRIMARY KEY, amount BIGINT NOT NULL)";

/// A provider and a relay that answer at once.
async fn fakes() -> anyhow::Result<(SocketAddr, SocketAddr)> {
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
    mail: Mail,
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
            let charge: Charge = run
                .call("charge", move |ctx| {
                    let (p, i) = (p.clone(), i.clone());
                    async move {
                        p.charge(ctx.key.as_str(), "cus_bench", 100, "EUR", &i)
                            .await
                    }
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
                    async move { m.send(&ctx.message_id, "a@b.c", "s", "b").await }
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

fn clients(provider: SocketAddr, relay: SocketAddr) -> anyhow::Result<(Provider, Mail)> {
    let t = Duration::from_secs(5);
    Ok((
        Provider(Endpoint::new(&format!("http://{provider}"), t)?),
        Mail(Endpoint::new(&format!("http://{relay}"), t)?),
    ))
}

/// The unrecorded run: the insert in a transaction, then the two calls.
fn baseline<S: RunStore<Tx: PatternExec>>(
    store: S,
    provider: Provider,
    mail: Mail,
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
                .charge(&key, "cus_bench", 100, "EUR", &id)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            mail.send(&key, "a@b.c", "s", "b")
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            Ok(())
        })
    })
}

/// The recorded run: a fresh key, its run started and awaited.
fn recorded<S: RunStore<Tx: PatternExec>>(runs: Runs<S>, run_id: u64) -> Op {
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

fn runs<S: RunStore<Tx: PatternExec>>(
    store: S,
    provider: Provider,
    mail: Mail,
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

/// Prints the header of the step table.
pub fn header() {
    println!("| backend | path | concurrency | runs/s | p50 | p99 | ratio to unrecorded |");
    println!("|---|---|---:|---:|---:|---:|---:|");
}

/// One backend's rows at concurrency 1, 8 and 32.
pub async fn run<S: RunStore<Tx: PatternExec>>(
    backend: &str,
    store: S,
    duration: Duration,
    run_id: u64,
) -> anyhow::Result<()> {
    sqlx_table(&store).await?;
    let (p, r) = fakes().await?;
    let (provider, mail) = clients(p, r)?;
    let base = baseline(store.clone(), provider.clone(), mail.clone(), run_id);
    let rec = recorded(runs(store, provider, mail)?, run_id);
    for c in [1, 8, 32] {
        let b = measure(base.clone(), c, duration).await?;
        let s = measure(rec.clone(), c, duration).await?;
        for (name, st) in [
            ("unrecorded: insert + 2 calls", &b),
            ("recorded run: 3 steps", &s),
        ] {
            println!(
                "| {backend} | {name} | {c} | {:.0} | {:.2} ms | {:.2} ms | {:.2} |",
                st.ops_per_sec,
                st.p50.as_secs_f64() * 1e3,
                st.p99.as_secs_f64() * 1e3,
                st.ops_per_sec / b.ops_per_sec.max(f64::MIN_POSITIVE)
            );
        }
    }
    Ok(())
}

async fn sqlx_table<S: RunStore<Tx: PatternExec>>(store: &S) -> anyhow::Result<()> {
    let mut tx = store.begin().await?;
    tx.execute(TABLE, &[]).await?;
    store.commit(tx).await?;
    Ok(())
}

/// What `n` operations cost on PostgreSQL: write transactions (transaction
/// ids consumed, read off the server) and statement round trips (counted on
/// the wire), each divided by `n`.
pub async fn costs(url: &str, run_id: u64, n: u64) -> anyhow::Result<()> {
    let upstream: SocketAddr = {
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        let host = rest.split('@').next_back().unwrap_or(rest);
        host.split('/').next().unwrap_or(host).parse()?
    };
    let (proxy, counts) = wire::proxy(upstream).await?;
    let via = url.replacen(&upstream.to_string(), &proxy.to_string(), 1);
    let store = idem_postgres::PgStore::connect(
        &via,
        idem_postgres::PgConfig {
            max_connections: 4,
            ..Default::default()
        },
    )
    .await?;
    store.migrate().await?;
    sqlx_table(&store).await?;
    let (p, r) = fakes().await?;
    let (provider, mail) = clients(p, r)?;
    let xid = || async {
        let v: i64 = sqlx::query_scalar("SELECT txid_current()")
            .fetch_one(store.pool())
            .await?;
        anyhow::Ok(v)
    };
    println!("| backend | path | commits per run | round trips per run |");
    println!("|---|---|---:|---:|");
    let cases: [(&str, Op); 2] = [
        (
            "unrecorded: insert + 2 calls",
            baseline(store.clone(), provider.clone(), mail.clone(), run_id ^ 1),
        ),
        (
            "recorded run: 3 steps",
            recorded(runs(store.clone(), provider, mail)?, run_id ^ 1),
        ),
    ];
    for (name, op) in cases {
        // Warm: connections open, statements prepared.
        op(u64::MAX - 1).await?;
        let before = xid().await?;
        counts.reset().await;
        for i in 0..n {
            op(i).await?;
        }
        let statements = counts.read().await;
        // Each xid query consumes one id itself.
        let commits = (xid().await? - before - 1) as f64 / n as f64;
        let trips = statements as f64 / n as f64;
        println!("| postgres | {name} | {commits:.2} | {trips:.2} |");
    }
    Ok(())
}

/// Counts statement round trips: each simple `Query`, and each `Sync` that
/// closes a batch with an `Execute` (pings — a lone `Sync` — are left out,
/// as they are in `idem-postgres`'s wire test).
mod wire {
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    #[derive(Default)]
    pub struct Counts(AtomicUsize);

    impl Counts {
        pub async fn reset(&self) {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            self.0.store(0, Ordering::SeqCst);
        }
        pub async fn read(&self) -> usize {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            self.0.load(Ordering::SeqCst)
        }
    }

    pub async fn proxy(upstream: SocketAddr) -> anyhow::Result<(SocketAddr, Arc<Counts>)> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let counts = Arc::new(Counts::default());
        let c = counts.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut sr, &mut cw).await;
                });
                let c = c.clone();
                tokio::spawn(async move {
                    let (mut buf, mut started, mut executed) = (Vec::new(), false, false);
                    let mut chunk = [0u8; 8192];
                    loop {
                        let n = match cr.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if sw.write_all(&chunk[..n]).await.is_err() {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        loop {
                            let head = usize::from(started);
                            let Some(len) = buf
                                .get(head..head + 4)
                                .and_then(|b| <[u8; 4]>::try_from(b).ok())
                                .map(|b| i32::from_be_bytes(b) as usize)
                            else {
                                break;
                            };
                            if buf.len() < head + len {
                                break;
                            }
                            if started {
                                match buf[0] {
                                    b'E' => executed = true,
                                    b'Q' => {
                                        c.0.fetch_add(1, Ordering::SeqCst);
                                    }
                                    b'S' if std::mem::take(&mut executed) => {
                                        c.0.fetch_add(1, Ordering::SeqCst);
                                    }
                                    _ => {}
                                }
                            } else {
                                // Protocol 3.0's startup message; SSL requests
                                // and the like come before it.
                                started = buf.get(4..8) == Some(&196_608i32.to_be_bytes()[..]);
                            }
                            buf.drain(..head + len);
                        }
                    }
                });
            }
        });
        Ok((addr, counts))
    }
}
