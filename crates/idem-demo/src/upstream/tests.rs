//! The upstream's routes, called in-process.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{Value, json};

use super::*;
use axum::body::Body;
use http_body_util::BodyExt;
use tower::ServiceExt;

async fn call(
    app: &Router,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> (StatusCode, bool, Value) {
    let mut req = axum::http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json");
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    let res = app
        .clone()
        .oneshot(req.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let replayed = res.headers().get("idempotent-replayed").is_some();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        replayed,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

const PAY: &str = r#"{"amount":1,"customer":"c1"}"#;

#[tokio::test]
async fn naive_mode_makes_a_payment_per_post_whatever_the_key() {
    let app = app(Upstream::new(Mode::Naive, Duration::ZERO), |r| r);
    for _ in 0..2 {
        let (status, replayed, _) = call(&app, "POST", "/v1/payments", Some("k"), PAY).await;
        assert_eq!((status, replayed), (StatusCode::CREATED, false));
    }
    let (_, _, list) = call(&app, "GET", "/v1/payments?customer=c1", None, "").await;
    assert_eq!(list["data"].as_array().unwrap().len(), 2);
    let (_, _, stats) = call(&app, "GET", "/_upstream/stats", None, "").await;
    assert_eq!(stats["requests"], 3, "the stats route is not counted");
}

#[tokio::test]
async fn check_then_act_replays_a_later_retry_and_patch_changes_the_payment() {
    let app = app(Upstream::new(Mode::CheckThenAct, Duration::ZERO), |r| r);
    let (_, _, first) = call(&app, "POST", "/v1/payments", Some("k"), PAY).await;
    let (status, replayed, again) = call(&app, "POST", "/v1/payments", Some("k"), PAY).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true));
    assert_eq!(again, first);
    let path = format!("/v1/payments/{}", first["id"].as_str().unwrap());
    let (status, _, patched) = call(&app, "PATCH", &path, None, r#"{"amount":5}"#).await;
    assert_eq!((status, &patched["amount"]), (StatusCode::OK, &json!(5)));
    let (_, _, replay) = call(&app, "POST", "/v1/payments", Some("k"), PAY).await;
    assert_eq!(replay["amount"], 1, "the stored answer, not the resource");
    for bad in ["[1]", "{"] {
        let (status, _, _) = call(&app, "POST", "/v1/payments", None, bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }
    let big = format!(r#"{{"x":"{}"}}"#, "a".repeat(MAX_BODY_BYTES));
    let (status, _, _) = call(&app, "POST", "/v1/payments", None, &big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn forms_are_payments_too_references_are_looked_up_and_first_answers_can_be_lost() {
    let up = Upstream::losing_first_answers(Mode::Naive, Duration::ZERO);
    let app = app(up, |r| r);
    let form = |key: Option<&str>| {
        let mut req = axum::http::Request::builder()
            .method("POST")
            .uri("/v1/payments")
            .header("content-type", "application/x-www-form-urlencoded");
        if let Some(k) = key {
            req = req.header("idempotency-key", k);
        }
        req.body(Body::from("amount=1000&reference=ord%201"))
            .unwrap()
    };
    let lost = app.clone().oneshot(form(Some("k1"))).await.unwrap();
    assert!(
        lost.extensions()
            .get::<idem_httpd::CloseWithoutAnswer>()
            .is_some(),
        "the first answer of a key is lost"
    );
    let again = app.clone().oneshot(form(Some("k1"))).await.unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    assert!(
        again
            .extensions()
            .get::<idem_httpd::CloseWithoutAnswer>()
            .is_none()
    );
    let unkeyed = app.clone().oneshot(form(None)).await.unwrap();
    assert!(
        unkeyed
            .extensions()
            .get::<idem_httpd::CloseWithoutAnswer>()
            .is_none(),
        "no key: answered"
    );
    let (status, _, found) = call(&app, "GET", "/v1/payments?reference=ord%201", None, "").await;
    assert_eq!(status, StatusCode::OK);
    let data = found["data"].as_array().unwrap();
    assert_eq!(data.len(), 3, "naive: every POST is a payment, lost or not");
    assert_eq!(data[0]["amount"], "1000", "form fields are strings");
    let (status, _, _) = call(&app, "GET", "/v1/payments", None, "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _, _) = call(&app, "GET", "/v1/payments?reference=a&customer=b", None, "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "one or the other");
}
