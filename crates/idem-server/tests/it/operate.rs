//! What an operator sees of a running `idem`: JSON log lines, traces sent
//! to an OpenTelemetry collector (feature `otlp`), and the progress of long
//! commands (`idem gc`, `idem webhooks replay --all`) — on stderr, with the
//! result alone on stdout.

use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use idem_core::webhooks::{ReceiptState, WebhookStore};
use idem_server::webhooks;
use idem_webhooks::Receiver;

use crate::create;
use crate::fixture::{TempDir, serve};
use crate::process::Server;
use crate::webhooks::{config, deliver, payment, sign};

fn idem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test]
async fn log_format_json_writes_one_object_per_line_and_never_the_raw_key() {
    let dir = TempDir::new("log-json");
    let mut server = Server::start(&dir.sqlite_url(), &["--log-format", "json"]).await;
    let key = "raw-key-7f3a9c-must-not-be-logged";
    let r = create(
        server.addr,
        key,
        r#"{"amount":100,"currency":"EUR","customer":"c1"}"#,
    )
    .await;
    assert_eq!(r.status, 201);
    let replay = create(
        server.addr,
        key,
        r#"{"amount":100,"currency":"EUR","customer":"c1"}"#,
    )
    .await;
    assert!(replay.replayed());
    // The request line is written once the answer is sent.
    let mut log = String::new();
    for _ in 0..100 {
        log = server.proc().log();
        if log.matches("\"replayed\"").count() >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(lines.len() >= 3, "{log}");
    for l in &lines {
        assert!(
            l["timestamp"].is_string() && l["level"].is_string() && l["fields"].is_object(),
            "{l}"
        );
    }
    let outcomes: Vec<&str> = lines
        .iter()
        .filter(|l| l["target"] == "idem::request" && l["fields"]["route"] == "/v1/payments")
        .filter_map(|l| l["fields"]["outcome"].as_str())
        .collect();
    assert_eq!(outcomes, ["executed", "replayed"], "{log}");
    assert!(!log.contains(key), "the raw key is in the log:\n{log}");
}

#[tokio::test]
async fn a_bad_log_format_is_refused_before_anything_starts() {
    let out = idem(&[
        "--log-format",
        "xml",
        "gc",
        "--database-url",
        "sqlite://nowhere.db",
    ]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("--log-format") && err.contains("json"),
        "{err}"
    );
}

#[cfg(not(feature = "otlp"))]
#[tokio::test]
async fn otlp_endpoint_without_the_feature_says_how_to_get_it() {
    let dir = TempDir::new("otlp-off");
    let url = dir.sqlite_url();
    let out = idem(&[
        "migrate",
        "--database-url",
        &url,
        "--otlp-endpoint",
        "http://127.0.0.1:4318",
    ]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("--features otlp"), "{err}");
}

/// A collector: accepts OTLP/HTTP posts and keeps their bodies.
#[cfg(feature = "otlp")]
async fn collector() -> (
    std::net::SocketAddr,
    Arc<std::sync::Mutex<Vec<(String, Vec<u8>)>>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let got = Arc::new(std::sync::Mutex::new(Vec::new()));
    let store = got.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let store = store.clone();
            tokio::spawn(async move {
                let mut raw = Vec::new();
                let mut buf = [0u8; 8192];
                loop {
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    raw.extend_from_slice(&buf[..n]);
                    let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    if raw.len() < split + 4 + len {
                        continue;
                    }
                    let body = raw[split + 4..split + 4 + len].to_vec();
                    raw.drain(..split + 4 + len);
                    store.lock().unwrap().push((head, body));
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n")
                        .await;
                }
            });
        }
    });
    (addr, got)
}

#[cfg(feature = "otlp")]
#[tokio::test]
async fn otlp_exporter_sends_the_request_spans_to_a_collector() {
    let (collector, got) = collector().await;
    let dir = TempDir::new("otlp-on");
    let endpoint = format!("http://{collector}");
    let mut server = Server::start(&dir.sqlite_url(), &["--otlp-endpoint", &endpoint]).await;
    let key = "otlp-raw-key-0d5e";
    let r = create(
        server.addr,
        key,
        r#"{"amount":100,"currency":"EUR","customer":"c1"}"#,
    )
    .await;
    assert_eq!(r.status, 201);
    // The request's span ends just after its answer is written; a SIGTERM
    // sent at once could land before that (once in CI: nothing reached
    // the collector). 300 ms is far below the exporter's 5 s batch delay,
    // so what arrives is still only what the stop flushes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // SIGTERM: a clean stop flushes the exporter's buffer.
    let pid = server.proc().pid().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    assert!(
        server.proc().exited_within(Duration::from_secs(20)).await,
        "idem did not stop"
    );
    let posts = got.lock().unwrap().clone();
    assert!(!posts.is_empty(), "nothing reached the collector");
    let (head, body) = &posts[0];
    assert!(head.starts_with("post /v1/traces "), "{head}");
    assert!(
        head.contains("content-type: application/x-protobuf"),
        "{head}"
    );
    let all: Vec<u8> = posts.iter().flat_map(|(_, b)| b.clone()).collect();
    let has = |needle: &str| all.windows(needle.len()).any(|w| w == needle.as_bytes());
    assert!(has("idem"), "no service name");
    assert!(
        has("idem.request"),
        "no request span in {} bytes",
        body.len()
    );
    assert!(!has(key), "the raw key was exported");
}

