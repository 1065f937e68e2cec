//! Webhook ingest in `idem serve`: endpoints from a TOML file, `POST
//! /webhooks/{endpoint}`, the workers that forward stored deliveries, and the
//! operator's admin routes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, bail};
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use http_body_util::{BodyExt, Limited};
use idem_core::webhooks::{Receipt, ReceiptState, Requeue, WebhookStore};
use idem_webhooks::{
    Endpoint, EndpointConfig, Forward, Processor, ProcessorConfig, ReceiveError, Received, Receiver,
};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::demo::{db_error, json_response};

/// The configuration file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    webhooks: BTreeMap<String, EndpointConfig>,
    worker: Option<WorkerConfig>,
}

/// `[worker]`: how stored deliveries are processed.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkerConfig {
    /// How long a worker holds a delivery (default 60 s, 1 s to 1 h).
    lease_secs: Option<u64>,
    /// Failed forwards before a delivery is dead (default 8, 1 to 100).
    max_attempts: Option<u32>,
    /// Sleep between idle rounds (default 500 ms, 10 ms to 60 s).
    poll_interval_ms: Option<u64>,
    /// Deliveries of one endpoint forwarded at once (default 16, 1 to 256).
    concurrency: Option<u32>,
}

/// Validated webhook settings.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// The endpoints.
    pub endpoints: Vec<Endpoint>,
    /// The workers.
    pub worker: ProcessorConfig,
}

/// The largest configuration file read.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Reads and validates the configuration file.
pub fn load(path: &std::path::Path) -> anyhow::Result<WebhookConfig> {
    let size = std::fs::metadata(path)
        .with_context(|| format!("failed to read {}", path.display()))?
        .len();
    if size > MAX_CONFIG_BYTES {
        bail!(
            "{} is {size} bytes; the limit is {MAX_CONFIG_BYTES}",
            path.display()
        );
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read {}", path.display()))?;
    parse(&text).with_context(|| format!("invalid configuration in {}", path.display()))
}

/// Validates a configuration given as TOML text.
pub fn parse(text: &str) -> anyhow::Result<WebhookConfig> {
    let file: FileConfig = toml::from_str(text)
        .map_err(|e| anyhow::anyhow!(crate::config_error::redacted(text, &e)))?;
    let mut endpoints = Vec::new();
    for (name, config) in file.webhooks {
        let endpoint = Endpoint::from_config(&name, config)?;
        if endpoint.forward_to.is_none() {
            bail!(
                "webhooks.{name}.forward_to: required by idem serve (Rust handlers are registered through the library)"
            );
        }
        endpoints.push(endpoint);
    }
    let mut worker = ProcessorConfig::default();
    if let Some(w) = file.worker {
        if let Some(s) = w.lease_secs {
            if !(1..=3600).contains(&s) {
                bail!("worker.lease_secs: 1 to 3600");
            }
            worker.lease = Duration::from_secs(s);
        }
        if let Some(n) = w.max_attempts {
            if !(1..=100).contains(&n) {
                bail!("worker.max_attempts: 1 to 100");
            }
            worker.max_attempts = n;
        }
        if let Some(ms) = w.poll_interval_ms {
            if !(10..=60_000).contains(&ms) {
                bail!("worker.poll_interval_ms: 10 to 60000");
            }
            worker.poll_interval = Duration::from_millis(ms);
        }
        if let Some(n) = w.concurrency {
            if !(1..=256).contains(&n) {
                bail!("worker.concurrency: 1 to 256");
            }
            worker.concurrency = n;
        }
    }
    // A forward still running when its lease ends would be forwarded again by
    // another worker at the same time.
    for e in &endpoints {
        if e.forward_timeout >= worker.lease {
            bail!(
                "webhooks.{}.forward_timeout_secs: must be shorter than worker.lease_secs ({} s)",
                e.name,
                worker.lease.as_secs()
            );
        }
    }
    Ok(WebhookConfig { endpoints, worker })
}

/// The workers: each endpoint's deliveries forwarded to its `forward_to`,
/// each endpoint independently of the others.
pub fn processor<S: WebhookStore>(store: S, config: &WebhookConfig) -> Processor<S> {
    config
        .endpoints
        .iter()
        .fold(
            Processor::new(store, config.worker.clone()),
            |p, e| match Forward::for_endpoint(e) {
                Some(forward) => p.handler(&e.name, forward),
                None => p,
            },
        )
}

fn problem(status: StatusCode, slug: &str, title: &str, detail: Option<&str>) -> Response {
    idem_http::problem(status, slug, title, detail, None)
}

/// `POST /webhooks/{endpoint}`: body limit → verify → dedupe → persist → 202.
pub fn router<S: WebhookStore>(receiver: Arc<Receiver<S>>) -> Router {
    async fn receive<S: WebhookStore>(
        State(receiver): State<Arc<Receiver<S>>>,
        Path(name): Path<String>,
        headers: HeaderMap,
        body: Body,
    ) -> Response {
        let Some(endpoint) = receiver.endpoint(&name) else {
            return problem(
                StatusCode::NOT_FOUND,
                "unknown-endpoint",
                "No such webhook endpoint",
                None,
            );
        };
        // The limit applies while reading: a large body is never buffered.
        let body = match Limited::new(body, endpoint.max_body_bytes).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                receiver.note_too_large(&name);
                return idem_http::Rejection::BodyTooLarge.into_response();
            }
            Err(_) => {
                return problem(
                    StatusCode::BAD_REQUEST,
                    "unreadable-body",
                    "The request body could not be read",
                    None,
                );
            }
        };
        match receiver.receive(&name, &headers, &body).await {
            Ok(Received::New { delivery_id }) => json_response(
                StatusCode::ACCEPTED,
                &json!({"status": "accepted", "delivery_id": delivery_id}),
                None,
                None,
            ),
            Ok(Received::Duplicate { delivery_id }) => json_response(
                StatusCode::OK,
                &json!({"status": "duplicate", "delivery_id": delivery_id}),
                None,
                None,
            ),
            // One answer for every forgery: which check failed, or by how
            // much a timestamp missed, would help a forger. The receiver logs
            // the reason (rate-limited).
            Err(ReceiveError::Signature(_)) => problem(
                StatusCode::UNAUTHORIZED,
                "invalid-signature",
                "The webhook signature did not verify",
                None,
            ),
            Err(ReceiveError::TooLarge { .. }) => {
                idem_http::Rejection::BodyTooLarge.into_response()
            }
            Err(ReceiveError::UnknownEndpoint) => problem(
                StatusCode::NOT_FOUND,
                "unknown-endpoint",
                "No such webhook endpoint",
                None,
            ),
            Err(ReceiveError::Store(e)) => db_error(e),
            Err(e) => crate::demo::internal(e),
        }
    }
    Router::new()
        .route("/webhooks/{endpoint}", post(receive::<S>))
        .with_state(receiver)
}

