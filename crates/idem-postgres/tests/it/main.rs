//! Integration tests on a real PostgreSQL server, one fresh database per test.
//! `cargo xtask test` starts the server and sets `IDEM_TEST_POSTGRES_URL`.
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::atomic::{AtomicU32, Ordering};

use idem_core::conformance as c;
use idem_core::{Completion, Engine, Error, KeyStore, Outcome, Policy};
use idem_postgres::{PgConfig, PgStore};
use sqlx::Connection;

fn admin_url() -> String {
    std::env::var("IDEM_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!("IDEM_TEST_POSTGRES_URL is not set: run the suite with `cargo xtask test`")
    })
}

struct TestDb {
    name: String,
    store: PgStore,
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Best effort: the throwaway server is deleted at the end of the run anyway.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(mut conn) = sqlx::PgConnection::connect(&admin_url()).await {
                    let _ = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&mut conn)
                        .await;
                }
            });
        })
        .join();
    }
}

static SEQ: AtomicU32 = AtomicU32::new(0);

fn db_url(name: &str) -> String {
    match admin_url().rsplit_once('/') {
        Some((base, _)) => format!("{base}/{name}"),
        None => panic!("IDEM_TEST_POSTGRES_URL must end in /<database>"),
    }
}

async fn db() -> TestDb {
    let admin = admin_url();
    let name = format!(
        "idem_it_{}_{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    );
    let mut conn = sqlx::PgConnection::connect(&admin).await.unwrap();
    sqlx::raw_sql(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await
        .unwrap();
    let url = db_url(&name);
    let config = PgConfig {
        max_connections: 60,
        ..PgConfig::default()
    };
    let store = PgStore::connect(&url, config).await.unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap(); // migrations are idempotent
    sqlx::raw_sql("CREATE TABLE payments (id TEXT PRIMARY KEY, amount BIGINT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    TestDb { name, store }
}

macro_rules! conformance {
    ($($name:ident $(, $arg:expr)?;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let db = db().await;
            c::$name(db.store.clone() $(, $arg)?).await;
        }
    )*};
}

conformance! {
    replay_and_mismatch;
    failed_outcome_is_replayed;
    rollback_leaves_no_record;
    tenants_are_isolated;
    concurrent_claims_execute_once, 50;
    wait_is_bounded;
    expiry_and_gc;
    concurrent_takeover_of_expired_record_executes_once, 20;
}

async fn payments(store: &PgStore) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM payments")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn business_write_commits_with_the_key_and_rolls_back_with_it() {
    let db = db().await;
    let engine = Engine::new(db.store.clone());
    let s = c::scope("t1", "atomic-1");
    let fp = c::fingerprint(r#"{"amount":5}"#);
    let failed = engine
        .execute(&s, &fp, &Policy::default(), |tx| {
            Box::pin(async move {
                sqlx::query("INSERT INTO payments VALUES ('p1', 5)")
                    .execute(&mut **tx)
                    .await
                    .unwrap();
                Err::<Completion, _>("card network timeout")
            })
        })
        .await;
    assert!(matches!(
        failed,
        Err(Error::Operation("card network timeout"))
    ));
    assert_eq!(
        payments(&db.store).await,
        0,
        "the payment must roll back with the key"
    );
    assert!(db.store.fetch(&s).await.unwrap().is_none());
    for expect_executed in [true, false] {
        let out = engine
            .execute(&s, &fp, &Policy::default(), |tx| {
                Box::pin(async move {
                    sqlx::query("INSERT INTO payments VALUES ('p1', 5)")
                        .execute(&mut **tx)
                        .await?;
                    Ok::<_, sqlx::Error>(Completion::completed(c::response(201, r#"{"id":"p1"}"#)))
                })
            })
            .await
            .unwrap();
        assert_eq!(matches!(out, Outcome::Executed(_)), expect_executed);
    }
    assert_eq!(payments(&db.store).await, 1, "exactly one payment");
}

#[tokio::test]
async fn unreachable_database_is_unavailable_and_retryable() {
    // Port 1 on loopback: nothing listens, the connection is refused.
    let config = PgConfig {
        acquire_timeout: std::time::Duration::from_secs(2),
        ..PgConfig::default()
    };
    let err = PgStore::connect("postgres://postgres@127.0.0.1:1/none", config)
        .await
        .unwrap_err();
    assert!(
        err.retryable(),
        "connection refused must be retryable: {err:?}"
    );
}

/// Counts the client's statement round trips to the server: each simple `Query`
/// and each `Sync` that closes a batch with an `Execute` waits for one
/// `ReadyForQuery`. A lone `Sync` is a ping, counted apart: sqlx pings a
/// connection when it goes back to the pool (after the caller has its answer)
/// and, unless disabled, before handing it out (on the request's path).
mod round_trips {
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    #[derive(Default)]
    pub struct Counts {
        pub statements: AtomicUsize,
        pub pings: AtomicUsize,
    }

    impl Counts {
        /// Lets in-flight pings land, then zeroes both counters.
        pub async fn settle_and_reset(&self) {
            tokio::time::sleep(std::time::Duration::from_millis(150)).await;
            self.statements.store(0, Ordering::SeqCst);
            self.pings.store(0, Ordering::SeqCst);
        }

        /// Lets in-flight pings land, then reads `(statements, pings)`.
        pub async fn settle_and_read(&self) -> (usize, usize) {
            tokio::time::sleep(std::time::Duration::from_millis(150)).await;
            (
                self.statements.load(Ordering::SeqCst),
                self.pings.load(Ordering::SeqCst),
            )
        }
    }

    pub async fn proxy(upstream: SocketAddr) -> (SocketAddr, Arc<Counts>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let count = Arc::new(Counts::default());
        let c = count.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(upstream).await.unwrap();
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut sr, &mut cw).await;
                });
                let c = c.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut started = false;
                    let mut executed = false;
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
                        // Untyped frames until the startup message, then typed.
                        loop {
                            let (head, len_at) = if started { (1, 1) } else { (0, 0) };
                            if buf.len() < head + 4 {
                                break;
                            }
                            let len =
                                i32::from_be_bytes(buf[len_at..len_at + 4].try_into().unwrap())
                                    as usize;
                            if buf.len() < head + len {
                                break;
                            }
                            if started {
                                match buf[0] {
                                    b'E' => executed = true,
                                    b'Q' => {
                                        c.statements.fetch_add(1, Ordering::SeqCst);
                                    }
                                    b'S' if std::mem::take(&mut executed) => {
                                        c.statements.fetch_add(1, Ordering::SeqCst);
                                    }
                                    b'S' => {
                                        c.pings.fetch_add(1, Ordering::SeqCst);
                                    }
                                    _ => {}
                                }
                            } else {
                                let code = i32::from_be_bytes(buf[4..8].try_into().unwrap());
                                started = code == 196_608; // protocol 3.0 startup
                            }
                            buf.drain(..head + len);
                        }
                    }
                });
            }
        });
        (addr, count)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_path_is_five_round_trips_and_replay_four() {
    let db = db().await;
    let url = db_url(&db.name);
    let (host, rest) = url["postgres://".len()..].split_once('@').unwrap();
    let (hostport, dbname) = rest.split_once('/').unwrap();
    let (proxy, count) = round_trips::proxy(hostport.parse().unwrap()).await;
    let store = PgStore::connect(
        &format!("postgres://{host}@{proxy}/{dbname}"),
        PgConfig {
            max_connections: 1,
            ..PgConfig::default()
        },
    )
    .await
    .unwrap();
    let engine = Engine::new(store);
    let fp = c::fingerprint("{}");
    let fresh = |key: String| {
        let engine = engine.clone();
        async move {
            let out = engine
                .execute(&c::scope("t1", &key), &fp, &Policy::default(), |tx| {
                    Box::pin(async move {
                        sqlx::query("INSERT INTO payments (id, amount) VALUES ($1, 1)")
                            .bind(key)
                            .execute(&mut **tx)
                            .await?;
                        Ok::<_, sqlx::Error>(Completion::completed(c::response(201, "{}")))
                    })
                })
                .await
                .unwrap();
            matches!(out, Outcome::Executed(_))
        }
    };
    // Warm up: the connection is open and every statement is prepared.
    assert!(fresh("warm".into()).await);
    assert!(!fresh("warm".into()).await);
    count.settle_and_reset().await;
    assert!(fresh("k-1".into()).await);
    assert_eq!(
        count.settle_and_read().await,
        (5, 1),
        "fresh: BEGIN, claim INSERT, business INSERT, UPDATE, COMMIT; \
         the one ping is sqlx's on release, none before use"
    );
    count.settle_and_reset().await;
    assert!(!fresh("k-1".into()).await);
    assert_eq!(
        count.settle_and_read().await,
        (4, 1),
        "replay: BEGIN, claim INSERT, SELECT, ROLLBACK"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_killed_while_idle_is_replaced_without_an_error() {
    let db = db().await;
    let store = PgStore::connect(
        &db_url(&db.name),
        PgConfig {
            max_connections: 1,
            ..PgConfig::default()
        },
    )
    .await
    .unwrap();
    let engine = Engine::new(store.clone());
    let fp = c::fingerprint("{}");
    let ok = Completion::completed(c::response(201, "{}"));
    let run = |key: &'static str| {
        let (engine, ok) = (engine.clone(), ok.clone());
        async move {
            engine
                .execute(&c::scope("t1", key), &fp, &Policy::default(), |_| {
                    Box::pin(async move { Ok::<_, sqlx::Error>(ok) })
                })
                .await
        }
    };
    run("before").await.unwrap();
    // The server ends the pooled, idle session (a restart, a proxy timeout …).
    let mut admin = sqlx::PgConnection::connect(&admin_url()).await.unwrap();
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = $1 AND pid <> pg_backend_pid()) t",
    )
    .bind(&db.name)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert!(killed >= 1, "the pool's idle connection was terminated");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(
        matches!(run("after").await, Ok(Outcome::Executed(_))),
        "the dead connection is replaced at BEGIN, invisibly to the caller"
    );
}
