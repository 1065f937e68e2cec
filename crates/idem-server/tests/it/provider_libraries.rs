//! Webhooks as providers really send them: signed by the providers' own
//! libraries from PyPI — `svix` under Svix's default `svix-*` headers,
//! `standardwebhooks` under `webhook-*`, `slack_sdk` — and received by the
//! `idem serve` binary on both backends: accepted once, a repeat a duplicate,
//! forwarded once to the demo API (one payment each); Slack's signed
//! `url_verification` answered with its challenge and never stored; a
//! `whsec_` secret written without its base64 padding accepted at start-up.

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};

use crate::checkout::ShopDb;
use crate::payments_of;
use crate::process::Server;
use crate::webhooks::{deliver, payment, sign, upstream};

const KEY: &[u8] = b"idem-svix-and-standard-key-32byt";
const SLACK_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";

/// `whsec_<base64 of KEY>`, with or without its `=` padding.
fn whsec(padded: bool) -> String {
    let b64 = B64.encode(KEY);
    assert!(
        b64.ends_with('='),
        "the key's base64 has padding to leave out"
    );
    format!(
        "whsec_{}",
        if padded {
            &b64
        } else {
            b64.trim_end_matches('=')
        }
    )
}

/// Headers for each `{"library", "secret", "body", "id"?}`, signed now by
/// that library (`tests/clients/sign_webhooks.py`).
async fn sign(deliveries: Value) -> Vec<Vec<(String, String)>> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/sign_webhooks.py"
    );
    let run = tokio::task::spawn_blocking(move || {
        let mut child = Command::new(idem_testkit::python())
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(deliveries.to_string().as_bytes()).unwrap();
        drop(stdin);
        child.wait_with_output().unwrap()
    });
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the signers finished within 60 s")
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `idem webhooks <args…> --database-url <db>`: its stdout.
fn cli(db: &str, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["webhooks"])
        .args(args)
        .args(["--database-url", db])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The configuration: one endpoint per library, each forwarding to the demo
/// API; the svix endpoint's secret written without its padding.
fn config(upstream: SocketAddr) -> String {
    let forward =
        format!("forward_to = \"http://{upstream}/v1/payments\"\nforward_timeout_secs = 4");
    format!(
        "[webhooks.svix]\nscheme = \"standard\"\nsecrets = [\"{}\"]\n{forward}\n\
         [webhooks.standard]\nscheme = \"standard\"\nsecrets = [\"{}\"]\n{forward}\n\
         [webhooks.slack]\nscheme = \"slack\"\nsecrets = [\"{SLACK_SECRET}\"]\n{forward}\n\
         [worker]\nlease_secs = 5\npoll_interval_ms = 50\n",
        whsec(false),
        whsec(true),
    )
}

