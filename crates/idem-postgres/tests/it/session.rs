//! What business code may leave behind on the connection Idem's key
//! transactions run on, and connections that go silent. Idem writes its
//! values into the text of its own statements (see `inline`): they must
//! mean the same whatever session settings an earlier handler changed for
//! good (a plain `SET` outlives the transaction and the request), and a
//! client's key must never run as SQL. (Found by the review of issue 24:
//! with quoted literals, `standard_conforming_strings = off` left by one
//! handler turned a later key into SQL.)

use idem_core::{Completion, Engine, KeyStore, Outcome, Policy};

use super::{c, db, store_of};

/// An operation whose business code leaves `setting` on its (only) writer
/// connection for good, as legacy code written for it does.
async fn leave_set(engine: &Engine<idem_postgres::PgStore>, setting: &'static str) {
    let out = engine
        .execute(
            &c::scope("t1", &format!("legacy-{}", setting.len())),
            &c::fingerprint("{}"),
            &Policy::default(),
            |tx| {
                Box::pin(async move {
                    sqlx::Executor::execute(&mut **tx, setting).await?;
                    Ok::<_, sqlx::Error>(Completion::completed(c::response(201, "{}")))
                })
            },
        )
        .await
        .unwrap();
    assert!(matches!(out, Outcome::Executed(_)));
}

/// Session settings that change how PostgreSQL reads a statement's text.
const SETTINGS: [&str; 2] = [
    // A backslash in an ordinary literal escapes.
    "SET standard_conforming_strings = off",
    // A client-only encoding in which a multi-byte character's second byte
    // can be a backslash.
    "SET client_encoding = 'SJIS'",
];

/// A client's idempotency key is data on every later request, whatever
/// session state an earlier handler left on the writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_never_runs_as_sql_after_business_code_changed_the_session() {
    for setting in SETTINGS {
        let db = db().await;
        // One writer, so the next key transaction reuses that session.
        let engine = Engine::new(store_of(&db.db.url, 1).await);
        leave_set(&engine, setting).await;
        // Visible ASCII, under 256 characters: a valid Idempotency-Key.
        let key = r"\',$$$$,$$pending$$,NULL,1,1,1);CREATE/**/TABLE/**/pwned();COMMIT;INSERT/**/INTO/**/pwned/**/SELECT--";
        assert!(key.len() < 256);
        let out = engine
            .execute(
                &c::scope("t1", key),
                &c::fingerprint("{}"),
                &Policy::default(),
                |_| {
                    Box::pin(async move {
                        Ok::<_, sqlx::Error>(Completion::completed(c::response(201, "{}")))
                    })
                },
            )
            .await;
        let pwned: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE tablename = 'pwned'")
                .fetch_one(db.store.pool())
                .await
                .unwrap();
        assert_eq!(
            pwned, 0,
            "after {setting}: the key ran as SQL (the operation answered {out:?})"
        );
        assert!(
            matches!(out, Ok(Outcome::Executed(_))),
            "{setting}: {out:?}"
        );
    }
}

/// The stored fingerprint and response — bytes, quotes, backslashes and
/// non-ASCII headers — are the request's and the handler's, whatever session
/// state an earlier handler left on the writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_stored_exactly_after_business_code_changed_the_session() {
    for setting in SETTINGS {
        let db = db().await;
        let engine = Engine::new(store_of(&db.db.url, 1).await);
        leave_set(&engine, setting).await;
        let fp = c::fingerprint(r#"{"amount":1}"#);
        let response = idem_core::StoredResponse {
            status: 201,
            headers: vec![("x-note".into(), "it's \\ ünïcödé ✓ 表".into())],
            body: (0u8..=255).collect(),
        };
        let scope = c::scope("t1", "after-legacy");
        let done = Completion::completed(response.clone());
        let out = engine
            .execute(&scope, &fp, &Policy::default(), |_| {
                Box::pin(async move { Ok::<_, sqlx::Error>(done) })
            })
            .await;
        assert!(
            matches!(out, Ok(Outcome::Executed(_))),
            "{setting}: {out:?}"
        );
        let stored = db.store.fetch(&scope).await.unwrap().unwrap();
        assert_eq!(stored.fingerprint, fp, "{setting}: the stored fingerprint");
        assert_eq!(
            stored.response.as_ref(),
            Some(&response),
            "{setting}: the stored response"
        );
    }
}

