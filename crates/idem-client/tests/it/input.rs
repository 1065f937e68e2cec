//! Invalid input is refused before anything is sent.

use std::time::Duration;

use idem_client::{Client, ClientError, RetryPolicy};

use crate::support::{Server, client, fast_policy, status};

#[tokio::test]
async fn an_invalid_key_is_refused_and_nothing_is_sent() {
    let server = Server::start(|_| status(200)).await;
    let client = client(&server, fast_policy(3));
    for bad in [
        String::new(),
        "k".repeat(256),
        "with space".into(),
        "tab\there".into(),
        "new\nline".into(),
        "nul\0".into(),
        "del\x7f".into(),
        "caf\u{e9}".into(),
    ] {
        let err = client
            .post("/v1/orders")
            .key(bad.as_str())
            .send()
            .await
            .unwrap_err();
        assert!(
            matches!(err, ClientError::InvalidKey { .. }),
            "{bad:?}: {err:?}"
        );
        assert!(err.nothing_sent() && !err.retryable());
        assert_eq!(err.attempts(), 0);
    }
    // The longest key is fine.
    let answer = client.post("/").key("k".repeat(255)).send().await.unwrap();
    assert_eq!(answer.key.len(), 255);
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn invalid_headers_paths_and_bodies_are_refused_and_nothing_is_sent() {
    let server = Server::start(|_| status(200)).await;
    let client = client(&server, fast_policy(3));
    let requests = [
        client.post("/v1/orders").header("bad name", "v"),
        client.post("/v1/orders").header("x-ok", "line\nbreak"),
        client.post("/v1/orders").header("idempotency-key", "k"),
        client.post("v1/orders"),
        client.post("/v1/orders#frag"),
        client.post("/v1/or ders"),
        client
            .post("/v1/orders")
            .json(&std::collections::HashMap::from([((1, 2), 3)])),
    ];
    for request in requests {
        let err = request.send().await.unwrap_err();
        assert!(
            matches!(err, ClientError::InvalidRequest { .. }),
            "{request:?}: {err:?}"
        );
        assert!(err.nothing_sent());
    }
    assert_eq!(server.seen().len(), 0);
}

#[test]
fn invalid_urls_are_refused() {
    for (url, words) in [
        ("ftp://example.com/", "scheme"),
        ("http://user:secret@example.com/", "credentials"),
        ("http://example.com/?q=1", "query"),
        ("http://example.com/#top", "fragment"),
        ("https://example.com/", "TLS connector"),
        ("example.com", "absolute"),
        ("", "absolute"),
    ] {
        let err = Client::new(url).unwrap_err();
        let ClientError::InvalidUrl { reason, url: shown } = &err else {
            panic!("{url:?}: {err:?}");
        };
        assert!(reason.contains(words), "{url:?}: {reason}");
        assert!(!shown.contains("secret"));
        assert!(err.nothing_sent());
    }
}

#[test]
fn an_invalid_policy_is_refused_naming_the_field() {
    let mut policy = RetryPolicy::default();
    policy.attempt_timeout = Duration::ZERO;
    let err = Client::builder()
        .retry_policy(policy)
        .build("http://127.0.0.1:1")
        .unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::InvalidPolicy {
                field: "attempt_timeout",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("`attempt_timeout`"), "{err}");
    let err = Client::builder()
        .max_response_body(usize::MAX)
        .build("http://127.0.0.1:1")
        .unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::InvalidPolicy {
                field: "max_response_body",
                ..
            }
        ),
        "{err:?}"
    );
}