#[tokio::test]
async fn gc_shows_progress_on_stderr_and_the_result_on_stdout() {
    let dir = TempDir::new("gc-progress");
    let url = dir.sqlite_url();
    assert!(idem(&["migrate", "--database-url", &url]).status.success());
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    for i in 0..3 {
        sqlx::query(
            "INSERT INTO idem_keys (tenant_id, operation, idempotency_key, request_hash, state, \
             created_at_ms, updated_at_ms, expires_at_ms) VALUES ('t', 'op', ?, x'00', 'failed', 1, 1, 2)",
        )
        .bind(format!("k{i}"))
        .execute(&pool)
        .await
        .unwrap();
    }
    pool.close().await;
    let out = idem(&["gc", "--database-url", &url]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        stdout.starts_with("deleted 3 expired key records,"),
        "{stdout}"
    );
    assert!(stderr.contains("gc: 3 key records\n"), "{stderr}");
    assert!(stderr.contains("gc: 3 rows deleted\n"), "{stderr}");
    assert!(
        !stderr.contains('\x1b'),
        "no terminal codes into a pipe: {stderr:?}"
    );
}

/// Three dead deliveries of `github` (their upstream refuses every
/// connection; one attempt each).
async fn three_dead<S: WebhookStore + idem_core::KeyStore>(store: &S) {
    let text = config("http://127.0.0.1:9/hook", "max_attempts = 1");
    let config = webhooks::parse(&text).unwrap();
    let receiver = Arc::new(Receiver::with_clock(
        store.clone(),
        config.endpoints.clone(),
        store.clock(),
    ));
    let addr = serve(idem_webhooks::route::router(receiver)).await;
    for d in ["d1", "d2", "d3"] {
        let body = payment(d, "");
        let r = deliver(
            addr,
            "github",
            &sign::github("github-secret", d, &body),
            &body,
        )
        .await;
        assert_eq!(r.status, 202);
    }
    let processor = webhooks::processor(store.clone(), store.clock(), &config).unwrap();
    let mut dead = 0;
    for _ in 0..20 {
        dead += processor.run_once().await.unwrap().dead;
        if dead == 3 {
            break;
        }
    }
    assert_eq!(dead, 3);
}

async fn replay_all_requeues_every_dead_delivery<S: WebhookStore + idem_core::KeyStore>(
    store: S,
    url: &str,
) {
    three_dead(&store).await;
    let out = idem(&["webhooks", "replay", "--all", "--database-url", url]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(lines.iter().all(|l| l["result"] == "requeued"), "{stdout}");
    assert!(stderr.contains("replay: 3/3 github\n"), "{stderr}");
    assert!(
        stderr.contains("replay: 3 dead deliveries requeued\n"),
        "{stderr}"
    );
    for r in store.list_receipts(Some("github"), None, 10).await.unwrap() {
        assert_eq!(r.state, ReceiptState::Received, "{}", r.receipt.delivery_id);
    }
    // Nothing left to replay: a second run says so and succeeds.
    let out = idem(&["webhooks", "replay", "--all", "--database-url", url]);
    assert!(out.status.success());
    assert_eq!(text(&out.stdout), "");
    assert!(text(&out.stderr).contains("replay: 0 dead deliveries requeued"));
    // Either one delivery or --all.
    let out = idem(&["webhooks", "replay", "github", "--database-url", url]);
    assert!(!out.status.success());
    let out = idem(&[
        "webhooks",
        "replay",
        "--all",
        "--state",
        "processed",
        "--database-url",
        url,
    ]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("expected dead or failed"));
}

#[tokio::test]
async fn webhooks_replay_all_requeues_every_dead_delivery_on_sqlite() {
    let dir = TempDir::new("replay-all");
    let url = dir.sqlite_url();
    let store = idem_sqlite::SqliteStore::connect(&url, Default::default())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    replay_all_requeues_every_dead_delivery(store, &url).await;
}

#[tokio::test]
async fn webhooks_replay_all_requeues_every_dead_delivery_on_postgres() {
    let db = idem_testkit::PgDatabase::create("idem_replay_all").await;
    let store = idem_postgres::PgStore::connect(&db.url, Default::default())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    replay_all_requeues_every_dead_delivery(store, &db.url).await;
}
