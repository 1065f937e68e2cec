//! Integration tests on a real PostgreSQL server, one fresh database per test.
//! `cargo xtask test` starts the server and sets `IDEM_TEST_POSTGRES_URL`.
#![allow(clippy::unwrap_used, missing_docs)]

use idem_conformance as c;
use idem_core::{BoxError, BoxFuture, Completion, Engine, Outcome, Policy};
use idem_postgres::{PgConfig, PgStore, PgTx};
use idem_testkit::{PgDatabase, postgres_admin_url};
use sqlx::Connection;

mod clock;
mod session;

struct TestDb {
    db: PgDatabase,
    store: PgStore,
}

async fn db() -> TestDb {
    let db = PgDatabase::create("idem_it").await;
    let config = PgConfig {
        max_connections: 60,
        ..PgConfig::default()
    };
    let store = PgStore::connect(&db.url, config).await.unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap(); // migrations are idempotent
    sqlx::raw_sql("CREATE TABLE payments (id TEXT PRIMARY KEY, amount BIGINT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    TestDb { db, store }
}

fn insert<'t>(tx: &'t mut PgTx, id: &'static str) -> BoxFuture<'t, Result<(), BoxError>> {
    Box::pin(async move {
        sqlx::query("INSERT INTO payments (id, amount) VALUES ($1, 5)")
            .bind(id)
            .execute(&mut **tx)
            .await?;
        Ok(())
    })
}

/// Removes the key record `key` under the claim (the record is no longer
/// pending when Idem stores the outcome).
fn forget<'t>(tx: &'t mut PgTx, key: &'static str) -> BoxFuture<'t, Result<(), BoxError>> {
    Box::pin(async move {
        sqlx::query("DELETE FROM idem_keys WHERE idempotency_key = $1")
            .bind(key)
            .execute(&mut **tx)
            .await?;
        Ok(())
    })
}

fn enqueue<'t>(
    tx: &'t mut PgTx,
    message: &'t idem_core::outbox::OutboxMessage,
    now_ms: i64,
) -> BoxFuture<'t, Result<i64, idem_core::StoreError>> {
    Box::pin(idem_postgres::outbox::enqueue(tx, message, now_ms))
}

fn count(store: &PgStore) -> BoxFuture<'_, i64> {
    Box::pin(async move {
        sqlx::query_scalar("SELECT count(*) FROM payments")
            .fetch_one(store.pool())
            .await
            .unwrap()
    })
}

