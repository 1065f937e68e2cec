//! `idem drill` against a correct server whose answer is streamed: its
//! head goes out at once, its body when the payment is done, 7 s later
//! (longer than the 6 s a retry of the drill waits without `Retry-After`,
//! within its 10 s timeout).
//! A retry while the payment runs is answered `409` (no `Retry-After`,
//! as many APIs do), after it the stored answer; the payment and its
//! record finish whether or not the client is still there. Found by
//! attacking issue 36's drill: lost-response and abandoned-request took
//! the first byte of the answer for the end of the first request, so
//! their retries' 409s — sent while the body was still coming — were a
//! FAIL ("its answer is never given back") on a server that gives it back
//! as soon as it exists.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

use crate::drill_runner::{drill, drill_args, drill_named, report};

/// How long the payment takes after the answer's head was sent.
const WORK: Duration = Duration::from_secs(7);

#[derive(Default)]
struct Store {
    /// Per key: its body and, once the payment is done, the answer.
    keys: HashMap<String, (Bytes, Option<Vec<u8>>)>,
    /// The effects: one customer per payment.
    payments: Vec<String>,
}

type Shared = Arc<Mutex<Store>>;

async fn list(State(store): State<Shared>, Query(q): Query<HashMap<String, String>>) -> Response {
    let customer = q.get("customer").cloned().unwrap_or_default();
    let store = store.lock().unwrap();
    let data: Vec<Value> = store
        .payments
        .iter()
        .filter(|c| **c == customer)
        .map(|c| json!({"customer": c}))
        .collect();
    (
        [(header::CONTENT_TYPE, "application/json")],
        json!({ "data": data }).to_string(),
    )
        .into_response()
}

async fn create(State(store): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let keys: Vec<_> = headers.get_all("idempotency-key").iter().collect();
    let key = match keys.as_slice() {
        [k] => String::from_utf8_lossy(k.as_bytes()).into_owned(),
        _ => return StatusCode::BAD_REQUEST.into_response(),
    };
    if key.is_empty() || key.len() > 255 || key.chars().any(char::is_control) {
        return StatusCode::BAD_REQUEST.into_response();
    }
    let customer = request["customer"].as_str().unwrap_or_default().to_owned();
    {
        let mut s = store.lock().unwrap();
        match s.keys.get(&key) {
            Some((first, _)) if *first != body => {
                return StatusCode::UNPROCESSABLE_ENTITY.into_response();
            }
            Some((_, None)) => return StatusCode::CONFLICT.into_response(),
            Some((_, Some(answer))) => {
                return (
                    StatusCode::CREATED,
                    [(header::CONTENT_TYPE, "application/json")],
                    [("idempotent-replayed", "true")],
                    answer.clone(),
                )
                    .into_response();
            }
            None => {
                s.keys.insert(key.clone(), (body.clone(), None));
                s.payments.push(customer.clone());
            }
        }
    }
    // The payment finishes and is recorded whatever becomes of the client.
    let (tx, rx) = tokio::sync::oneshot::channel::<Vec<u8>>();
    tokio::spawn(async move {
        tokio::time::sleep(WORK).await;
        let answer = json!({"customer": customer, "status": "succeeded"})
            .to_string()
            .into_bytes();
        if let Some(entry) = store.lock().unwrap().keys.get_mut(&key) {
            entry.1 = Some(answer.clone());
        }
        let _ = tx.send(answer);
    });
    let stream = futures_util::stream::once(async move {
        rx.await
            .map(Bytes::from)
            .map_err(|_| std::io::Error::other("the payment task ended"))
    });
    (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(stream),
    )
        .into_response()
}

async fn start() -> SocketAddr {
    let app = Router::new()
        .route("/v1/payments", post(create).get(list))
        .with_state(Shared::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_is_not_taken_for_a_finished_request() {
    let addr = start().await;
    let mut args = drill_args(addr);
    args.extend(["--json", "--rounds", "1"].map(String::from));
    let out = drill(args).await;
    let r = report(&out);
    for name in ["lost-response", "abandoned-request"] {
        let d = drill_named(&r, name);
        assert_ne!(
            d["outcome"], "fail",
            "{name} failed a server that gives the answer back once it exists: {}",
            d["summary"]
        );
    }
    assert_eq!(out.status.code(), Some(0), "{r:#}");
}