pub async fn deliveries_signed_by_provider_libraries_are_forwarded_once(db: ShopDb) {
    let (upstream, _up) = upstream().await;
    let dir = idem_testkit::TempDir::new("provider-libs");
    let file = dir.path().join("idem.toml");
    std::fs::write(&file, config(upstream)).unwrap();
    let server = Server::start(&db.url(), &["--config", file.to_str().unwrap()]).await;
    let deliveries = [
        (
            "svix",
            "svix",
            "cus_lib_svix",
            r#","type":"invoice.paid""#,
            "msg_svix_1",
        ),
        (
            "standard",
            "standardwebhooks",
            "cus_lib_stdwh",
            r#","type":"invoice.paid""#,
            "msg_std_1",
        ),
        (
            "slack",
            "slack_sdk",
            "cus_lib_slack",
            r#","type":"event_callback","event_id":"Ev_lib_1","event":{"type":"message"}"#,
            "Ev_lib_1",
        ),
    ];
    let bodies: Vec<String> = deliveries.iter().map(|d| payment(d.2, d.3)).collect();
    let secret = |library: &str| match library {
        "svix" => whsec(false),
        "standardwebhooks" => whsec(true),
        _ => SLACK_SECRET.to_owned(),
    };
    let signed = sign(Value::Array(
        deliveries
            .iter()
            .zip(&bodies)
            .map(
                |(d, body)| json!({"library": d.1, "secret": secret(d.1), "id": d.4, "body": body}),
            )
            .collect(),
    ))
    .await;
    for ((d, body), headers) in deliveries.iter().zip(&bodies).zip(&signed) {
        let first = deliver(server.addr, d.0, headers, body).await;
        assert_eq!(
            first.status,
            202,
            "{}: {}",
            d.1,
            String::from_utf8_lossy(&first.body)
        );
        assert_eq!(first.json()["delivery_id"], d.4, "{}", d.1);
        let again = deliver(server.addr, d.0, headers, body).await;
        assert_eq!(
            (again.status, again.json()["status"].as_str()),
            (200, Some("duplicate")),
            "{}",
            d.1
        );
    }
    let db_url = db.url();
    crate::messaging::eventually(
        Duration::from_secs(20),
        "every delivery processed",
        || async {
            cli(&db_url, &["list", "--state", "processed"])
                .lines()
                .count()
                == deliveries.len()
        },
    )
    .await;
    // A provider's retry after processing: still a duplicate, no new forward;
    // also when the library signs it again under a new timestamp, as the
    // providers' retries are.
    let resigned = sign(Value::Array(
        deliveries
            .iter()
            .zip(&bodies)
            .map(|(d, body)| {
                json!({"library": d.1, "secret": secret(d.1), "id": d.4, "body": body, "later": 60})
            })
            .collect(),
    ))
    .await;
    for ((d, body), (headers, anew)) in deliveries
        .iter()
        .zip(&bodies)
        .zip(signed.iter().zip(&resigned))
    {
        assert_ne!(
            headers, anew,
            "{}: another timestamp, another signature",
            d.1
        );
        for h in [headers, anew] {
            assert_eq!(
                deliver(server.addr, d.0, h, body).await.status,
                200,
                "{}",
                d.1
            );
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for d in &deliveries {
        assert_eq!(
            payments_of(upstream, d.2).await.len(),
            1,
            "{}: forwarded once",
            d.1
        );
    }
    let shown = cli(&db_url, &["show", "svix", "msg_svix_1"]);
    assert!(
        shown.contains("svix-id") && !shown.contains("svix-signature"),
        "the signature is never stored: {shown}"
    );
    assert_eq!(cli(&db_url, &["list"]).lines().count(), deliveries.len());
    println!(
        "provider libraries: svix (svix-* headers, unpadded whsec_), standardwebhooks, slack_sdk: \
         accepted=3 duplicates=6 payments_per_delivery=1"
    );
}

pub async fn slack_url_verification_signed_by_slack_sdk_gets_its_challenge(db: ShopDb) {
    let (upstream, _up) = upstream().await;
    let dir = idem_testkit::TempDir::new("slack-handshake");
    let file = dir.path().join("idem.toml");
    std::fs::write(&file, config(upstream)).unwrap();
    let server = Server::start(&db.url(), &["--config", file.to_str().unwrap()]).await;
    let challenge = "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P";
    let body = json!({"token": "Jhj5dZrVaK7ZwHHjRyZWjbDl", "challenge": challenge,
                      "type": "url_verification"})
    .to_string();
    let no_challenge = json!({"token": "t", "type": "url_verification"}).to_string();
    let signed = sign(json!([
        {"library": "slack_sdk", "secret": SLACK_SECRET, "body": body},
        {"library": "slack_sdk", "secret": "not-the-signing-secret", "body": body},
        {"library": "slack_sdk", "secret": SLACK_SECRET, "body": no_challenge},
    ]))
    .await;
    // Slack retries a handshake it got no answer to: each gets the challenge.
    for _ in 0..2 {
        let r = deliver(server.addr, "slack", &signed[0], &body).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.json(), json!({"challenge": challenge}));
        assert!(
            r.head
                .to_ascii_lowercase()
                .contains("content-type: application/json"),
            "{}",
            r.head
        );
    }
    // The signature comes first: a forged handshake learns nothing.
    let forged = deliver(server.addr, "slack", &signed[1], &body).await;
    assert_eq!(forged.status, 401);
    assert_eq!(
        forged.problem_type(),
        "https://idem.dev/problems/invalid-signature"
    );
    // Signed, but nothing to echo: refused, not taken for an event.
    let empty = deliver(server.addr, "slack", &signed[2], &no_challenge).await;
    assert_eq!(empty.status, 400);
    assert_eq!(
        empty.problem_type(),
        "https://idem.dev/problems/invalid-challenge"
    );
    // Only a stored receipt is ever forwarded.
    assert_eq!(
        cli(&db.url(), &["list"]).lines().count(),
        0,
        "a handshake is never stored, so never forwarded"
    );
}

/// The `toml` blocks of docs/webhooks.md's "One block per provider".
fn readme_provider_blocks() -> Vec<String> {
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/webhooks.md"
    ))
    .unwrap();
    let (_, section) = page.split_once("\n## One block per provider\n").unwrap();
    let section = section.split("\n## ").next().unwrap();
    section
        .split("```toml\n")
        .skip(1)
        .map(|b| b.split_once("```").unwrap().0.to_owned())
        .collect()
}

