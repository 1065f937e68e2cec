//! Runs the example binary and checks what it shows: a retried request makes
//! one order and is replayed, a different body under the same key is 422,
//! a body that is not UTF-8 is a 400 problem and no order, a request
//! without credentials is 401.

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::Command;

/// Sends one HTTP/1.1 request and returns (status, whole answer).
async fn post(addr: &str, auth: Option<&str>, key: &str, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let auth = auth
        .map(|a| format!("authorization: {a}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "POST /orders HTTP/1.1\r\nhost: {addr}\r\n{auth}idempotency-key: {key}\r\n\
         content-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(req.as_bytes()).await.expect("write");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("read");
    let status = answer[9..12].parse().expect("status");
    (status, answer.to_ascii_lowercase())
}

#[tokio::test]
async fn retry_replays_one_order_mismatch_is_422_no_credentials_is_401() {
    let dir = std::env::temp_dir().join(format!("example-axum-layer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_example-axum-layer"))
        .env("IDEM_DB", dir.join("orders.db"))
        .env("IDEM_LISTEN", "127.0.0.1:0")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the example");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let line = lines.next_line().await.expect("read").expect("a line");
    let addr = line
        .strip_prefix("listening on ")
        .expect("the address")
        .to_owned();

    let acme = Some("Bearer key-acme");
    let (first, a) = post(&addr, acme, "order-1", "book").await;
    let (retry, b) = post(&addr, acme, "order-1", "book").await;
    assert_eq!((first, retry), (201, 201), "{a}\n{b}");
    assert!(b.contains("idempotent-replayed: true"), "{b}");
    assert!(
        a.ends_with("order 1") && b.ends_with("order 1"),
        "one order: {a}\n{b}"
    );
    let (fresh, c) = post(&addr, acme, "order-2", "pen").await;
    assert_eq!(fresh, 201);
    assert!(c.ends_with("order 2"), "the retry made no row: {c}");

    let (mismatch, d) = post(&addr, acme, "order-1", "lamp").await;
    assert_eq!(mismatch, 422, "{d}");
    assert!(d.contains("idempotency-key-reused"), "{d}");

    // A body that is not UTF-8: problem+json, and no order.
    let mut stream = TcpStream::connect(&addr).await.expect("connect");
    let mut req = format!(
        "POST /orders HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer key-acme\r\n\
         idempotency-key: order-4\r\ncontent-length: 2\r\nconnection: close\r\n\r\n"
    )
    .into_bytes();
    req.extend_from_slice(b"\xff\xfe");
    stream.write_all(&req).await.expect("write");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read");
    let f = String::from_utf8_lossy(&raw).to_ascii_lowercase();
    assert!(f.starts_with("http/1.1 400"), "{f}");
    assert!(f.contains("content-type: application/problem+json"), "{f}");
    assert!(f.contains("invalid-request"), "{f}");
    let (next, g) = post(&addr, acme, "order-5", "cup").await;
    assert_eq!(next, 201);
    assert!(g.ends_with("order 3"), "the bad body made no row: {g}");

    let (anonymous, e) = post(&addr, None, "order-3", "book").await;
    assert_eq!(anonymous, 401, "{e}");
    assert!(e.contains("tenant-unresolved"), "{e}");

    child.kill().await.expect("stop the example");
    let _ = std::fs::remove_dir_all(&dir);
}