/// A receipt as JSON; with `body`, the body too (as text when it is UTF-8).
pub fn receipt_json(r: &Receipt, body: bool) -> Value {
    let mut v = json!({
        "endpoint": r.receipt.endpoint,
        "delivery_id": r.receipt.delivery_id,
        "event_type": r.receipt.event_type,
        "state": r.state.as_str(),
        "attempts": r.attempts,
        "last_error": r.last_error,
        "entity_id": r.receipt.entity_id,
        "entity_version": r.receipt.entity_version,
        "received_at": crate::demo::rfc3339(r.received_at_ms),
        "finished_at": r.finished_at_ms.map(crate::demo::rfc3339),
    });
    if body {
        // Receipts stored before signatures were filtered out on receipt
        // still hold them: never show them.
        let headers: Vec<&(String, String)> = r
            .receipt
            .headers
            .iter()
            .filter(|(n, _)| !idem_webhooks::is_secret_header(n))
            .collect();
        v["headers"] = json!(headers);
        v["body"] = match std::str::from_utf8(&r.receipt.body) {
            Ok(s) => json!(s),
            Err(_) => json!(null),
        };
        v["body_bytes"] = json!(r.receipt.body.len());
    }
    v
}

/// The stored delivery ids an operator may mean by `given`, in the order
/// tried: as given, then without a leading `<endpoint>:` — the form the
/// upstream sees in `Idempotency-Key` (`github:4242:72d3…`). Each is mapped as
/// the receiver maps ids (over 255 bytes: `sha256:<hex>`). Input no stored
/// receipt can match (an invalid endpoint name, a control character) gives
/// none, so it never reaches the database.
fn delivery_forms(endpoint: &str, given: &str) -> Vec<String> {
    if !Endpoint::valid_name(endpoint) || given.is_empty() || given.chars().any(char::is_control) {
        return Vec::new();
    }
    let mut forms = vec![idem_webhooks::bounded_delivery_id(given).into_owned()];
    if let Some(rest) = given
        .strip_prefix(endpoint)
        .and_then(|r| r.strip_prefix(':'))
        .filter(|r| !r.is_empty())
    {
        forms.push(idem_webhooks::bounded_delivery_id(rest).into_owned());
    }
    forms
}