/// A TCP proxy whose connections open at [`Partition::cut`] go silent for
/// good — nothing forwarded either way, the sockets kept open, as across a
/// partition or a failed-over address — while connections made afterwards
/// are forwarded normally (the database itself is reachable).
mod partition {
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    #[derive(Default)]
    pub struct Partition {
        open: Mutex<Vec<Arc<AtomicBool>>>,
    }

    impl Partition {
        pub fn cut(&self) -> usize {
            let open = self.open.lock().unwrap();
            for silent in open.iter() {
                silent.store(true, Ordering::SeqCst);
            }
            open.len()
        }
    }

    async fn pipe(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        silent: Arc<AtomicBool>,
    ) {
        let mut chunk = [0u8; 8192];
        loop {
            let n = match from.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if silent.load(Ordering::SeqCst) {
                continue;
            }
            if to.write_all(&chunk[..n]).await.is_err() {
                break;
            }
        }
        // A silenced connection stays open: its peer never hears of the end.
        while silent.load(Ordering::SeqCst) {
            tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
        }
    }

    pub async fn proxy(upstream: SocketAddr) -> (SocketAddr, Arc<Partition>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let partition = Arc::new(Partition::default());
        let p = partition.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(upstream).await.unwrap();
                let silent = Arc::new(AtomicBool::new(false));
                p.open.lock().unwrap().push(silent.clone());
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pipe(sr, cw, silent.clone()));
                tokio::spawn(pipe(cr, sw, silent));
            }
        });
        (addr, partition)
    }
}