macro_rules! conformance {
    ($($name:ident $(, $arg:expr)*;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let db = db().await;
            c::$name(db.store.clone() $(, $arg)*).await;
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
    business_write_commits_with_the_key, insert, count;
    values_in_the_key_messages_round_trip_exactly;
    a_record_no_longer_pending_commits_nothing, insert, forget, count;
    large_answers_are_stored_exactly, insert, forget, count;
    optimistic_race_commits_one_outcome, insert, count, 16;
    optimistic_losers_failing_on_the_winners_effect_replay_it, insert, count, 8;
    optimistic_claims_replay_mismatch_and_expire, insert, count;
    replays_are_answered_without_a_transaction;
    outbox_commits_with_the_transaction, enqueue;
    outbox_keeps_order_per_key, enqueue;
    outbox_leases_expire_and_release, enqueue;
    outbox_failures_back_off_then_die, enqueue;
    outbox_delays_and_purges, enqueue;
    inbox_records_once_per_subscriber;
    inbox_concurrent_duplicate_waits_then_skips;
    inbox_gc_deletes_expired_records;
    positions_commit_with_the_transaction_and_never_move_back;
    webhook_receipts_are_stored_once;
    webhook_claims_keep_entity_order;
    webhook_failures_replay_and_gc;
    webhook_content_dedupe;
    cancelled_calls_leave_connections_clean;
    the_namespace_is_drawn_once;
    leased_claims_commit_and_only_the_holder_writes;
    a_released_lease_frees_the_key;
    a_holder_ends_its_lease_when_the_outcome_is_unknown;
    an_abandoned_lease_is_taken_over_by_one, 20;
    operators_resolve_only_abandoned_leases;
    leased_and_transactional_claims_share_keys;
    an_expired_leased_record_is_claimed_afresh;
    a_pending_unknown_is_held_from_its_claim;
    runs_are_created_with_their_key;
    fenced_writes_land_only_with_the_current_fence;
    takeover_needs_an_expired_lease;
    claims_of_due_runs_are_never_shared, 40;
    final_runs_expire_with_their_key;
    send_once_ledger_holds_one_sender;
    tasks_are_created_once_per_key;
    cursors_move_only_from_where_they_are;
    claims_are_fenced_and_taken_over_after_the_lease;
    only_the_live_holder_settles;
    actions_happen_once;
    an_action_goes_once_per_fence_whoever_asks;
    operators_steer_what_workers_cannot;
    concurrent_claims_never_share_a_task, 8;
    runs_are_listed_by_state;
    runs_are_counted_by_state;
    webhook_receipts_are_counted_by_endpoint_and_state;
    admin_key_pages_and_literal_prefixes;
    admin_release_only_stuck_leased_records;
    admin_outbox_pages_and_requeue, enqueue;
    admin_audit_rows_commit_with_their_transaction;
    admin_runs_receipts_and_inbox;
    patterns_hold_on_a_real_table;
    a_pattern_read_of_the_wrong_type_is_a_database_error;
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
async fn round_trips_per_path_are_pinned() {
    let db = db().await;
    let (proxy, count) = round_trips::proxy(idem_testkit::url_addr(&db.db.url)).await;
    let store = store_of(&idem_testkit::url_via(&db.db.url, proxy), 1).await;
    let engine = Engine::new(store);
    let fp = c::fingerprint("{}");
    let run = |key: String, policy: Policy| {
        let engine = engine.clone();
        async move {
            let out = engine
                .execute(&c::scope("t1", &key), &fp, &policy, |tx| {
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
    let pessimistic = Policy::default();
    let optimistic = Policy::default().optimistic();
    // Warm up: the connection is open and every statement is prepared.
    assert!(run("warm-p".into(), pessimistic).await);
    assert!(!run("warm-p".into(), pessimistic).await);
    assert!(run("warm-o".into(), optimistic).await);
    assert!(!run("warm-o".into(), optimistic).await);
    let cases = [
        (
            "k-p",
            pessimistic,
            true,
            (4, 0),
            "pessimistic fresh: read, BEGIN + claim INSERT, business INSERT, UPDATE + COMMIT",
        ),
        ("k-p", pessimistic, false, (1, 0), "replay: the read alone"),
        (
            "k-o",
            optimistic,
            true,
            (4, 0),
            "optimistic fresh: read, BEGIN, business INSERT, record INSERT + COMMIT",
        ),
        (
            "k-o",
            optimistic,
            false,
            (1, 0),
            "optimistic replay: the read alone",
        ),
    ];
    for (key, policy, fresh, expected, what) in cases {
        count.settle_and_reset().await;
        assert_eq!(run(key.into(), policy).await, fresh, "{what}");
        assert_eq!(
            count.settle_and_read().await,
            expected,
            "(messages, pings) for {what}; the read runs on a reader connection, the \
             transaction on a writer, both kept without a ping; Idem's statements go \
             with BEGIN and COMMIT in one message each"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_killed_while_idle_is_replaced_without_an_error() {
    let db = db().await;
    let store = store_of(&db.db.url, 1).await;
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
    let mut admin = sqlx::PgConnection::connect(&postgres_admin_url())
        .await
        .unwrap();
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = $1 AND pid <> pg_backend_pid()) t",
    )
    .bind(&db.db.name)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert!(
        killed >= 2,
        "the pool's idle connection and the claims' reader were terminated, got {killed}"
    );
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(
        matches!(run("after").await, Ok(Outcome::Executed(_))),
        "the dead connections are replaced at the read and at BEGIN, invisibly to the caller"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_values_are_invalid_value_and_sessions_carry_the_timeouts() {
    let db = db().await;
    let map = |e: sqlx::Error| idem_postgres::map_err(e);
    // A NUL in text (SQLSTATE 22021).
    let e = sqlx::query("SELECT $1::text")
        .bind("a\0b")
        .execute(db.store.pool())
        .await
        .unwrap_err();
    assert!(matches!(map(e), idem_core::StoreError::InvalidValue { .. }));
    // A value too large for a btree index (54000).
    sqlx::raw_sql("CREATE TABLE wide (v TEXT PRIMARY KEY)")
        .execute(db.store.pool())
        .await
        .unwrap();
    let e = sqlx::raw_sql(
        "INSERT INTO wide SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 400)",
    )
    .execute(db.store.pool())
    .await
    .unwrap_err();
    let mapped = map(e);
    assert!(
        matches!(mapped, idem_core::StoreError::InvalidValue { .. }),
        "{mapped:?}"
    );
    assert!(!mapped.retryable());
    let (statement, idle): (String, String) = sqlx::query_as(
        "SELECT current_setting('statement_timeout'), \
                current_setting('idle_in_transaction_session_timeout')",
    )
    .fetch_one(db.store.pool())
    .await
    .unwrap();
    assert_eq!((statement.as_str(), idle.as_str()), ("10s", "1min"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_pool_settings_are_refused_before_connecting() {
    let bad = |tune: fn(&mut PgConfig)| {
        let mut c = PgConfig::default();
        tune(&mut c);
        c.validate().unwrap_err().to_string()
    };
    assert!(
        bad(|c| c.statement_timeout = std::time::Duration::from_secs(2))
            .contains("longer than lock_timeout")
    );
    assert!(bad(|c| c.statement_timeout = std::time::Duration::ZERO).contains("statement_timeout"));
    assert!(bad(|c| c.max_connections = 0).contains("max_connections"));
    assert!(
        bad(|c| c.idle_in_transaction_timeout = std::time::Duration::ZERO)
            .contains("idle_in_transaction_timeout")
    );
    assert!(PgConfig::default().validate().is_ok());
    let config = PgConfig {
        statement_timeout: std::time::Duration::from_secs(1),
        ..PgConfig::default()
    };
    // Nothing listens on port 1: a validation error, not a connection error.
    let e = PgStore::connect("postgres://nobody@127.0.0.1:1/x", config)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("key store error"), "{e}");
    let source = std::error::Error::source(&e).unwrap().to_string();
    assert!(source.contains("statement_timeout"), "{source}");
}

/// A client that claims a key and then goes silent inside its transaction
/// would hold the key's row lock forever; the server ends its session after
/// `idle_in_transaction_session_timeout`, the key is free for the retry, and
/// the silent client's late completion fails instead of committing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_silent_inside_its_transaction_frees_the_key() {
    let db = db().await;
    let store = PgStore::connect(
        &db.db.url,
        PgConfig {
            idle_in_transaction_timeout: std::time::Duration::from_secs(1),
            ..PgConfig::default()
        },
    )
    .await
    .unwrap();
    let engine = Engine::new(store);
    let scope = c::scope("t1", "k-silent");
    let fp = c::fingerprint("{}");
    let idem_core::Begun::Fresh(first) =
        engine.begin(&scope, &fp, &Policy::default()).await.unwrap()
    else {
        panic!("a fresh key");
    };
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    let second = engine.begin(&scope, &fp, &Policy::default()).await.unwrap();
    assert!(
        matches!(second, idem_core::Begun::Fresh(_)),
        "the key is free again"
    );
    let late = engine
        .finish(first, &Completion::completed(c::response(201, "{}")))
        .await
        .unwrap_err();
    assert!(late.retryable(), "{late:?}");
    assert!(
        !matches!(
            late,
            idem_core::Error::Store(idem_core::StoreError::OutcomeUnknown { .. })
        ),
        "the update failed before any COMMIT was sent: {late:?}"
    );
}

/// A webhook receipt is one autocommit statement: when its answer is lost
/// the receipt may well be stored, so the store says the outcome is unknown,
/// never that nothing was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_to_an_autocommit_write_is_outcome_unknown() {
    let db = db().await;
    let proxy = idem_testkit::Proxy::start(idem_testkit::url_addr(&db.db.url)).await;
    let store = PgStore::connect(
        &idem_testkit::url_via(&db.db.url, proxy.addr),
        PgConfig::default(),
    )
    .await
    .unwrap();
    let r = idem_core::webhooks::NewReceipt {
        endpoint: "github".into(),
        delivery_id: "lost-1".into(),
        event_type: None,
        headers: vec![],
        body: b"{}".to_vec(),
        entity_id: None,
        entity_version: None,
        content_sha256: None,
    };
    use idem_core::webhooks::WebhookStore;
    // The delivery id travels in the Bind message, sent with the Execute.
    proxy.cut_after_next(b"lost-1");
    let e = store.accept(&r, 1, 1_000_000).await.unwrap_err();
    assert!(
        matches!(e, idem_core::StoreError::OutcomeUnknown { .. }),
        "{e:?}"
    );
    assert!(e.retryable());
    // It was written: the retry is a duplicate.
    assert!(
        db.store
            .get_receipt("github", "lost-1")
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(
        store.accept(&r, 2, 1_000_000).await.unwrap(),
        idem_core::webhooks::Accepted::Duplicate
    );
}

/// A store on `url` with `max` connections (and as many readers).
async fn store_of(url: &str, max: u32) -> PgStore {
    PgStore::connect(
        url,
        PgConfig {
            max_connections: max,
            ..PgConfig::default()
        },
    )
    .await
    .unwrap()
}

/// The sessions open in `db`'s database, less `others`.
async fn sessions(db: &str, others: i64) -> i64 {
    let mut admin = sqlx::PgConnection::connect(&postgres_admin_url())
        .await
        .unwrap();
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = $1")
        .bind(db)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    n - others
}

/// Runs an operation that answers 201 under `key`, pessimistically.
async fn ok_under(
    engine: &Engine<PgStore>,
    key: &str,
) -> Result<Outcome<Completion>, idem_core::Error<sqlx::Error>> {
    engine
        .execute(
            &c::scope("t1", key),
            &c::fingerprint("{}"),
            &Policy::default(),
            |_| Box::pin(async move { Ok(Completion::completed(c::response(201, "{}"))) }),
        )
        .await
}

/// Opens `n` sessions on the store's readers and pool at once (each request
/// waits behind a table lock), then lets them all go idle.
async fn open_idle_sessions(db: &TestDb, engine: &Engine<PgStore>, n: usize) {
    let mut locker = sqlx::PgConnection::connect(&db.db.url).await.unwrap();
    sqlx::raw_sql("BEGIN; LOCK TABLE idem_keys IN ACCESS EXCLUSIVE MODE")
        .execute(&mut locker)
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..n {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            let key = format!("warm-{i}");
            ok_under(&engine, &key).await.unwrap();
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    sqlx::raw_sql("COMMIT").execute(&mut locker).await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_idle_session_ended_at_once_is_replaced_without_an_error() {
    let db = db().await;
    let max = 6;
    let engine = Engine::new(store_of(&db.db.url, max).await);
    open_idle_sessions(&db, &engine, max as usize).await;
    assert!(
        sessions(&db.db.name, 0).await >= 2 * i64::from(max) - 1,
        "the readers and the pool both hold about {max} idle sessions"
    );
    // A restart, a failover or a proxy's idle limit ends them all at once.
    let mut admin = sqlx::PgConnection::connect(&postgres_admin_url())
        .await
        .unwrap();
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = $1 AND pid <> pg_backend_pid()",
    )
    .bind(&db.db.name)
    .execute(&mut admin)
    .await
    .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let ok = |key: String| {
        let engine = engine.clone();
        async move { ok_under(&engine, &key).await }
    };
    for i in 0..max {
        // A replay (the read) and a fresh key (the read, then BEGIN on the pool).
        let replay = ok(format!("warm-{i}")).await;
        assert!(
            matches!(replay, Ok(Outcome::Replayed(_))),
            "replay {i}: {replay:?}"
        );
        let fresh = ok(format!("after-{i}")).await;
        assert!(
            matches!(fresh, Ok(Outcome::Executed(_))),
            "fresh {i}: {fresh:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_reads_never_hold_more_sessions_than_the_bound() {
    let db = db().await;
    let max = 2;
    let engine = Engine::new(store_of(&db.db.url, max).await);
    // A table lock held for a while (VACUUM FULL, a migration, REINDEX …)
    // while clients with a short timeout keep retrying.
    let mut locker = sqlx::PgConnection::connect(&db.db.url).await.unwrap();
    sqlx::raw_sql("BEGIN; LOCK TABLE idem_keys IN ACCESS EXCLUSIVE MODE")
        .execute(&mut locker)
        .await
        .unwrap();
    // The fixture's pool, this store's first pooled session, the locker.
    let before = sessions(&db.db.name, 0).await;
    let fp = c::fingerprint("{}");
    let mut peak = 0;
    for _ in 0..15 {
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let (engine, fp) = (engine.clone(), fp);
            tasks.push(tokio::spawn(async move {
                let give_up = std::time::Duration::from_millis(50);
                let _ = tokio::time::timeout(
                    give_up,
                    engine.begin(&c::scope("t1", "k"), &fp, &Policy::default()),
                )
                .await;
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        peak = peak.max(sessions(&db.db.name, before).await);
    }
    sqlx::raw_sql("COMMIT").execute(&mut locker).await.unwrap();
    assert!(
        (1..=i64::from(max)).contains(&peak),
        "cancelled reads held {peak} sessions; the reader slots are {max}"
    );
}

/// Business code that opens a transaction inside Idem's gets a savepoint,
/// as inside a sqlx `Transaction`: its rollback undoes only its part, its
/// commit commits nothing until Idem's COMMIT, and a failing operation
/// undoes everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_inside_the_key_transaction_is_a_savepoint() {
    let db = db().await;
    let engine = Engine::new(db.store.clone());
    let fp = c::fingerprint("{}");
    let insert =
        |id: &'static str| sqlx::query("INSERT INTO payments (id, amount) VALUES ($1, 1)").bind(id);
    let out = engine
        .execute(&c::scope("t1", "nested"), &fp, &Policy::default(), |tx| {
            Box::pin(async move {
                insert("outer").execute(&mut **tx).await?;
                let mut inner = tx.begin().await?;
                insert("undone").execute(&mut *inner).await?;
                inner.rollback().await?;
                let mut inner = tx.begin().await?;
                insert("kept").execute(&mut *inner).await?;
                inner.commit().await?;
                // A savepoint left open is rolled back (sqlx queues it).
                let mut inner = tx.begin().await?;
                insert("dropped").execute(&mut *inner).await?;
                drop(inner);
                Ok::<_, sqlx::Error>(Completion::completed(c::response(201, "{}")))
            })
        })
        .await
        .unwrap();
    assert!(matches!(out, Outcome::Executed(_)));
    let failed = engine
        .execute(
            &c::scope("t1", "nested-fails"),
            &fp,
            &Policy::default(),
            |tx| {
                Box::pin(async move {
                    let mut inner = tx.begin().await?;
                    insert("inner-of-failed").execute(&mut *inner).await?;
                    inner.commit().await?;
                    Err::<Completion, _>(sqlx::Error::Protocol("the operation fails".into()))
                })
            },
        )
        .await;
    assert!(failed.is_err());
    let ids: Vec<String> = sqlx::query_scalar("SELECT id FROM payments ORDER BY id")
        .fetch_all(db.store.pool())
        .await
        .unwrap();
    assert_eq!(ids, ["kept", "outer"]);
    let record = idem_core::KeyStore::fetch(&db.store, &c::scope("t1", "nested-fails"))
        .await
        .unwrap();
    assert!(record.is_none());
}

/// A dropped key transaction rolls back (conformance), on a store with one
/// writer: the next claim gets the same connection, cleanly, after the
/// rollback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_key_transaction_rolls_back_and_its_connection_is_reused() {
    let db = db().await;
    c::a_dropped_key_transaction_rolls_back(store_of(&db.db.url, 1).await, insert, count).await;
}
