//! The clients: base URLs checked, and each failure classified by what it
//! says about the effect, with peers on loopback.

use super::*;

#[test]
fn base_urls_are_checked() {
    assert_eq!(
        base_url("--provider-url", "http://127.0.0.1:9/").unwrap(),
        "http://127.0.0.1:9"
    );
    assert!(base_url("--provider-url", "https://x").is_err());
    assert!(base_url("--provider-url", "ftp://x").is_err());
    assert!(base_url("--provider-url", "x").is_err());
    assert!(base_url("--provider-url", "http://x/?a=1").is_err());
    let creds = base_url("--provider-url", "http://user:pw@127.0.0.1:9").unwrap_err();
    assert!(creds.to_string().contains("credentials") && !creds.to_string().contains("pw"));
    assert_eq!(
        base_url("--mail-url", "http://127.0.0.1:9/relay").unwrap(),
        "http://127.0.0.1:9/relay"
    );
}

#[tokio::test]
async fn a_refused_connection_did_nothing_and_may_be_retried() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let p = Provider(
        Endpoint::new(&format!("http://127.0.0.1:{port}"), Duration::from_secs(2)).unwrap(),
    );
    let e = p
        .charge("k", "cus_1", 100, "EUR", "ord_1")
        .await
        .unwrap_err();
    assert!(matches!(e, StepError::Retry(_)), "{e:?}");
}

#[test]
fn failures_say_what_they_know() {
    let b = Bytes::from_static(b"{}");
    let c = |s: u16| classify("charge", StatusCode::from_u16(s).unwrap(), s, &b);
    assert!(matches!(c(409), StepError::Retry(_)));
    assert!(matches!(c(503), StepError::Unknown(_)));
    assert!(matches!(c(422), StepError::Permanent(_)));
}

/// A provider and relay on loopback: the customer says how the charge is
/// answered; every request is counted.
async fn peer(hits: std::sync::Arc<std::sync::atomic::AtomicUsize>) -> String {
    use axum::http::{HeaderMap, StatusCode as S};
    use axum::response::IntoResponse;
    use std::sync::atomic::Ordering;
    let charges = hits.clone();
    let app = axum::Router::new()
        .route(
            "/v1/payments",
            axum::routing::post(move |headers: HeaderMap, body: String| {
                charges.fetch_add(1, Ordering::SeqCst);
                async move {
                    let v: Value = serde_json::from_str(&body).unwrap_or_default();
                    let key = headers.get("idempotency-key").and_then(|k| k.to_str().ok());
                    match v["customer"].as_str().unwrap_or_default() {
                        "cus_down" => (S::SERVICE_UNAVAILABLE, "down").into_response(),
                        "cus_busy" => (
                            S::CONFLICT,
                            [("retry-after", "1")],
                            r#"{"type":"https://idem.dev/problems/request-in-flight"}"#,
                        )
                            .into_response(),
                        "cus_decline" => S::PAYMENT_REQUIRED.into_response(),
                        "cus_slow" => {
                            tokio::time::sleep(Duration::from_secs(3)).await;
                            (S::CREATED, r#"{"id":"pay_slow"}"#).into_response()
                        }
                        _ if key == Some("k-1") => {
                            (S::CREATED, r#"{"id":"pay_1"}"#).into_response()
                        }
                        _ => S::BAD_REQUEST.into_response(),
                    }
                }
            }),
        )
        .route(
            "/messages/{id}",
            axum::routing::get(|| async { S::NOT_FOUND }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

#[tokio::test]
async fn each_exchange_is_one_attempt_classified_by_its_answer() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let hits = std::sync::Arc::new(AtomicUsize::new(0));
    let base = peer(hits.clone()).await;
    let p = Provider(Endpoint::new(&base, Duration::from_millis(500)).unwrap());
    let charge = |customer: &'static str| p.charge("k-1", customer, 100, "EUR", "ord_1");

    // The given key is the one sent.
    assert_eq!(
        charge("cus_1").await.unwrap(),
        Charge::Paid {
            payment_id: "pay_1".into()
        }
    );
    assert_eq!(charge("cus_decline").await.unwrap(), Charge::Declined);
    // Answers the client would retry come back after one attempt, and are
    // classified as before: a 5xx may have charged, a 409 in flight will pass.
    let e = charge("cus_down").await.unwrap_err();
    assert!(
        matches!(&e, StepError::Unknown(m) if m.contains("503") && m.contains("down")),
        "{e:?}"
    );
    let e = charge("cus_busy").await.unwrap_err();
    assert!(
        matches!(&e, StepError::Retry(m) if m.contains("409")),
        "{e:?}"
    );
    // No complete answer within the timeout: it may have charged.
    let e = charge("cus_slow").await.unwrap_err();
    assert!(
        matches!(&e, StepError::Unknown(m) if m.contains("no complete answer")),
        "{e:?}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 5, "one attempt per exchange");

    let mail = Mail(Endpoint::new(&base, Duration::from_millis(500)).unwrap());
    assert!(!mail.has("confirm-ord_1").await.unwrap());
    assert!(matches!(
        mail.has("a b").await.unwrap_err(),
        StepError::Permanent(_)
    ));
}