/// Each provider block of docs/webhooks.md works as written: the configuration loads, and a
/// delivery signed with the block's secret by the provider's own library
/// (GitHub's and Shopify's documented algorithm: they publish none) verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_provider_blocks_verify_their_own_libraries_signatures() {
    use axum::http::{HeaderMap, HeaderName, HeaderValue};
    let blocks = readme_provider_blocks();
    let mut schemes = Vec::new();
    for block in &blocks {
        let config =
            idem_server::webhooks::parse(block).unwrap_or_else(|e| panic!("{e:#}\n{block}"));
        let [endpoint] = &config.endpoints[..] else {
            panic!("one endpoint per block:\n{block}")
        };
        let table: toml::Table = toml::from_str(block).unwrap();
        let secret = table["webhooks"][&endpoint.name]["secrets"][0]
            .as_str()
            .unwrap()
            .to_owned();
        let scheme = table["webhooks"][&endpoint.name]["scheme"]
            .as_str()
            .unwrap()
            .to_owned();
        let body = payment("cus_readme", r#","id":"evt_readme","event_id":"Ev_readme""#);
        let signed: Vec<(&str, Vec<(String, String)>)> = match scheme.as_str() {
            "github" => vec![("github", sign::github(&secret, "readme-1", &body))],
            "shopify" => vec![("shopify", sign::shopify(&secret, "readme-1", &body))],
            library => {
                let libraries: &[&str] = match library {
                    "standard" => &["svix", "standardwebhooks"],
                    "slack" => &["slack_sdk"],
                    "stripe" => &["stripe"],
                    other => panic!("no signer for {other}"),
                };
                let deliveries = libraries
                    .iter()
                    .map(|l| json!({"library": l, "secret": secret, "id": "msg_readme", "body": body}))
                    .collect();
                libraries
                    .iter()
                    .copied()
                    .zip(sign(Value::Array(deliveries)).await)
                    .collect()
            }
        };
        for (library, headers) in signed {
            let mut map = HeaderMap::new();
            for (n, v) in &headers {
                map.insert(
                    HeaderName::try_from(n.as_str()).unwrap(),
                    HeaderValue::try_from(v).unwrap(),
                );
            }
            let now = crate::webhooks::now_s();
            let verified = endpoint.verifier.verify(&map, body.as_bytes(), now);
            assert!(verified.is_ok(), "{library}: {verified:?}\n{block}");
        }
        schemes.push(scheme);
    }
    schemes.sort();
    assert_eq!(
        schemes,
        ["github", "shopify", "slack", "standard", "stripe"],
        "one block per provider"
    );
}

on_both! {
    deliveries_signed_by_provider_libraries_are_forwarded_once;
    slack_url_verification_signed_by_slack_sdk_gets_its_challenge;
}
