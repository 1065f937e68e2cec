//! What is retried, with which key, and when the client stops.

use std::time::Duration;

use http::{Method, StatusCode};
use idem_client::{ClientError, Failure};

use crate::support::{Action, Server, client, fast_policy, respond, status};

#[tokio::test]
async fn a_dropped_connection_is_retried_with_the_same_key() {
    let server = Server::start(|n| if n < 2 { Action::Drop } else { status(201) }).await;
    let answer = client(&server, fast_policy(5))
        .post("/v1/orders")
        .body("order")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::CREATED);
    assert_eq!(answer.attempts, 3);
    assert!(!answer.replayed);
    let seen = server.seen();
    assert_eq!(seen.len(), 3);
    assert!(
        seen.iter()
            .all(|s| s.key.as_deref() == Some(answer.key.as_str()))
    );
    assert!(seen.iter().all(|s| s.body == "order" && s.method == "POST"));
}

#[tokio::test]
async fn a_503_is_retried_with_the_same_key_until_success() {
    let server = Server::start(|n| if n < 3 { status(503) } else { status(200) }).await;
    let answer = client(&server, fast_policy(5))
        .put("/v1/inventory/tea")
        .key("restock-7")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.attempts, 4);
    assert_eq!(answer.key, "restock-7");
    assert_eq!(server.keys(), vec!["restock-7"; 4]);
}

#[tokio::test]
async fn a_429_and_a_500_are_retried() {
    let server = Server::start(|n| match n {
        0 => status(429),
        1 => status(500),
        _ => status(204),
    })
    .await;
    let answer = client(&server, fast_policy(5))
        .delete("/v1/orders/1")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::NO_CONTENT);
    assert_eq!(answer.attempts, 3);
}

#[tokio::test]
async fn retry_after_is_a_lower_bound_on_the_wait() {
    let server = Server::start(|n| {
        if n == 0 {
            respond(503, &[("retry-after", "1")], "")
        } else {
            status(201)
        }
    })
    .await;
    let answer = client(&server, fast_policy(3))
        .post("/v1/orders")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.attempts, 2);
    let seen = server.seen();
    let gap = seen[1].at - seen[0].at;
    // The backoff alone is at most 20 ms: only the header explains a second.
    assert!(gap >= Duration::from_secs(1), "retried after {gap:?}");
}

#[tokio::test]
async fn a_retry_after_beyond_the_deadline_stops_with_the_last_answer() {
    let server = Server::start(|_| respond(503, &[("retry-after", "3600")], "busy")).await;
    let mut policy = fast_policy(5);
    policy.deadline = Duration::from_secs(10);
    let err = client(&server, policy)
        .post("/v1/orders")
        .key("k-1")
        .send()
        .await
        .unwrap_err();
    let ClientError::DeadlineExceeded {
        key,
        attempts,
        deadline,
        last: Failure::Status(last),
    } = &err
    else {
        panic!("expected DeadlineExceeded with a status, got {err:?}");
    };
    assert_eq!(
        (key.as_str(), *attempts, *deadline),
        ("k-1", 1, Duration::from_secs(10))
    );
    assert_eq!(last.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(last.body, "busy");
    assert_eq!(err.last_status(), Some(StatusCode::SERVICE_UNAVAILABLE));
    assert!(err.retryable() && !err.nothing_sent());
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn a_400_or_a_422_is_returned_at_once_never_retried() {
    for code in [400u16, 401, 404, 408, 413, 422] {
        let server = Server::start(move |_| respond(code, &[], "{\"type\":\"x\"}")).await;
        let answer = client(&server, fast_policy(5))
            .post("/v1/orders")
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status.as_u16(), code);
        assert_eq!(answer.attempts, 1);
        assert_eq!(answer.body, "{\"type\":\"x\"}");
        assert_eq!(server.seen().len(), 1, "status {code} was retried");
    }
}

#[tokio::test]
async fn a_409_business_conflict_is_returned_at_once() {
    let body = r#"{"type":"https://example.com/problems/order-exists","status":409}"#;
    let server =
        Server::start(move |_| respond(409, &[("content-type", "application/problem+json")], body))
            .await;
    let answer = client(&server, fast_policy(5))
        .post("/v1/orders")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::CONFLICT);
    assert_eq!(answer.attempts, 1);
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn a_409_in_flight_is_retried_by_its_problem_type_or_its_retry_after() {
    let in_flight = r#"{"type":"https://idem.dev/problems/request-in-flight","status":409}"#;
    let server = Server::start(move |n| match n {
        0 => respond(
            409,
            &[("content-type", "application/problem+json")],
            in_flight,
        ),
        1 => respond(409, &[("retry-after", "0")], ""),
        _ => respond(201, &[("idempotent-replayed", "true")], "{\"id\":1}"),
    })
    .await;
    let answer = client(&server, fast_policy(5))
        .post("/v1/orders")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::CREATED);
    assert_eq!(answer.attempts, 3);
    assert!(answer.replayed);
    let keys = server.keys();
    assert!(keys.iter().all(|k| *k == answer.key));
}