/// The store's connections all go silent at once (a partition, a failover
/// behind one address, a NAT that dropped idle flows) while the database
/// stays reachable on new connections. Callers get `Unavailable` within the
/// deadline — and then, once the deadline has passed, the store must serve
/// again on new connections instead of waiting on the silent ones forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_serves_again_after_its_connections_went_silent() {
    use std::time::{Duration, Instant};
    let db = db().await;
    let (proxy, partition) = partition::proxy(idem_testkit::url_addr(&db.db.url)).await;
    let config = idem_postgres::PgConfig {
        max_connections: 2,
        acquire_timeout: Duration::from_millis(500),
        lock_timeout: Duration::from_millis(500),
        statement_timeout: Duration::from_secs(1),
        ..idem_postgres::PgConfig::default()
    };
    let store = idem_postgres::PgStore::connect(&idem_testkit::url_via(&db.db.url, proxy), config)
        .await
        .unwrap();
    let engine = Engine::new(store.clone());
    // Warm two readers and two writers.
    let (a, b) = tokio::join!(
        super::ok_under(&engine, "warm-a"),
        super::ok_under(&engine, "warm-b")
    );
    assert!(a.is_ok() && b.is_ok(), "{a:?} {b:?}");
    assert!(partition.cut() >= 2);
    let cut = Instant::now();
    let mut answers = Vec::new();
    let mut served = false;
    // A claim waits for a concurrent one at most 0.5 s, under the statement
    // timeout: its deadline is the store's (2 s). Allow five of them.
    let policy = Policy::default().wait(Duration::from_millis(500));
    while cut.elapsed() < 5 * store.dialect().deadline() {
        let key = format!("after-cut-{}", answers.len());
        let (scope, fp) = (c::scope("t1", &key), c::fingerprint("{}"));
        let call = engine.execute(&scope, &fp, &policy, |_| {
            Box::pin(
                async move { Ok::<_, sqlx::Error>(Completion::completed(c::response(201, "{}"))) },
            )
        });
        let out = tokio::time::timeout(2 * store.dialect().deadline(), call).await;
        let ok = matches!(out, Ok(Ok(Outcome::Executed(_))));
        answers.push(format!(
            "{:?}: {}",
            cut.elapsed(),
            match &out {
                Ok(Ok(_)) => "executed".to_string(),
                Ok(Err(e)) => e.to_string(),
                Err(_) => "no answer within twice the deadline".to_string(),
            }
        ));
        if ok {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(served, "never served again after the cut: {answers:#?}");
}

/// The record's `UPDATE` finds its row by the primary key, never by a scan
/// of the key table: the values Idem writes into its statements compare
/// with the key columns in their collation. (A text from `convert_from`
/// took the collation "C" of the encoding's name, and every completion read
/// the whole table: fresh keys fell to 0.05× a bare insert as it grew.)
/// Counted by PostgreSQL itself: the table's sequential scans, flushed to
/// the statistics when the store's sessions end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_find_the_record_by_its_key_not_by_a_scan() {
    use sqlx::Connection;
    use std::time::Duration;
    let db = idem_testkit::PgDatabase::create("idem_scan").await;
    let store = store_of(&db.url, 2).await;
    store.migrate().await.unwrap();
    sqlx::raw_sql(
        "INSERT INTO idem_keys (tenant_id, operation, idempotency_key, request_hash, state, \
         created_at_ms, updated_at_ms, expires_at_ms) \
         SELECT 't1', 'op', 'k' || n, '\\x00', 'completed', 0, 0, 1 \
         FROM generate_series(1, 5000) AS n; ANALYZE idem_keys",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let engine = Engine::new(store);
    for n in 0..50 {
        let out = super::ok_under(&engine, &format!("fresh-{n}")).await;
        assert!(matches!(out, Ok(Outcome::Executed(_))), "{out:?}");
    }
    drop(engine);
    let mut admin = sqlx::PgConnection::connect(&db.url).await.unwrap();
    // The store's sessions end (their statistics are flushed as they exit).
    let mut others = i64::MAX;
    for _ in 0..100 {
        others = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_one(&mut admin)
        .await
        .unwrap();
        if others == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(others, 0, "the store's sessions ended");
    let (seq, idx): (i64, i64) = sqlx::query_as(
        "SELECT seq_scan, coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = 'idem_keys'",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert!(
        idx >= 50,
        "the 50 completions used the index ({idx} index scans)"
    );
    assert!(
        seq < 5,
        "{seq} sequential scans of the key table for 50 fresh keys"
    );
}

/// Business code that deallocates Idem's prepared statements on the
/// connection it was handed costs at most its own request: a missing
/// record statement fails that request before its `COMMIT` (nothing of it
/// commits), a missing claim statement is prepared again on a new
/// connection, and the keys after it run as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deallocated_statements_cost_at_most_the_request_that_did_it() {
    let db = db().await;
    // One writer, so every key transaction meets what the last one left.
    let engine = Engine::new(store_of(&db.db.url, 1).await);
    let deallocate = |key: &'static str, statement: &'static str| {
        let engine = &engine;
        async move {
            engine
                .execute(
                    &c::scope("t1", key),
                    &c::fingerprint("{}"),
                    &Policy::default(),
                    |tx| {
                        Box::pin(async move {
                            super::insert(&mut *tx, key).await?;
                            sqlx::Executor::execute(&mut **tx, statement).await?;
                            Ok::<_, idem_core::BoxError>(Completion::completed(c::response(
                                201, "{}",
                            )))
                        })
                    },
                )
                .await
        }
    };
    // Its own record statement gone: this request fails, nothing commits.
    let failed = deallocate("dealloc-all", "DEALLOCATE ALL").await;
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(super::count(&db.store).await, 0, "nothing of it committed");
    // Only the claim's statement gone: this request commits, the next
    // claim is prepared again on a new connection.
    let done = deallocate("dealloc-claim", "DEALLOCATE idem_claim").await;
    assert!(matches!(done, Ok(Outcome::Executed(_))), "{done:?}");
    for key in ["after-1", "after-2"] {
        let next = super::ok_under(&engine, key).await;
        assert!(matches!(next, Ok(Outcome::Executed(_))), "{key}: {next:?}");
    }
    // The failed key is free again, and runs once.
    let retry = deallocate("dealloc-all", "SELECT 1").await;
    assert!(matches!(retry, Ok(Outcome::Executed(_))), "{retry:?}");
    assert_eq!(super::count(&db.store).await, 2);
}
