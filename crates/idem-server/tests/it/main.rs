//! Drills against the demo API served on a real socket (127.0.0.1:0), on a
//! real SQLite file and a real PostgreSQL database.
#![allow(clippy::unwrap_used, missing_docs)]

use std::net::SocketAddr;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub struct Reply {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
    pub fn replayed(&self) -> bool {
        self.head
            .to_ascii_lowercase()
            .contains("\r\nidempotent-replayed: true")
    }
}

fn request(method: &str, path: &str, key: Option<&str>, body: &str) -> String {
    let key = key
        .map(|k| format!("Idempotency-Key: {k}\r\n"))
        .unwrap_or_default();
    format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Type: application/json\r\n\
         {key}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

pub async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> Reply {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request(method, path, key, body).as_bytes())
        .await
        .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let status = head[9..12].parse().unwrap();
    Reply {
        status,
        head,
        body: raw[split + 4..].to_vec(),
    }
}

/// Sends a request and closes the connection without reading the response.
pub async fn send_and_vanish(addr: SocketAddr, path: &str, key: &str, body: &str) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request("POST", path, Some(key), body).as_bytes())
        .await
        .unwrap();
    s.shutdown().await.unwrap();
    drop(s);
}

pub async fn serve(router: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

pub async fn payments_of(addr: SocketAddr, customer: &str) -> Vec<Value> {
    let r = call(
        addr,
        "GET",
        &format!("/v1/payments?customer={customer}"),
        None,
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    r.json()["data"].as_array().unwrap().clone()
}

const PAY: &str = r#"{"amount":1000,"currency":"EUR","customer":"cus_1"}"#;

macro_rules! drills {
    ($modname:ident, $setup:path) => {
        mod $modname {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn drill1_lost_response_then_retry_gets_stored_response_one_payment() {
                let (addr, _db) = $setup().await;
                send_and_vanish(addr, "/v1/payments", "lost-1", PAY).await;
                let first = call(addr, "POST", "/v1/payments", Some("lost-1"), PAY).await;
                assert_eq!(first.status, 201);
                let again = call(addr, "POST", "/v1/payments", Some("lost-1"), PAY).await;
                assert_eq!(again.status, 201);
                assert!(again.replayed());
                assert_eq!(again.body, first.body);
                assert_eq!(
                    payments_of(addr, "cus_1").await.len(),
                    1,
                    "exactly one payment"
                );
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn drill9_replay_after_refund_returns_the_original_body() {
                let (addr, _db) = $setup().await;
                let created = call(addr, "POST", "/v1/payments", Some("c-9"), PAY).await;
                let id = created.json()["id"].as_str().unwrap().to_owned();
                assert!(
                    created
                        .head
                        .to_ascii_lowercase()
                        .contains(&format!("location: /v1/payments/{id}"))
                );
                let refund = call(
                    addr,
                    "POST",
                    &format!("/v1/payments/{id}/refunds"),
                    Some("r-9"),
                    r#"{"amount":300}"#,
                )
                .await;
                assert_eq!(refund.status, 201);
                let now = call(addr, "GET", &format!("/v1/payments/{id}"), None, "").await;
                assert_eq!(now.json()["amount_refunded"], 300);
                assert_eq!(now.json()["status"], "partially_refunded");
                let replay = call(addr, "POST", "/v1/payments", Some("c-9"), PAY).await;
                assert!(replay.replayed());
                assert_eq!(
                    replay.body, created.body,
                    "the replay is the original response"
                );
                assert_eq!(replay.json()["amount_refunded"], 0);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn over_refund_422_is_stored_and_replayed() {
                let (addr, _db) = $setup().await;
                let id = call(addr, "POST", "/v1/payments", Some("c-r"), PAY)
                    .await
                    .json()["id"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                let path = format!("/v1/payments/{id}/refunds");
                let first = call(addr, "POST", &path, Some("r-big"), r#"{"amount":5000}"#).await;
                assert_eq!(first.status, 422);
                assert_eq!(
                    first.json()["type"],
                    "https://idem.dev/problems/refund-exceeds-payment"
                );
                let again = call(addr, "POST", &path, Some("r-big"), r#"{"amount":5000}"#).await;
                assert_eq!(again.status, 422);
                assert!(again.replayed());
                assert_eq!(again.body, first.body);
                // The same refund key sent to another payment is a mismatch, not a replay.
                let other = call(addr, "POST", "/v1/payments", Some("c-r2"), PAY)
                    .await
                    .json()["id"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                let cross = call(
                    addr,
                    "POST",
                    &format!("/v1/payments/{other}/refunds"),
                    Some("r-big"),
                    r#"{"amount":5000}"#,
                )
                .await;
                assert_eq!(cross.status, 422);
                assert_eq!(
                    cross.json()["type"],
                    "https://idem.dev/problems/idempotency-key-reused"
                );
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn drill8_new_key_same_reference_finds_the_first_payment() {
                // What a late retry after the key expired looks like: a fresh key
                // record, stopped by the business natural key.
                let (addr, _db) = $setup().await;
                let body =
                    r#"{"amount":1000,"currency":"EUR","customer":"cus_8","reference":"order-8"}"#;
                let first = call(addr, "POST", "/v1/payments", Some("k-old"), body).await;
                assert_eq!(first.status, 201);
                let late = call(addr, "POST", "/v1/payments", Some("k-new"), body).await;
                assert_eq!(late.status, 200, "the existing payment is returned");
                assert_eq!(late.json()["id"], first.json()["id"]);
                let changed =
                    r#"{"amount":2000,"currency":"EUR","customer":"cus_8","reference":"order-8"}"#;
                let conflict = call(addr, "POST", "/v1/payments", Some("k-other"), changed).await;
                assert_eq!(conflict.status, 409);
                assert_eq!(
                    conflict.json()["type"],
                    "https://idem.dev/problems/reference-conflict"
                );
                assert_eq!(payments_of(addr, "cus_8").await.len(), 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn invalid_fields_are_400_and_store_nothing() {
                let (addr, _db) = $setup().await;
                for bad in [
                    "{",
                    r#"{"amount":0,"currency":"EUR","customer":"c"}"#,
                    r#"{"amount":1,"currency":"eur","customer":"c"}"#,
                    r#"{"amount":1,"currency":"EUR"}"#,
                ] {
                    let r = call(addr, "POST", "/v1/payments", Some("bad-1"), bad).await;
                    assert_eq!(r.status, 400, "{bad}");
                    assert_eq!(
                        r.json()["type"],
                        "https://idem.dev/problems/invalid-request"
                    );
                }
                // Nothing was stored under the key: a valid request with it executes.
                let ok = call(addr, "POST", "/v1/payments", Some("bad-1"), PAY).await;
                assert_eq!(ok.status, 201);
                assert!(!ok.replayed());
            }
        }
    };
}

mod setup {
    use super::*;
    use idem_postgres::{PgConfig, PgStore};
    use idem_sqlite::{SqliteConfig, SqliteStore};
    use sqlx::Connection;
    use std::sync::atomic::{AtomicU32, Ordering};

    static SEQ: AtomicU32 = AtomicU32::new(0);

    pub struct TempDir(std::path::PathBuf);
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    pub async fn sqlite() -> (SocketAddr, TempDir) {
        let dir = std::env::temp_dir().join(format!(
            "idem-server-it-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let store = SqliteStore::connect(
            &format!("sqlite://{}", dir.join("t.db").display()),
            SqliteConfig::default(),
        )
        .await
        .unwrap();
        store.migrate().await.unwrap();
        idem_sqlite::migrate_component(store.pool(), "demo", idem_server::demo::MIGRATIONS)
            .await
            .unwrap();
        let addr = serve(idem_server::sqlite_demo::router(
            store.clone(),
            store.pool().clone(),
        ))
        .await;
        (addr, TempDir(dir))
    }

    pub async fn postgres() -> (SocketAddr, ()) {
        let admin = std::env::var("IDEM_TEST_POSTGRES_URL").unwrap_or_else(|_| {
            panic!("IDEM_TEST_POSTGRES_URL is not set: run the suite with `cargo xtask test`")
        });
        let name = format!(
            "idem_server_{}_{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let mut conn = sqlx::PgConnection::connect(&admin).await.unwrap();
        sqlx::raw_sql(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .unwrap();
        let (base, _) = admin.rsplit_once('/').unwrap();
        let store = PgStore::connect(&format!("{base}/{name}"), PgConfig::default())
            .await
            .unwrap();
        store.migrate().await.unwrap();
        idem_postgres::migrate_component(store.pool(), "demo", idem_server::demo::MIGRATIONS)
            .await
            .unwrap();
        (
            serve(idem_server::postgres_demo::router(
                store.clone(),
                store.pool().clone(),
            ))
            .await,
            (),
        )
    }
}

drills!(sqlite, setup::sqlite);
drills!(postgres, setup::postgres);