#[tokio::test]
async fn max_attempts_stops_with_attempts_exhausted() {
    let server = Server::start(|_| status(503)).await;
    let err = client(&server, fast_policy(3))
        .post("/v1/orders")
        .send()
        .await
        .unwrap_err();
    let ClientError::AttemptsExhausted {
        attempts,
        last,
        key,
    } = &err
    else {
        panic!("expected AttemptsExhausted, got {err:?}");
    };
    assert_eq!(*attempts, 3);
    assert_eq!(last.status(), Some(StatusCode::SERVICE_UNAVAILABLE));
    assert_eq!(server.keys(), vec![key.clone(); 3]);
    assert_eq!(err.key(), Some(key.as_str()));
}

#[tokio::test]
async fn a_refused_connection_is_retried_until_max_attempts() {
    // A port that was just free: nothing listens on it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let client = idem_client::Client::builder()
        .retry_policy(fast_policy(3))
        .build(&url)
        .unwrap();
    let err = client.post("/v1/orders").send().await.unwrap_err();
    let ClientError::AttemptsExhausted {
        attempts: 3,
        last: Failure::Transport(_),
        ..
    } = &err
    else {
        panic!("expected 3 transport failures, got {err:?}");
    };
    assert!(err.to_string().contains("transport error"), "{err}");
}

#[tokio::test]
async fn attempts_that_time_out_stop_at_the_deadline() {
    let server = Server::start(|_| Action::Hang).await;
    let mut policy = fast_policy(100);
    policy.attempt_timeout = Duration::from_millis(150);
    policy.deadline = Duration::from_millis(400);
    let started = std::time::Instant::now();
    let err = client(&server, policy)
        .post("/v1/orders")
        .send()
        .await
        .unwrap_err();
    let ClientError::DeadlineExceeded {
        attempts,
        last: Failure::Timeout { .. },
        ..
    } = &err
    else {
        panic!("expected DeadlineExceeded after a timeout, got {err:?}");
    };
    assert!(
        *attempts >= 2,
        "only {attempts} attempt(s) in 400 ms of 150 ms each"
    );
    assert_eq!(server.seen().len() as u32, *attempts);
    // It used its time: no early give-up.
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(err.retryable());
}

#[tokio::test]
async fn a_replay_is_reported() {
    let server = Server::start(|n| match n {
        0 => status(201),
        _ => respond(201, &[("idempotent-replayed", "true")], ""),
    })
    .await;
    let intent = client(&server, fast_policy(5)).post("/v1/orders").body("x");
    let first = intent.send().await.unwrap();
    assert!(!first.replayed);
    // The same intent sent again (an earlier send gave up, say): same key,
    // and the server's replay is visible.
    let again = intent.send().await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.attempts, 1);
    assert_eq!(first.key, again.key);
    assert_eq!(server.keys(), vec![first.key.clone(); 2]);
}

