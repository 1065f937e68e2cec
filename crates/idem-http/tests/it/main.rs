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
/// 500 → a 5xx (rolled back), 422 → a stored business error, 666 → a panic,
/// 777 → an 8 KiB body, 888 → 1.5 s of work after the insert, otherwise 201.
pub fn outcome(body: &Bytes, id: String) -> Response {
    let amount = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["amount"].as_i64());
    match amount {
        None => (StatusCode::BAD_REQUEST, "bad json").into_response(),
        Some(500) => (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response(),
        Some(666) => panic!("handler panicked after its insert"),
        Some(777) => (
            StatusCode::CREATED,
            [("content-type", "text/plain")],
            "x".repeat(8 * 1024),
        )
            .into_response(),
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
                ("x-internal", "not-allow-listed"),
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
                    if body.windows(3).any(|w| w == b"888") {
                        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
                    }
                    outcome(&body, id)
                })
            }

            async fn app() -> (axum::Router, super::$db::Db) {
                app_with(|_| {}).await
            }

            async fn app_with(
                tune: impl FnOnce(&mut RouteConfig),
            ) -> (axum::Router, super::$db::Db) {
                let db = super::$db::setup().await;
                let mut config = RouteConfig::required(
                    Operation::new("payments.create").unwrap(),
                    TenantSource::TrustedHeader {
                        name: "x-tenant-id".parse().unwrap(),
                        default: Some(Tenant::new("default").unwrap()),
                    },
                );
                config.max_request_bytes = 1024;
                config.max_response_bytes = 4096;
                tune(&mut config);
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
                assert!(h1.get("x-internal").is_some());
                assert!(
                    h2.get("x-internal").is_none(),
                    "only allow-listed headers are replayed"
                );
                assert_eq!(db.count().await, 1);
            }

            /// A compression layer inside the idempotency layer (tower-http's
            /// own): the first client accepts gzip, the retry does not; both
            /// get the same readable bytes, and nothing claims an encoding
            /// the body does not have.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn stored_answers_are_readable_whatever_the_first_client_accepted() {
                let db = super::$db::setup().await;
                let config = RouteConfig::required(
                    Operation::new("payments.create").unwrap(),
                    TenantSource::Static(Tenant::new("t").unwrap()),
                );
                let app = axum::Router::new().route(
                    "/payments",
                    post(create)
                        .layer::<_, std::convert::Infallible>(
                            tower_http::compression::CompressionLayer::new(),
                        )
                        .layer(IdempotencyLayer::new(db.store.clone(), config)),
                );
                let ask = |accept: Option<&'static str>| {
                    let app = app.clone();
                    async move {
                        let mut req = Request::post("/payments")
                            .header("content-type", "application/json")
                            .header("idempotency-key", "gz-1");
                        if let Some(a) = accept {
                            req = req.header("accept-encoding", a);
                        }
                        let res = app
                            .oneshot(req.body(Body::from(r#"{"amount":777}"#)).unwrap())
                            .await
                            .unwrap();
                        let (parts, body) = res.into_parts();
                        (parts.headers, body.collect().await.unwrap().to_bytes())
                    }
                };
                let (h1, b1) = ask(Some("gzip, deflate, br")).await;
                let (h2, b2) = ask(None).await;
                assert_eq!(h2.get("idempotent-replayed").unwrap(), "true");
                for (h, b) in [(&h1, &b1), (&h2, &b2)] {
                    assert!(h.get("content-encoding").is_none(), "{h:?}");
                    assert_eq!(&b[..], "x".repeat(8 * 1024).as_bytes(), "readable");
                }
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

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn response_over_capture_cap_rolls_back_and_is_500() {
                let (app, db) = app().await;
                let (s, h, b) = send(&app, Some("big"), "t", r#"{"amount":777}"#).await;
                assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
                assert_eq!(h.get("content-type").unwrap(), "application/problem+json");
                assert_eq!(
                    problem_type(&b),
                    "https://idem.dev/problems/response-too-large"
                );
                assert_eq!(
                    db.count().await,
                    0,
                    "nothing committed that could not be replayed"
                );
                // The key was rolled back too: another body with it is not a mismatch.
                let (s, h, _) = send(&app, Some("big"), "t", r#"{"amount":1}"#).await;
                assert_eq!(s, StatusCode::CREATED);
                assert!(h.get("idempotent-replayed").is_none());
                assert_eq!(db.count().await, 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn handler_over_its_timeout_is_503_rolled_back_and_the_retry_executes() {
                let (app, db) = app_with(|c| {
                    c.handler_timeout = std::time::Duration::from_millis(300);
                })
                .await;
                // 888: the handler inserts, then works for 1.5 s.
                let (s, h, b) = send(&app, Some("slow-1"), "t", r#"{"amount":888}"#).await;
                assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
                assert!(h.get("retry-after").is_some());
                assert_eq!(
                    problem_type(&b),
                    "https://idem.dev/problems/handler-timeout"
                );
                assert_eq!(h.get("content-type").unwrap(), "application/problem+json");
                assert_eq!((db.count().await, db.keys().await), (0, 0), "rolled back");
                // The key was not used up: the retry runs the handler again
                // (and, as slow as before, times out again) instead of
                // replaying anything.
                let (s, h, b) = send(&app, Some("slow-1"), "t", r#"{"amount":888}"#).await;
                assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
                assert_eq!(
                    problem_type(&b),
                    "https://idem.dev/problems/handler-timeout"
                );
                assert!(h.get("idempotent-replayed").is_none());
                assert_eq!((db.count().await, db.keys().await), (0, 0));
                // A quick request is untouched by the timeout.
                let (s, _, _) = send(&app, Some("fast-1"), "t", r#"{"amount":10}"#).await;
                assert_eq!(s, StatusCode::CREATED);
                assert_eq!(db.count().await, 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn key_or_tenant_header_sent_twice_is_refused_with_a_detail() {
                let (app, db) = app().await;
                let twice = |name: &'static str, a: &'static str, b: &'static str| {
                    let app = app.clone();
                    async move {
                        let mut req = Request::post("/payments")
                            .header("content-type", "application/json")
                            .header(name, a)
                            .header(name, b);
                        if name != "idempotency-key" {
                            req = req.header("idempotency-key", "k-twice");
                        }
                        let res = app
                            .oneshot(req.body(Body::from(r#"{"amount":1}"#)).unwrap())
                            .await
                            .unwrap();
                        let status = res.status();
                        let body = res.into_body().collect().await.unwrap().to_bytes();
                        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                        (status, v)
                    }
                };
                let (s, v) = twice("idempotency-key", "a", "b").await;
                assert_eq!(s, StatusCode::BAD_REQUEST);
                assert_eq!(
                    v["type"],
                    "https://idem.dev/problems/malformed-idempotency-key"
                );
                assert!(
                    v["detail"].as_str().unwrap().contains("more than once"),
                    "{v}"
                );
                let (s, v) = twice("x-tenant-id", "alpha", "beta").await;
                assert_eq!(s, StatusCode::UNAUTHORIZED);
                assert_eq!(v["type"], "https://idem.dev/problems/tenant-unresolved");
                assert!(
                    v["detail"].as_str().unwrap().contains("more than once"),
                    "{v}"
                );
                // A malformed key says why.
                let (s, _, b) = send(&app, Some(&"k".repeat(256)), "t", r#"{"amount":1}"#).await;
                assert_eq!(s, StatusCode::BAD_REQUEST);
                let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
                assert!(v["detail"].as_str().unwrap().contains("256"), "{v}");
                assert_eq!((db.count().await, db.keys().await), (0, 0));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn request_still_running_after_the_wait_is_409_with_retry_after() {
                let (app, db) = app_with(|c| {
                    c.policy = c.policy.wait(std::time::Duration::from_millis(200));
                })
                .await;
                let (a, b) = (app.clone(), app.clone());
                let first =
                    tokio::spawn(
                        async move { send(&a, Some("slow"), "t", r#"{"amount":888}"#).await },
                    );
                let second =
                    tokio::spawn(
                        async move { send(&b, Some("slow"), "t", r#"{"amount":888}"#).await },
                    );
                let mut statuses = Vec::new();
                for (s, h, b) in [first.await.unwrap(), second.await.unwrap()] {
                    if s == StatusCode::CONFLICT {
                        assert_eq!(
                            problem_type(&b),
                            "https://idem.dev/problems/request-in-flight"
                        );
                        let secs: u64 = h
                            .get("retry-after")
                            .unwrap()
                            .to_str()
                            .unwrap()
                            .parse()
                            .unwrap();
                        assert!(secs >= 1);
                    }
                    statuses.push(s);
                }
                statuses.sort();
                assert_eq!(statuses, [StatusCode::CREATED, StatusCode::CONFLICT]);
                let (s, h, _) = send(&app, Some("slow"), "t", r#"{"amount":888}"#).await;
                assert_eq!(s, StatusCode::CREATED);
                assert_eq!(h.get("idempotent-replayed").unwrap(), "true");
                assert_eq!(db.count().await, 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn client_gone_mid_handler_rolls_back_and_retry_executes_once() {
                let (app, db) = app().await;
                // The caller gives up while the handler works: its future is dropped.
                let gave_up = tokio::time::timeout(
                    std::time::Duration::from_millis(300),
                    send(&app, Some("gone"), "t", r#"{"amount":888}"#),
                )
                .await;
                assert!(gave_up.is_err(), "the request was still running");
                // The dropped transaction rolls back as its connection is returned.
                let mut left = i64::MAX;
                for _ in 0..50 {
                    left = db.count().await + db.keys().await;
                    if left == 0 {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                assert_eq!(left, 0, "neither the payment nor the key survived");
                let (s, h, _) = send(&app, Some("gone"), "t", r#"{"amount":888}"#).await;
                assert_eq!(s, StatusCode::CREATED);
                assert!(h.get("idempotent-replayed").is_none());
                assert_eq!(db.count().await, 1, "the retry executed once");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn put_and_get_pass_through_unless_opted_in() {
                use axum::routing::get;
                let plain = || async { (StatusCode::OK, "plain") };
                let build = |db: &super::$db::Db, methods: Option<Vec<axum::http::Method>>| {
                    let mut config = RouteConfig::required(
                        Operation::new("things.put").unwrap(),
                        TenantSource::Static(Tenant::new("t").unwrap()),
                    );
                    if let Some(m) = methods {
                        config.methods = m;
                    }
                    axum::Router::new().route(
                        "/things",
                        get(plain)
                            .put(plain)
                            .layer(IdempotencyLayer::new(db.store.clone(), config)),
                    )
                };
                let db = super::$db::setup().await;
                let call = |app: axum::Router, method: &'static str| async move {
                    let req = Request::builder()
                        .method(method)
                        .uri("/things")
                        .body(Body::empty())
                        .unwrap();
                    app.oneshot(req).await.unwrap().status()
                };
                let default = build(&db, None);
                assert_eq!(
                    call(default.clone(), "PUT").await,
                    StatusCode::OK,
                    "PUT is not covered by default"
                );
                assert_eq!(call(default, "GET").await, StatusCode::OK);
                let opted = build(&db, Some(vec![axum::http::Method::PUT]));
                assert_eq!(
                    call(opted.clone(), "PUT").await,
                    StatusCode::BAD_REQUEST,
                    "PUT opted in needs a key"
                );
                assert_eq!(
                    call(opted, "GET").await,
                    StatusCode::OK,
                    "GET is never covered"
                );
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn optional_key_runs_in_a_transaction_without_a_record() {
                let (app, db) = app_with(|c| c.key_required = false).await;
                for _ in 0..2 {
                    let (s, h, _) = send(&app, None, "t", r#"{"amount":4}"#).await;
                    assert_eq!(s, StatusCode::CREATED);
                    assert!(h.get("idempotent-replayed").is_none());
                }
                assert_eq!(db.count().await, 2, "without a key each request executes");
                assert_eq!(db.keys().await, 0, "and leaves no key record");
                let (s, _, _) = send(&app, None, "t", r#"{"amount":500}"#).await;
                assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
                assert_eq!(
                    db.count().await,
                    2,
                    "a 5xx rolls back the unkeyed transaction too"
                );
                // With a key, the contract applies as usual.
                send(&app, Some("opt"), "t", r#"{"amount":4}"#).await;
                let (_, h, _) = send(&app, Some("opt"), "t", r#"{"amount":4}"#).await;
                assert_eq!(h.get("idempotent-replayed").unwrap(), "true");
                assert_eq!(db.count().await, 3);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn tenant_from_authentication_extension() {
                let db = super::$db::setup().await;
                let config = RouteConfig::required(
                    Operation::new("payments.create").unwrap(),
                    TenantSource::Extension,
                );
                // A stand-in for authentication: the bearer token names the tenant.
                let auth = axum::middleware::map_request(|mut req: Request<Body>| async move {
                    let tenant = req
                        .headers()
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.strip_prefix("Bearer "))
                        .and_then(|t| Tenant::new(t).ok());
                    if let Some(t) = tenant {
                        req.extensions_mut().insert(t);
                    }
                    req
                });
                let app = axum::Router::new().route(
                    "/payments",
                    post(create)
                        .layer(IdempotencyLayer::new(db.store.clone(), config))
                        .layer(auth),
                );
                let call = |token: Option<&'static str>, tenant_header: &'static str| {
                    let app = app.clone();
                    async move {
                        let mut req = Request::post("/payments")
                            .header("content-type", "application/json")
                            .header("idempotency-key", "k-auth")
                            .header("x-tenant-id", tenant_header);
                        if let Some(t) = token {
                            req = req.header("authorization", format!("Bearer {t}"));
                        }
                        let res = app
                            .oneshot(req.body(Body::from(r#"{"amount":1}"#)).unwrap())
                            .await
                            .unwrap();
                        let status = res.status();
                        let replayed = res.headers().contains_key("idempotent-replayed");
                        let body = res.into_body().collect().await.unwrap().to_bytes();
                        (status, replayed, body)
                    }
                };
                let (s, _, b) = call(None, "alpha").await;
                assert_eq!(s, StatusCode::UNAUTHORIZED, "no principal, no tenant");
                assert_eq!(
                    problem_type(&b),
                    "https://idem.dev/problems/tenant-unresolved"
                );
                // The problem says how a tenant is set.
                let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
                assert!(
                    v["detail"].as_str().unwrap().contains("TenantSource"),
                    "{v}"
                );
                assert_eq!(db.count().await, 0);
                let (s, replayed, _) = call(Some("alpha"), "alpha").await;
                assert_eq!((s, replayed), (StatusCode::CREATED, false));
                // A client header cannot move the request into another tenant's keys.
                let (s, replayed, _) = call(Some("beta"), "alpha").await;
                assert_eq!(
                    (s, replayed),
                    (StatusCode::CREATED, false),
                    "beta has its own key space"
                );
                let (_, replayed, _) = call(Some("alpha"), "beta").await;
                assert!(replayed, "alpha's record, whatever the header says");
                assert_eq!(db.count().await, 2);
            }
        }
    };
}

/// `SELECT count(*)` of a table, on either backend's pool.
macro_rules! count {
    ($pool:expr, $table:literal) => {
        sqlx::query_scalar::<_, i64>(concat!("SELECT count(*) FROM ", $table))
            .fetch_one($pool)
            .await
            .unwrap()
    };
}

mod sqlite_db {
    use idem_sqlite::{SqliteConfig, SqliteStore};
    use idem_testkit::TempDir;
    pub struct Db {
        pub store: SqliteStore,
        _dir: TempDir,
    }
    impl Db {
        pub async fn count(&self) -> i64 {
            count!(self.store.pool(), "payments")
        }
        pub async fn keys(&self) -> i64 {
            count!(self.store.pool(), "idem_keys")
        }
    }
    pub async fn setup() -> Db {
        let dir = TempDir::new("http-it");
        let store = SqliteStore::connect(&dir.sqlite_url(), SqliteConfig::default())
            .await
            .unwrap();
        store.migrate().await.unwrap();
        sqlx::raw_sql("CREATE TABLE payments (id TEXT PRIMARY KEY, amount INTEGER NOT NULL)")
            .execute(store.pool())
            .await
            .unwrap();
        Db { store, _dir: dir }
    }
}

mod pg_db {
    use idem_postgres::{PgConfig, PgStore};
    use idem_testkit::PgDatabase;
    pub struct Db {
        pub store: PgStore,
        pub db: PgDatabase,
    }
    impl Db {
        pub async fn count(&self) -> i64 {
            count!(self.store.pool(), "payments")
        }
        pub async fn keys(&self) -> i64 {
            count!(self.store.pool(), "idem_keys")
        }
    }
    pub async fn setup() -> Db {
        let db = PgDatabase::create("idem_http").await;
        let config = PgConfig {
            max_connections: 60,
            ..PgConfig::default()
        };
        let store = PgStore::connect(&db.url, config).await.unwrap();
        store.migrate().await.unwrap();
        sqlx::raw_sql("CREATE TABLE payments (id TEXT PRIMARY KEY, amount BIGINT NOT NULL)")
            .execute(store.pool())
            .await
            .unwrap();
        Db { store, db }
    }
}

mod spans;

http_suite!(sqlite, idem_sqlite::SqliteTx, sqlite_db);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locked_database_is_503_with_retry_after_and_nothing_written() {
    use axum::Extension;
    use idem_core::{Operation, Tenant};
    use idem_http::{IdemTx, IdempotencyLayer, RouteConfig, TenantSource};
    use idem_sqlite::{SqliteConfig, SqliteStore, SqliteTx};
    use sqlx::Connection;
    let dir = idem_testkit::TempDir::new("http-locked");
    let url = dir.sqlite_url();
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
}
http_suite!(postgres, idem_postgres::PgTx, pg_db);

/// The database goes away, first before a request, then in the middle of one
/// after the handler wrote: both are 503 + Retry-After with nothing written,
/// and once it is back the retry executes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_down_is_503_with_retry_after_and_nothing_half_written() {
    use axum::Extension;
    use idem_core::{Operation, Tenant};
    use idem_http::{IdemTx, IdempotencyLayer, RouteConfig, TenantSource};
    use idem_postgres::{PgConfig, PgStore, PgTx};
    use std::sync::Arc;
    use tokio::sync::Notify;

    let db = pg_db::setup().await;
    let proxy = idem_testkit::Proxy::start(idem_testkit::url_addr(&db.db.url)).await;
    let store = PgStore::connect(
        &idem_testkit::url_via(&db.db.url, proxy.addr),
        PgConfig {
            acquire_timeout: std::time::Duration::from_secs(1),
            ..PgConfig::default()
        },
    )
    .await
    .unwrap();

    #[derive(Clone)]
    struct Signals {
        inserted: Arc<Notify>,
        go_on: Arc<Notify>,
    }
    async fn create(
        Extension(tx): Extension<IdemTx<PgTx>>,
        Extension(sig): Extension<Signals>,
        body: Bytes,
    ) -> StatusCode {
        let mut tx = tx.lock().await.unwrap();
        let r = sqlx::query("INSERT INTO payments (id, amount) VALUES ('p', 1)")
            .execute(&mut **tx)
            .await;
        drop(tx);
        if r.is_err() {
            return StatusCode::INTERNAL_SERVER_ERROR;
        }
        if body.as_ref() == b"pause" {
            sig.inserted.notify_one();
            sig.go_on.notified().await;
        }
        StatusCode::CREATED
    }
    let sig = Signals {
        inserted: Arc::new(Notify::new()),
        go_on: Arc::new(Notify::new()),
    };
    let cfg = RouteConfig::required(
        Operation::new("payments.create").unwrap(),
        TenantSource::Static(Tenant::new("t").unwrap()),
    );
    let app = axum::Router::new()
        .route(
            "/payments",
            axum::routing::post(create).layer(IdempotencyLayer::new(store.clone(), cfg)),
        )
        .layer(Extension(sig.clone()));
    let req = |body: &'static str| {
        Request::post("/payments")
            .header("idempotency-key", "k-down")
            .body(Body::from(body))
            .unwrap()
    };
    let assert_503 = |res: Response, problem: &'static str| async move {
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        let secs: u64 = res.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(secs >= 1);
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(problem_type(&body), problem);
    };

    // 1. Down before the request arrives.
    proxy.cut().await;
    assert_503(
        app.clone().oneshot(req("pause")).await.unwrap(),
        "https://idem.dev/problems/store-unavailable",
    )
    .await;
    proxy.restore();
    assert_eq!(db.count().await + db.keys().await, 0, "nothing written");

    // 2. Down after the handler's insert, before the commit.
    let running = tokio::spawn(app.clone().oneshot(req("pause")));
    sig.inserted.notified().await;
    proxy.cut().await;
    sig.go_on.notify_one();
    // The key record goes to the server in one message with COMMIT: once
    // that message may have been sent on the dead connection, the client
    // cannot know it did not commit (here it did not; the retry below shows
    // it by executing).
    assert_503(
        running.await.unwrap().unwrap(),
        "https://idem.dev/problems/outcome-unknown",
    )
    .await;
    proxy.restore();
    assert_eq!(
        db.count().await + db.keys().await,
        0,
        "nothing half-written"
    );

    // 3. Back: the retry executes once, the next one replays.
    let res = app.clone().oneshot(req("fast")).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let res = app.oneshot(req("fast")).await.unwrap();
    assert_eq!(res.headers()["idempotent-replayed"], "true");
    assert_eq!(db.count().await, 1);
}

/// A PostgreSQL app behind a fault-injecting proxy: one insert per request,
/// then 201.
async fn pg_app_behind_proxy(
    tune: impl FnOnce(&mut idem_postgres::PgConfig),
) -> (axum::Router, pg_db::Db, idem_testkit::Proxy) {
    use axum::Extension;
    use idem_core::{Operation, Tenant};
    use idem_http::{IdemTx, IdempotencyLayer, RouteConfig, TenantSource};
    use idem_postgres::{PgConfig, PgStore, PgTx};
    let db = pg_db::setup().await;
    let proxy = idem_testkit::Proxy::start(idem_testkit::url_addr(&db.db.url)).await;
    let mut config = PgConfig {
        acquire_timeout: std::time::Duration::from_secs(1),
        ..PgConfig::default()
    };
    tune(&mut config);
    let store = PgStore::connect(&idem_testkit::url_via(&db.db.url, proxy.addr), config)
        .await
        .unwrap();
    async fn create(Extension(tx): Extension<IdemTx<PgTx>>) -> StatusCode {
        let mut tx = tx.lock().await.unwrap();
        match sqlx::query("INSERT INTO payments (id, amount) VALUES (gen_random_uuid()::text, 1)")
            .execute(&mut **tx)
            .await
        {
            Ok(_) => StatusCode::CREATED,
            Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
    let cfg = RouteConfig::required(
        Operation::new("payments.create").unwrap(),
        TenantSource::Static(Tenant::new("t").unwrap()),
    );
    let app = axum::Router::new().route(
        "/payments",
        axum::routing::post(create).layer(IdempotencyLayer::new(store, cfg)),
    );
    (app, db, proxy)
}

fn keyed(key: &str) -> Request<Body> {
    Request::post("/payments")
        .header("idempotency-key", key)
        .body(Body::empty())
        .unwrap()
}

async fn problem_of(res: Response) -> (StatusCode, Option<String>, serde_json::Value) {
    let status = res.status();
    let retry = res
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, retry, serde_json::from_slice(&body).unwrap())
}

/// The COMMIT reaches PostgreSQL and commits, its answer is lost: the client
/// is told the outcome is unknown — not that nothing was written — and the
/// retry with the same key tells the truth (a replay of the committed write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_commit_acknowledgement_is_outcome_unknown_and_the_retry_replays() {
    let (app, db, proxy) = pg_app_behind_proxy(|_| {}).await;
    proxy.cut_after_next_commit();
    let (status, retry, problem) =
        problem_of(app.clone().oneshot(keyed("k-lost")).await.unwrap()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(retry.is_some(), "Retry-After is set");
    assert_eq!(problem["type"], "https://idem.dev/problems/outcome-unknown");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("same Idempotency-Key")
    );
    assert_eq!((db.count().await, db.keys().await), (1, 1), "it did commit");
    let res = app.clone().oneshot(keyed("k-lost")).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(res.headers()["idempotent-replayed"], "true");
    assert_eq!(db.count().await, 1, "one effect");
}

/// The network goes silent (the proxy stops forwarding, sockets stay open):
/// the request gets 503 within the store's deadline instead of hanging, and
/// nothing is committed; once the network is back the retry executes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_database_is_503_within_the_deadline_and_nothing_commits() {
    let (app, db, proxy) = pg_app_behind_proxy(|c| {
        c.lock_timeout = std::time::Duration::from_millis(500);
        c.statement_timeout = std::time::Duration::from_secs(1);
    })
    .await;
    // Warm the pool, so the freeze catches an open connection mid-use.
    assert_eq!(
        app.clone().oneshot(keyed("k-warm")).await.unwrap().status(),
        StatusCode::CREATED
    );
    proxy.freeze();
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        app.clone().oneshot(keyed("k-silent")),
    )
    .await
    .expect("an answer, not a hang")
    .unwrap();
    let (status, retry, problem) = problem_of(answer).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(retry.is_some());
    assert_eq!(
        problem["type"],
        "https://idem.dev/problems/store-unavailable"
    );
    proxy.thaw();
    assert_eq!(
        (db.count().await, db.keys().await),
        (1, 1),
        "only the warm-up committed"
    );
    let res = app.oneshot(keyed("k-silent")).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert!(
        res.headers().get("idempotent-replayed").is_none(),
        "it executes now"
    );
    assert_eq!(db.count().await, 2);
}

/// Checkout that consumes a cart: a cart already consumed is a 404, which
/// the route does not store. Every effect is inside the transaction.
async fn consume_cart(
    axum::Extension(tx): axum::Extension<idem_http::IdemTx<idem_postgres::PgTx>>,
) -> Response {
    let Ok(mut tx) = tx.lock().await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let gone: Option<String> = sqlx::query_scalar("DELETE FROM carts WHERE id = 'c1' RETURNING id")
        .fetch_optional(&mut **tx)
        .await
        .unwrap();
    if gone.is_none() {
        return (StatusCode::NOT_FOUND, "no such cart").into_response();
    }
    sqlx::query("INSERT INTO payments (id, amount) VALUES ('order-c1', 1)")
        .execute(&mut **tx)
        .await
        .unwrap();
    drop(tx);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    (StatusCode::CREATED, r#"{"order":"order-c1"}"#).into_response()
}

/// On an optimistic route, a duplicate whose handler answers 404 because
/// the winner already consumed the cart (an answer the route does not
/// store) still gets the winner's stored 201, marked replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optimistic_loser_with_an_unstored_answer_replays_the_winner() {
    use idem_core::{Operation, Policy, Tenant};
    use idem_http::{IdempotencyLayer, RouteConfig, TenantSource};
    let db = pg_db::setup().await;
    sqlx::raw_sql("CREATE TABLE carts (id TEXT PRIMARY KEY); INSERT INTO carts VALUES ('c1')")
        .execute(db.store.pool())
        .await
        .unwrap();
    let mut config = RouteConfig::required(
        Operation::new("checkout").unwrap(),
        TenantSource::Static(Tenant::new("acme").unwrap()),
    );
    config.policy = Policy::default().optimistic();
    let app = axum::Router::new().route(
        "/checkout",
        axum::routing::post(consume_cart).layer(IdempotencyLayer::new(db.store.clone(), config)),
    );
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let req = Request::post("/checkout")
                .header("content-type", "application/json")
                .header("idempotency-key", "cart-c1")
                .body(Body::from("{}"))
                .unwrap();
            let res = app.oneshot(req).await.unwrap();
            let replayed = res.headers().contains_key("idempotent-replayed");
            let status = res.status();
            let body = res.into_body().collect().await.unwrap().to_bytes();
            (status, replayed, body)
        }));
    }
    let mut fresh = 0;
    for t in tasks {
        let (status, replayed, body) = t.await.unwrap();
        assert_eq!(
            status,
            StatusCode::CREATED,
            "every duplicate gets the winner's answer"
        );
        assert_eq!(&body[..], br#"{"order":"order-c1"}"#);
        fresh += usize::from(!replayed);
    }
    assert_eq!(fresh, 1, "one execution, the others marked replayed");
    assert_eq!(db.count().await, 1);
}

/// A store that was never migrated (no key table): the layer answers a
/// problem+json 500, not an empty one, and logs the database's error.
#[tokio::test]
async fn unmigrated_store_is_a_logged_problem_not_an_empty_500() {
    use idem_core::{Operation, Tenant};
    use idem_http::{IdempotencyLayer, RouteConfig, TenantSource};
    use idem_sqlite::{SqliteConfig, SqliteStore};
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Log(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Log {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let log = Log::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let dir = idem_testkit::TempDir::new("http-unmigrated");
    let store = SqliteStore::connect(&dir.sqlite_url(), SqliteConfig::default())
        .await
        .unwrap();
    // No `store.migrate()`.
    let cfg = RouteConfig::required(
        Operation::new("payments.create").unwrap(),
        TenantSource::Static(Tenant::new("t").unwrap()),
    );
    let app = axum::Router::new().route(
        "/payments",
        axum::routing::post(|| async { StatusCode::CREATED })
            .layer(IdempotencyLayer::new(store, cfg)),
    );
    let res = app.oneshot(keyed("k-1")).await.unwrap();
    assert_eq!(
        res.headers()["content-type"],
        "application/problem+json",
        "not an empty answer"
    );
    let (status, _, v) = problem_of(res).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(v["type"], "https://idem.dev/problems/internal");
    let logged = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert!(
        logged.contains("ERROR") && logged.contains("no such table"),
        "the store's error is logged: {logged}"
    );
}