/// One receipt, by its delivery id in any form [`delivery_forms`] accepts.
pub async fn find_receipt<S: WebhookStore>(
    store: &S,
    endpoint: &str,
    delivery: &str,
) -> Result<Option<Receipt>, idem_core::StoreError> {
    for id in delivery_forms(endpoint, delivery) {
        if let Some(r) = store.get_receipt(endpoint, &id).await? {
            return Ok(Some(r));
        }
    }
    Ok(None)
}

/// An operator's replay of a delivery named in any form [`delivery_forms`]
/// accepts; the stored delivery id (or `delivery` when none matched) and what
/// the replay did.
pub async fn replay_receipt<S: WebhookStore>(
    store: &S,
    endpoint: &str,
    delivery: &str,
    now_ms: i64,
) -> Result<(String, Requeue), idem_core::StoreError> {
    for id in delivery_forms(endpoint, delivery) {
        match store.replay_receipt(endpoint, &id, now_ms).await? {
            Requeue::NotFound => {}
            outcome => return Ok((id, outcome)),
        }
    }
    Ok((delivery.to_owned(), Requeue::NotFound))
}

/// What a replay did, as JSON.
pub fn replay_json(endpoint: &str, delivery: &str, outcome: Requeue) -> (StatusCode, Value) {
    let (status, result, message) = match outcome {
        Requeue::Requeued => (
            StatusCode::ACCEPTED,
            "requeued",
            "the delivery will be processed again".to_owned(),
        ),
        Requeue::AlreadyQueued => (
            StatusCode::OK,
            "already_queued",
            "the delivery is waiting for a worker".to_owned(),
        ),
        Requeue::AlreadyFinished(s) => (
            StatusCode::OK,
            "no_op",
            format!("the delivery is {s}; replaying it would apply it twice, so nothing was done"),
        ),
        Requeue::NotFound => (
            StatusCode::NOT_FOUND,
            "not_found",
            "no such delivery".to_owned(),
        ),
    };
    (
        status,
        json!({"endpoint": endpoint, "delivery_id": delivery, "result": result, "message": message}),
    )
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    endpoint: Option<String>,
    state: Option<String>,
    limit: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct OneQuery {
    endpoint: String,
    delivery: String,
}

fn bad_query(detail: &str) -> Response {
    problem(
        StatusCode::BAD_REQUEST,
        "invalid-request",
        "The request is invalid",
        Some(detail),
    )
}

/// Admin routes: `GET /admin/webhooks`, `GET /admin/webhooks/receipt`,
/// `POST /admin/webhooks/replay`, `GET /admin/webhooks/stats`.
pub fn admin_router<S: WebhookStore>(store: S, receiver: Arc<Receiver<S>>) -> Router {
    type St<S> = (S, Arc<Receiver<S>>);
    async fn list<S: WebhookStore>(
        State((store, _)): State<St<S>>,
        Query(q): Query<ListQuery>,
    ) -> Response {
        let state = match q.state.as_deref().map(ReceiptState::parse) {
            Some(None) => {
                return bad_query("state must be received, processed, failed, dead or stale");
            }
            Some(s) => s,
            None => None,
        };
        if q.endpoint
            .as_deref()
            .is_some_and(|e| !Endpoint::valid_name(e))
        {
            return bad_query("endpoint must be 1 to 64 characters of [A-Za-z0-9_-]");
        }
        let limit = q.limit.unwrap_or(100);
        if !(1..=1000).contains(&limit) {
            return bad_query("limit must be between 1 and 1000");
        }
        match store
            .list_receipts(q.endpoint.as_deref(), state, limit)
            .await
        {
            Ok(rs) => json_response(
                StatusCode::OK,
                &json!({"data": rs.iter().map(|r| receipt_json(r, false)).collect::<Vec<_>>()}),
                None,
                None,
            ),
            Err(e) => db_error(e),
        }
    }
    async fn show<S: WebhookStore>(
        State((store, _)): State<St<S>>,
        Query(q): Query<OneQuery>,
    ) -> Response {
        match find_receipt(&store, &q.endpoint, &q.delivery).await {
            Ok(Some(r)) => json_response(StatusCode::OK, &receipt_json(&r, true), None, None),
            Ok(None) => problem(StatusCode::NOT_FOUND, "not-found", "No such delivery", None),
            Err(e) => db_error(e),
        }
    }
    async fn replay<S: WebhookStore>(
        State((store, _)): State<St<S>>,
        Query(q): Query<OneQuery>,
    ) -> Response {
        let now = idem_core::Clock::now_ms(&idem_core::SystemClock);
        match replay_receipt(&store, &q.endpoint, &q.delivery, now).await {
            Ok((delivery, outcome)) => {
                let (status, body) = replay_json(&q.endpoint, &delivery, outcome);
                json_response(status, &body, None, None)
            }
            Err(e) => db_error(e),
        }
    }
    async fn stats<S: WebhookStore>(State((_, receiver)): State<St<S>>) -> Response {
        let counters: serde_json::Map<String, Value> = receiver
            .counters()
            .map(|(name, c)| {
                (
                    name.to_owned(),
                    json!({
                        "accepted": c.accepted.load(Ordering::Relaxed),
                        "duplicates": c.duplicates.load(Ordering::Relaxed),
                        "rejected_signature": c.rejected_signature.load(Ordering::Relaxed),
                        "too_large": c.too_large.load(Ordering::Relaxed),
                    }),
                )
            })
            .collect();
        json_response(StatusCode::OK, &Value::Object(counters), None, None)
    }
    Router::new()
        .route("/admin/webhooks", get(list::<S>))
        .route("/admin/webhooks/receipt", get(show::<S>))
        .route("/admin/webhooks/replay", post(replay::<S>))
        .route("/admin/webhooks/stats", get(stats::<S>))
        .with_state((store, receiver))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_forms_accept_the_idempotency_key_form() {
        assert_eq!(delivery_forms("github", "4242:abc"), ["4242:abc"]);
        assert_eq!(
            delivery_forms("github", "github:4242:abc"),
            ["github:4242:abc", "4242:abc"],
            "as given first: an id may itself start with the endpoint's name"
        );
        assert_eq!(delivery_forms("github", "github:"), ["github:"]);
        let long = "x".repeat(300);
        let hashed = idem_webhooks::bounded_delivery_id(&long).into_owned();
        assert_eq!(
            delivery_forms("github", &long),
            std::slice::from_ref(&hashed)
        );
        assert_eq!(
            delivery_forms("github", &format!("github:{long}")),
            [
                idem_webhooks::bounded_delivery_id(&format!("github:{long}")).into_owned(),
                hashed
            ]
        );
        assert!(delivery_forms("github", "a\0b").is_empty());
        assert!(delivery_forms("git\0hub", "a").is_empty());
        assert!(delivery_forms("github", "").is_empty());
    }

    #[test]
    fn configuration_errors_name_the_setting() {
        let ok = parse(
            r#"
            [webhooks.github]
            scheme = "github"
            secrets = ["a", "b"]
            forward_to = "http://127.0.0.1:9000/hooks/github"
            entity_id = "/repository/id"
            forward_timeout_secs = 4
            [worker]
            lease_secs = 5
            "#,
        )
        .unwrap();
        assert_eq!(ok.endpoints.len(), 1);
        assert_eq!(ok.worker.lease, Duration::from_secs(5));
        let err = |text: &str| format!("{:#}", parse(text).unwrap_err());
        assert!(
            err("[webhooks.x]\nscheme = \"github\"\nsecrets = [\"a\"]")
                .contains("webhooks.x.forward_to")
        );
        assert!(
            err("[webhooks.x]\nscheme = \"gitlab\"\nsecrets = [\"a\"]").contains("unknown variant")
        );
        assert!(err("[webhooks.x]\nscheme = \"github\"\nsecret = \"a\"").contains("unknown field"));
        assert!(err("[worker]\nlease_secs = 0").contains("worker.lease_secs"));
        assert!(err("[worker]\nconcurrency = 0").contains("worker.concurrency"));
        let slow =
            "[webhooks.x]\nscheme = \"github\"\nsecrets = [\"a\"]\nforward_to = \"http://h/\"\n";
        assert!(
            err(&format!("{slow}[worker]\nlease_secs = 10")).contains(
                "webhooks.x.forward_timeout_secs: must be shorter than worker.lease_secs (10 s)"
            ),
            "the default 10 s forward timeout needs a longer lease"
        );
        assert_eq!(
            parse(&format!(
                "{slow}forward_timeout_secs = 9\n[worker]\nlease_secs = 10"
            ))
            .unwrap()
            .endpoints[0]
                .forward_timeout,
            Duration::from_secs(9)
        );
        assert!(
            err("[webhooks.x]\nscheme = \"github\"\nforward_to = \"http://h/\"")
                .contains("webhooks.x.secrets")
        );
    }
}