#[tokio::test]
async fn a_generated_key_is_one_per_intent() {
    let server = Server::start(|n| if n % 2 == 0 { status(503) } else { status(200) }).await;
    let client = client(&server, fast_policy(5));
    let one = client.request(Method::POST, "/v1/orders");
    let two = client.request(Method::POST, "/v1/orders");
    assert_ne!(one.idempotency_key(), two.idempotency_key());
    let a = one.send().await.unwrap();
    // A send is a Send future: it can run on a spawned task.
    let b = tokio::spawn(async move { two.send().await })
        .await
        .unwrap()
        .unwrap();
    assert_eq!((a.attempts, b.attempts), (2, 2));
    assert_eq!(a.key, one.idempotency_key());
    let keys = server.keys();
    assert_eq!(keys[0], keys[1]);
    assert_eq!(keys[2], keys[3]);
    assert_ne!(keys[0], keys[2]);
    assert_eq!(keys[0].len(), 36);
}

#[tokio::test]
async fn an_oversized_body_is_refused_and_not_retried() {
    let big = Box::leak("x".repeat(2048).into_boxed_str()) as &'static str;
    let server = Server::start(move |_| respond(200, &[], big)).await;
    let client = idem_client::Client::builder()
        .retry_policy(fast_policy(5))
        .max_response_body(1024)
        .build(&server.url)
        .unwrap();
    let err = client.post("/v1/orders").send().await.unwrap_err();
    let ClientError::ResponseTooLarge {
        limit: 1024,
        attempts: 1,
        status,
        ..
    } = &err
    else {
        panic!("expected ResponseTooLarge, got {err:?}");
    };
    assert_eq!(*status, StatusCode::OK);
    assert_eq!(server.seen().len(), 1);
    // Without a Content-Length the limit holds while reading.
    let chunked =
        Server::start(move |_| respond(502, &[("transfer-encoding", "chunked")], big)).await;
    let err = idem_client::Client::builder()
        .retry_policy(fast_policy(5))
        .max_response_body(1024)
        .build(&chunked.url)
        .unwrap()
        .post("/")
        .send()
        .await
        .unwrap_err();
    assert!(
        matches!(err, ClientError::ResponseTooLarge { attempts: 1, .. }),
        "{err:?}"
    );
    assert_eq!(err.last_status(), Some(StatusCode::BAD_GATEWAY));
    assert_eq!(chunked.seen().len(), 1);
    // At the limit exactly is fine.
    let client = idem_client::Client::builder()
        .max_response_body(2048)
        .build(&server.url)
        .unwrap();
    assert_eq!(client.post("/").send().await.unwrap().body.len(), 2048);
}

#[tokio::test]
async fn json_headers_and_the_base_path_are_sent() {
    let server = Server::start(|_| {
        respond(
            200,
            &[("content-type", "application/json")],
            "{\"ok\":true}",
        )
    })
    .await;
    let client = idem_client::Client::builder()
        .build(&format!("{}/api/", server.url))
        .unwrap();
    let answer = client
        .post("/v1/orders?dry=1")
        .key(r#"a"b"#)
        .header("x-tenant", "acme")
        .header(http::header::AUTHORIZATION, "Bearer t")
        .json(&serde_json::json!({"sku": "tea"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.json::<serde_json::Value>().unwrap()["ok"], true);
    let seen = &server.seen()[0];
    assert_eq!(seen.path, "/api/v1/orders?dry=1");
    assert_eq!(seen.body, r#"{"sku":"tea"}"#);
    assert_eq!(seen.headers["content-type"], "application/json");
    assert_eq!(seen.headers["x-tenant"], "acme");
    assert_eq!(seen.headers["authorization"], "Bearer t");
    // A key with a quote goes as an RFC 8941 string, which Idem unquotes.
    assert_eq!(seen.key.as_deref(), Some(r#""a\"b""#));
    assert_eq!(answer.key, r#"a"b"#);
}
