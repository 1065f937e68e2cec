//! Runs the example binary in front of a tiny upstream that counts its
//! calls: a POST retried with the same `Idempotency-Key` reaches the
//! upstream once and the retry is replayed; another key is another call;
//! the app's own route never reaches the upstream.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::{Router, extract::State, http::StatusCode, routing::post};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::Command;

/// Sends one HTTP/1.1 request and returns (status, whole answer, lowercased).
async fn send(
    addr: &str,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let key = key
        .map(|k| format!("idempotency-key: {k}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\n{key}content-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(req.as_bytes()).await.expect("write");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("read");
    let status = answer[9..12].parse().expect("status");
    (status, answer.to_ascii_lowercase())
}

/// The upstream: `POST /payments` makes payment n, counting calls.
async fn upstream() -> (String, Arc<AtomicU64>) {
    let calls = Arc::new(AtomicU64::new(0));
    let app = Router::new()
        .route(
            "/payments",
            post(|State(calls): State<Arc<AtomicU64>>| async move {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                (StatusCode::CREATED, format!("payment {n}"))
            }),
        )
        .with_state(calls.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), calls)
}

#[tokio::test]
async fn a_retried_post_reaches_the_upstream_once() {
    let (upstream_url, calls) = upstream().await;
    let dir = std::env::temp_dir().join(format!("example-gateway-in-axum-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_example-gateway-in-axum"))
        .env("UPSTREAM", &upstream_url)
        .env("IDEM_DB", dir.join("gateway.db"))
        .env("IDEM_LISTEN", "127.0.0.1:0")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the example");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = lines.next_line().await.expect("read").expect("a line");
    let addr = line
        .strip_prefix("listening on ")
        .expect("the address")
        .to_owned();

    let body = r#"{"amount":4200}"#;
    let (first, a) = send(&addr, "POST", "/payments", Some("pay-1"), body).await;
    let (retry, b) = send(&addr, "POST", "/payments", Some("pay-1"), body).await;
    assert_eq!((first, retry), (201, 201), "{a}\n{b}");
    assert!(
        a.ends_with("payment 1") && b.ends_with("payment 1"),
        "{a}\n{b}"
    );
    assert!(b.contains("idempotent-replayed: true"), "{b}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the retry never reached the upstream"
    );

    let (other, c) = send(&addr, "POST", "/payments", Some("pay-2"), body).await;
    assert_eq!(other, 201, "{c}");
    assert!(c.ends_with("payment 2"), "{c}");

    let (health, d) = send(&addr, "GET", "/health", None, "").await;
    assert_eq!(health, 200, "{d}");
    assert!(d.ends_with("ok"), "{d}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "one call per key, none for the app's route"
    );

    child.kill().await.expect("stop the example");
    let _ = std::fs::remove_dir_all(&dir);
}
