//! Runs the example binary and sends it one payment webhook twice, signed by
//! the `standardwebhooks` library (the provider's own, from PyPI): the first
//! is accepted (202), the repeat is a duplicate (200), and the payment is
//! applied once.

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::Command;

/// `whsec_` + base64 of a 24-byte key.
const SECRET: &str = "whsec_aWRlbS13ZWJob29rLXJvdXRlLWV4YW1wbGU=";

/// Sends one HTTP/1.1 request and returns (status, whole answer).
async fn send(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(String, String)],
    body: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let headers: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\n{headers}content-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(req.as_bytes()).await.expect("write");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("read");
    let status = answer[9..12].parse().expect("status");
    (status, answer)
}

/// Headers for `body` signed now by `standardwebhooks` under `msg_id`
/// (the server suite's signer script).
fn sign(msg_id: &str, body: &str) -> Vec<(String, String)> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../crates/idem-server/tests/clients/sign_webhooks.py"
    );
    let mut child = std::process::Command::new(idem_testkit::python())
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the signer");
    let input = serde_json::json!([
        {"library": "standardwebhooks", "secret": SECRET, "body": body, "id": msg_id}
    ]);
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.to_string().as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("the signer ran");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut signed: Vec<Vec<(String, String)>> =
        serde_json::from_slice(&out.stdout).expect("the signer's JSON");
    signed.pop().expect("one delivery signed")
}

#[tokio::test]
async fn a_webhook_sent_twice_is_stored_once_and_applied_once() {
    let dir = std::env::temp_dir().join(format!("example-webhook-route-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_example-webhook-route"))
        .env("IDEM_DB", dir.join("webhooks.db"))
        .env("IDEM_LISTEN", "127.0.0.1:0")
        .env("WEBHOOK_SECRET", SECRET)
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

    let body = r#"{"type":"payment.succeeded","data":{"id":"pay_1","amount":4200}}"#;
    let headers = sign("msg_pay_1", body);
    let (first, a) = send(&addr, "POST", "/webhooks/payments", &headers, body).await;
    let (again, b) = send(&addr, "POST", "/webhooks/payments", &headers, body).await;
    assert_eq!((first, again), (202, 200), "{a}\n{b}");
    assert!(
        a.ends_with(r#"{"delivery_id":"msg_pay_1","status":"accepted"}"#),
        "{a}"
    );
    assert!(
        b.ends_with(r#"{"delivery_id":"msg_pay_1","status":"duplicate"}"#),
        "{b}"
    );

    // A forgery is refused and stored nowhere.
    let mut forged = headers.clone();
    for (name, value) in &mut forged {
        if name == "webhook-id" {
            *value = "msg_pay_2".into();
        }
    }
    let (refused, c) = send(&addr, "POST", "/webhooks/payments", &forged, body).await;
    assert_eq!(refused, 401, "{c}");

    // The processor applies the stored receipt: one payment, one handler run,
    // and it stays one after several more polls.
    let mut shown = String::new();
    for _ in 0..100 {
        shown = send(&addr, "GET", "/payments", &[], "").await.1;
        if shown.ends_with("payments 1, handler runs 1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(shown.ends_with("payments 1, handler runs 1"), "{shown}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, later) = send(&addr, "GET", "/payments", &[], "").await;
    assert!(later.ends_with("payments 1, handler runs 1"), "{later}");

    child.kill().await.expect("stop the example");
    let _ = std::fs::remove_dir_all(&dir);
}
