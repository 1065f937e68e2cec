//! `idem mail-sink`: a demo mail relay with the contract of a plain SMTP
//! relay — it does **not** deduplicate. `POST /messages`
//! `{"id","to","subject","body"}` → `202` (every accepted POST is a message,
//! duplicates included); `GET /messages/{id}` → `200` when a message with
//! that id was accepted, `404` otherwise; `GET /messages` lists every
//! accepted POST, so a tour can count them. Kept in memory, bounded.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use bytes::Bytes;
use serde_json::{Value, json};

use idem_admin::respond::{invalid, json_response, not_found, ok, problem};

/// Messages kept, at most; beyond, `POST` answers `507`.
pub const MAX_MESSAGES: usize = 100_000;

/// One accepted POST.
#[derive(Debug, Clone)]
struct Message {
    id: String,
    to: String,
    subject: String,
}

/// The relay's memory.
#[derive(Debug, Clone, Default)]
pub struct Sink(Arc<Mutex<Vec<Message>>>);

fn string(v: &Value, name: &str, max: usize) -> Result<String, Response> {
    match v.get(name).and_then(Value::as_str) {
        Some(s) if !s.is_empty() && s.len() <= max => Ok(s.to_owned()),
        _ => Err(invalid(&format!(
            "{name} must be a string of 1 to {max} bytes"
        ))),
    }
}

fn valid_message_id(id: &str) -> bool {
    (1..=255).contains(&id.len()) && id.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b'/')
}

async fn accept(State(sink): State<Sink>, body: Bytes) -> Response {
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return invalid(&format!("body is not valid JSON: {e}")),
    };
    let fields = (|| {
        let id = string(&v, "id", 255)?;
        if !valid_message_id(&id) {
            return Err(invalid(
                "id must be 1 to 255 visible ASCII characters without '/'",
            ));
        }
        Ok((
            id,
            string(&v, "to", 254)?,
            string(&v, "subject", 998)?,
            string(&v, "body", 60_000)?,
        ))
    })();
    let (id, to, subject, _body) = match fields {
        Ok(f) => f,
        Err(r) => return r,
    };
    let mut messages = sink.0.lock().unwrap_or_else(|e| e.into_inner());
    if messages.len() >= MAX_MESSAGES {
        return problem(
            StatusCode::INSUFFICIENT_STORAGE,
            "relay-full",
            "The relay keeps no more messages",
            None,
        );
    }
    tracing::info!(id, to, "message accepted");
    messages.push(Message {
        id: id.clone(),
        to,
        subject,
    });
    let copies = messages.iter().filter(|m| m.id == id).count();
    json_response(
        StatusCode::ACCEPTED,
        &json!({"id": id, "copies": copies}),
        None,
        None,
    )
}

async fn lookup(State(sink): State<Sink>, Path(id): Path<String>) -> Response {
    let messages = sink.0.lock().unwrap_or_else(|e| e.into_inner());
    let copies: Vec<&Message> = messages.iter().filter(|m| m.id == id).collect();
    match copies.first() {
        Some(m) => {
            ok(&json!({"id": m.id, "to": m.to, "subject": m.subject, "copies": copies.len()}))
        }
        None => not_found("No such message"),
    }
}

async fn list(State(sink): State<Sink>) -> Response {
    let messages = sink.0.lock().unwrap_or_else(|e| e.into_inner());
    let data: Vec<Value> = messages
        .iter()
        .map(|m| json!({"id": m.id, "to": m.to, "subject": m.subject}))
        .collect();
    ok(&json!({"data": data, "accepted": messages.len()}))
}

/// The relay's routes.
pub fn router(sink: Sink) -> Router {
    Router::new()
        .route("/messages", post(accept).get(list))
        .route("/messages/{id}", get(lookup))
        .layer(DefaultBodyLimit::max(64 << 10))
        .layer(idem_http::DeclaredLimitLayer::new(64 << 10))
        .with_state(sink)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn call(app: &Router, method: &str, path: &str, body: &str) -> (StatusCode, Value) {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(Body::from(body.to_owned()))
            .unwrap();
        let res = app.clone().oneshot(req).await.unwrap();
        let status = res.status();
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    #[tokio::test]
    async fn it_keeps_duplicates_and_says_what_it_has() {
        let app = router(Sink::default());
        let m = r#"{"id":"m-1","to":"a@b.c","subject":"s","body":"b"}"#;
        assert_eq!(
            call(&app, "POST", "/messages", m).await.0,
            StatusCode::ACCEPTED
        );
        let (status, v) = call(&app, "POST", "/messages", m).await;
        assert_eq!(
            (status, v["copies"].as_u64()),
            (StatusCode::ACCEPTED, Some(2)),
            "no dedupe"
        );
        assert_eq!(
            call(&app, "GET", "/messages/m-1", "").await.0,
            StatusCode::OK
        );
        assert_eq!(
            call(&app, "GET", "/messages/m-2", "").await.0,
            StatusCode::NOT_FOUND
        );
        assert_eq!(call(&app, "GET", "/messages", "").await.1["accepted"], 2);
        for bad in [
            "{",
            r#"{"id":"","to":"a","subject":"s","body":"b"}"#,
            r#"{"id":"a/b","to":"a","subject":"s","body":"b"}"#,
        ] {
            assert_eq!(
                call(&app, "POST", "/messages", bad).await.0,
                StatusCode::BAD_REQUEST,
                "{bad}"
            );
        }
        assert_eq!(
            call(&app, "GET", "/messages", "").await.1["accepted"],
            2,
            "bad input changes nothing"
        );
    }
}
