//! The HTTP contract through an axum router, on real SQLite files and a real
//! PostgreSQL server (`cargo xtask test` provides it).
#![allow(clippy::unwrap_used, missing_docs)]

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::BodyExt;
use tower::ServiceExt;

pub async fn send(
    app: &axum::Router,
    key: Option<&str>,
    tenant: &str,
    body: &str,
) -> (StatusCode, axum::http::HeaderMap, Bytes) {
    let mut req = Request::post("/payments")
        .header("content-type", "application/json")
        .header("x-tenant-id", tenant);
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    let res = app
        .clone()
        .oneshot(req.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let (parts, body) = res.into_parts();
    (
        parts.status,
        parts.headers,
        body.collect().await.unwrap().to_bytes(),
    )
}

pub fn problem_type(body: &Bytes) -> String {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap();
    v["type"].as_str().unwrap().to_owned()
}

/// Parses `{"amount": n}`; amounts name what the handler does:
/// 500 → a 5xx (rolled back), 422 → a stored business error, otherwise 201.
pub fn outcome(body: &Bytes, id: String) -> Response {
    let amount = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["amount"].as_i64());
    match amount {
        None => (StatusCode::BAD_REQUEST, "bad json").into_response(),
        Some(500) => (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response(),
        Some(666) => panic!("handler panicked after its insert"),
        Some(422) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            [("content-type", "application/problem+json")],
            r#"{"type":"declined"}"#,
        )
            .into_response(),
        Some(a) => (
            StatusCode::CREATED,
            [
                ("content-type", "application/json"),
                ("location", "/payments/x"),
                ("set-cookie", "session=secret"),
            ],
            format!(r#"{{"id":"{id}","amount":{a}}}"#),
        )
            .into_response(),
    }
}

macro_rules! http_suite {
    ($modname:ident, $tx:ty, $db:ident) => {
        mod $modname {
            use super::*;
            use axum::Extension;
            use axum::routing::post;
            use idem_core::{Operation, Tenant};
            use idem_http::{IdemTx, IdempotencyLayer, RouteConfig, TenantSource};
            use std::sync::atomic::{AtomicU64, Ordering};

            static IDS: AtomicU64 = AtomicU64::new(0);

            fn create(
                Extension(tx): Extension<IdemTx<$tx>>,
                body: Bytes,
            ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response> + Send>> {
                Box::pin(async move {
                    let id = format!("p{}", IDS.fetch_add(1, Ordering::SeqCst));
                    let mut tx = tx.lock().await.unwrap();
                    sqlx::query("INSERT INTO payments (id, amount) VALUES ($1, 1)")
                        .bind(id.clone())
                        .execute(&mut **tx)
                        .await
                        .unwrap();
                    drop(tx);
                    outcome(&body, id)
                })
            }

            async fn app() -> (axum::Router, super::$db::Db) {
                let db = super::$db::setup().await;
                let mut config = RouteConfig::required(
                    Operation::new("payments.create").unwrap(),
                    TenantSource::TrustedHeader {
                        name: "x-tenant-id".parse().unwrap(),
                        default: Some(Tenant::new("default").unwrap()),
                    },
                );
                config.max_request_bytes = 1024;
                let router = axum::Router::new().route(
                    "/payments",
                    post(create).layer(IdempotencyLayer::new(db.store.clone(), config)),
                );
                (router, db)
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn retry_replays_stored_response_with_one_effect() {
                let (app, db) = app().await;
                let (s1, h1, b1) = send(&app, Some("k1"), "t", r#"{"amount":10}"#).await;
                assert_eq!(s1, StatusCode::CREATED);
                assert!(h1.get("idempotent-replayed").is_none());
                let (s2, h2, b2) = send(&app, Some("\"k1\""), "t", r#"{ "amount": 10 }"#).await;
                assert_eq!(s2, StatusCode::CREATED);
                assert_eq!(b2, b1, "replay must return the same body bytes");
                assert_eq!(h2.get("idempotent-replayed").unwrap(), "true");
                assert_eq!(h2.get("location").unwrap(), "/payments/x");
                assert_eq!(h2.get("content-type").unwrap(), "application/json");
                assert!(
                    h2.get("set-cookie").is_none(),
                    "Set-Cookie must never be replayed"
                );
                assert_eq!(db.count().await, 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn different_body_same_key_is_422_and_runs_nothing() {
                let (app, db) = app().await;
                let (_, _, b1) = send(&app, Some("k2"), "t", r#"{"amount":10}"#).await;
                let (s, h, b) = send(&app, Some("k2"), "t", r#"{"amount":11}"#).await;
                assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
                assert_eq!(h.get("content-type").unwrap(), "application/problem+json");
                assert_eq!(
                    problem_type(&b),
                    "https://idem.dev/problems/idempotency-key-reused"
                );
                assert_eq!(db.count().await, 1);
                let (_, _, b3) = send(&app, Some("k2"), "t", r#"{"amount":10}"#).await;
                assert_eq!(b3, b1, "the stored record is unchanged by the mismatch");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn missing_and_malformed_keys_are_400() {
                let (app, db) = app().await;
                let (s, _, b) = send(&app, None, "t", r#"{"amount":10}"#).await;
                assert_eq!(s, StatusCode::BAD_REQUEST);
                assert_eq!(
                    problem_type(&b),
                    "https://idem.dev/problems/missing-idempotency-key"
                );
                let long = "x".repeat(256);
                for bad in ["", "a b", "\"open", long.as_str()] {
                    let (s, _, b) = send(&app, Some(bad), "t", r#"{"amount":10}"#).await;
                    assert_eq!(s, StatusCode::BAD_REQUEST, "key {bad:?}");
                    assert_eq!(
                        problem_type(&b),
                        "https://idem.dev/problems/malformed-idempotency-key"
                    );
                }
                assert_eq!(db.count().await, 0, "nothing executed");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn same_key_in_two_tenants_is_two_payments() {
                let (app, db) = app().await;
                let (_, _, a) = send(&app, Some("shared"), "alpha", r#"{"amount":10}"#).await;
                let (_, h, b) = send(&app, Some("shared"), "beta", r#"{"amount":10}"#).await;
                assert!(
                    h.get("idempotent-replayed").is_none(),
                    "no cross-tenant replay"
                );
                assert_ne!(a, b);
                assert_eq!(db.count().await, 2);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn server_error_rolls_back_key_and_mutation() {
                let (app, db) = app().await;
                let (s, _, _) = send(&app, Some("k5"), "t", r#"{"amount":500}"#).await;
                assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
                assert_eq!(db.count().await, 0, "the payment rolled back with the key");
                let (s, h, _) = send(&app, Some("k5"), "t", r#"{"amount":500}"#).await;
                assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
                assert!(
                    h.get("idempotent-replayed").is_none(),
                    "a 5xx is re-executed, not replayed"
                );
                assert_eq!(db.count().await, 0);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn panic_in_handler_rolls_back_and_retry_executes_once() {
                let (app, db) = app().await;
                let a = app.clone();
                let joined = tokio::spawn(async move {
                    send(&a, Some("k-panic"), "t", r#"{"amount":666}"#).await
                })
                .await;
                assert!(
                    joined.unwrap_err().is_panic(),
                    "the panic propagates to the caller"
                );
                assert_eq!(
                    db.count().await,
                    0,
                    "the insert before the panic rolled back"
                );
                let (s, h, _) = send(
                    &app,
                    Some("k-panic"),
                    "t",
                    r#"{"amount":666}"#.replace("666", "7").as_str(),
                )
                .await;
                // Had the claim survived the panic this would be a 422 mismatch.
                assert_eq!(
                    s,
                    StatusCode::CREATED,
                    "the key was rolled back with the panic"
                );
                assert!(h.get("idempotent-replayed").is_none());
                assert_eq!(db.count().await, 1, "the retry executed once");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn business_422_is_stored_and_replayed() {
                let (app, db) = app().await;
                let (s1, _, b1) = send(&app, Some("k6"), "t", r#"{"amount":422}"#).await;
                let (s2, h2, b2) = send(&app, Some("k6"), "t", r#"{"amount":422}"#).await;
                assert_eq!(
                    (s1, s2),
                    (
                        StatusCode::UNPROCESSABLE_ENTITY,
                        StatusCode::UNPROCESSABLE_ENTITY
                    )
                );
                assert_eq!(b1, b2);
                assert_eq!(h2.get("idempotent-replayed").unwrap(), "true");
                assert_eq!(db.count().await, 1, "the failed outcome committed once");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn validation_400_is_not_stored() {
                let (app, db) = app().await;
                let (s, _, _) = send(&app, Some("k7"), "t", "{not json").await;
                assert_eq!(s, StatusCode::BAD_REQUEST);
                assert_eq!(db.count().await, 0);
                let (s, h, _) = send(&app, Some("k7"), "t", r#"{"amount":3}"#).await;
                assert_eq!(
                    s,
                    StatusCode::CREATED,
                    "a corrected retry with the same key executes"
                );
                assert!(h.get("idempotent-replayed").is_none());
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn oversized_body_is_413_and_stores_nothing() {
                let (app, db) = app().await;
                let big = format!(r#"{{"amount":1,"pad":"{}"}}"#, "x".repeat(2048));
                let (s, _, b) = send(&app, Some("k8"), "t", &big).await;
                assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
                assert_eq!(problem_type(&b), "https://idem.dev/problems/body-too-large");
                assert_eq!(db.count().await, 0);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn fifty_concurrent_requests_make_one_payment() {
                let (app, db) = app().await;
                let mut tasks = Vec::new();
                for _ in 0..50 {
                    let app = app.clone();
                    tasks.push(tokio::spawn(async move {
                        send(&app, Some("race"), "t", r#"{"amount":9}"#).await
                    }));
                }
                let mut bodies = std::collections::HashSet::new();
                for t in tasks {
                    let (s, _, b) = t.await.unwrap();
                    assert!(!s.is_server_error(), "never a 5xx, got {s}");
                    if s == StatusCode::CREATED {
                        bodies.insert(b);
                    } else {
                        assert_eq!(s, StatusCode::CONFLICT);
                    }
                }
                assert_eq!(bodies.len(), 1, "every 201 is the same response");
                assert_eq!(db.count().await, 1, "exactly one payment");
            }
        }
    };
}

mod sqlite_db {
    use idem_sqlite::{SqliteConfig, SqliteStore};
    pub struct Db {
        pub store: SqliteStore,
        dir: std::path::PathBuf,
    }
    impl Drop for Db {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
    impl Db {
        pub async fn count(&self) -> i64 {
            sqlx::query_scalar("SELECT count(*) FROM payments")
                .fetch_one(self.store.pool())
                .await
                .unwrap()
        }
    }
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    pub async fn setup() -> Db {
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("idem-http-it-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let store = SqliteStore::connect(
            &format!("sqlite://{}", dir.join("t.db").display()),
            SqliteConfig::default(),
        )
        .await
        .unwrap();
        store.migrate().await.unwrap();
        sqlx::raw_sql("CREATE TABLE payments (id TEXT PRIMARY KEY, amount INTEGER NOT NULL)")
            .execute(store.pool())
            .await
            .unwrap();
        Db { store, dir }
    }
}

mod pg_db {
    use idem_postgres::{PgConfig, PgStore};
    use sqlx::Connection;
    pub struct Db {
        pub store: PgStore,
    }
    impl Db {
        pub async fn count(&self) -> i64 {
            sqlx::query_scalar("SELECT count(*) FROM payments")
                .fetch_one(self.store.pool())
                .await
                .unwrap()
        }
    }
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    pub async fn setup() -> Db {
        let admin = std::env::var("IDEM_TEST_POSTGRES_URL").unwrap_or_else(|_| {
            panic!("IDEM_TEST_POSTGRES_URL is not set: run the suite with `cargo xtask test`")
        });
        let name = format!(
            "idem_http_{}_{}",
            std::process::id(),
            SEQ.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        );
        let mut conn = sqlx::PgConnection::connect(&admin).await.unwrap();
        sqlx::raw_sql(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .unwrap();
        let (base, _) = admin.rsplit_once('/').unwrap();
        let store = PgStore::connect(
            &format!("{base}/{name}"),
            PgConfig {
                max_connections: 60,
                ..PgConfig::default()
            },
        )
        .await
        .unwrap();
        store.migrate().await.unwrap();
        sqlx::raw_sql("CREATE TABLE payments (id TEXT PRIMARY KEY, amount BIGINT NOT NULL)")
            .execute(store.pool())
            .await
            .unwrap();
        Db { store }
    }
}

http_suite!(sqlite, idem_sqlite::SqliteTx, sqlite_db);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locked_database_is_503_with_retry_after_and_nothing_written() {
    use axum::Extension;
    use idem_core::{Operation, Tenant};
    use idem_http::{IdemTx, IdempotencyLayer, RouteConfig, TenantSource};
    use idem_sqlite::{SqliteConfig, SqliteStore, SqliteTx};
    use sqlx::Connection;
    let dir = std::env::temp_dir().join(format!("idem-http-locked-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("t.db").display());
    let config = SqliteConfig {
        busy_timeout: std::time::Duration::from_millis(200),
        ..SqliteConfig::default()
    };
    let store = SqliteStore::connect(&url, config).await.unwrap();
    store.migrate().await.unwrap();
    sqlx::raw_sql("CREATE TABLE payments (id TEXT PRIMARY KEY, amount INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    async fn create(Extension(tx): Extension<IdemTx<SqliteTx>>) -> StatusCode {
        let mut tx = tx.lock().await.unwrap();
        sqlx::query("INSERT INTO payments VALUES ('p', 1)")
            .execute(&mut **tx)
            .await
            .unwrap();
        StatusCode::CREATED
    }
    let cfg = RouteConfig::required(
        Operation::new("payments.create").unwrap(),
        TenantSource::Static(Tenant::new("t").unwrap()),
    );
    let app = axum::Router::new().route(
        "/payments",
        axum::routing::post(create).layer(IdempotencyLayer::new(store.clone(), cfg)),
    );
    // Another process-like holder of the write lock.
    let mut other = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::raw_sql("BEGIN EXCLUSIVE")
        .execute(&mut other)
        .await
        .unwrap();
    let res = app
        .clone()
        .oneshot(
            Request::post("/payments")
                .header("idempotency-key", "k")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().get("retry-after").is_some());
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        problem_type(&body),
        "https://idem.dev/problems/store-unavailable"
    );
    sqlx::raw_sql("ROLLBACK").execute(&mut other).await.unwrap();
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_keys")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(n, 0, "nothing half-written");
    // Once the lock is gone, the retry executes.
    let res = app
        .oneshot(
            Request::post("/payments")
                .header("idempotency-key", "k")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let _ = std::fs::remove_dir_all(&dir);
}
http_suite!(postgres, idem_postgres::PgTx, pg_db);
