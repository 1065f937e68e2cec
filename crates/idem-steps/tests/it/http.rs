//! `WorkflowService` behind axum: the Idempotency-Key contract for runs.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post_service;
use http_body_util::BodyExt;
use idem_core::steps::RunId;
use idem_core::{Operation, Tenant};
use idem_http::{RouteConfig, TenantSource};
use idem_steps::{RunsConfig, WorkflowService};
use tower::ServiceExt;

use crate::eventually;
use crate::support::*;

struct Answer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }
    fn problem(&self) -> String {
        self.json()["type"]
            .as_str()
            .unwrap()
            .rsplit('/')
            .next()
            .unwrap()
            .to_owned()
    }
}

async fn post(app: &Router, key: Option<&str>, body: &str) -> Answer {
    let mut req = Request::post("/orders").header("content-type", "application/json");
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    let res = app
        .clone()
        .oneshot(req.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let (parts, body) = res.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes().to_vec(),
    }
}

fn app<S: TestStore>(store: S, flow: Flow, config: RunsConfig, within: Duration) -> Router {
    let runs = runs(store, flow, config);
    let mut route = RouteConfig::required(
        Operation::new(OP).unwrap(),
        TenantSource::Static(Tenant::new("acme").unwrap()),
    );
    route.policy = route.policy.wait(Duration::from_millis(200));
    let service = WorkflowService::new(runs, route)
        .unwrap()
        .respond_within(within)
        .unwrap();
    Router::new().route("/orders", post_service(service))
}

/// Fresh key: the run's answer; the retry: the same bytes, marked replayed;
/// another body: 422; no key: 400; an answer the route does not keep (a
/// validation 400) uses nothing up.
pub async fn the_key_contract_holds_for_runs<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let flow = Flow::new(Plan::default());
    let app = app(
        store.clone(),
        flow.clone(),
        quick(),
        Duration::from_secs(10),
    );
    let first = post(&app, Some("h-1"), "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(first.headers.get("idempotent-replayed").is_none());
    let again = post(&app, Some("h-1"), "{}").await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(again.body, first.body, "byte-identical");
    assert_eq!(again.headers["content-type"], "application/json");
    let other = post(&app, Some("h-1"), r#"{"x":1}"#).await;
    assert_eq!(
        (other.status, other.problem().as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused")
    );
    let none = post(&app, None, "{}").await;
    assert_eq!(
        (none.status, none.problem().as_str()),
        (StatusCode::BAD_REQUEST, "missing-idempotency-key")
    );
    assert_eq!(flow.provider.charges(None), 1);

    let invalid = post(&app, Some("h-2"), "invalid").await;
    assert_eq!(invalid.status, StatusCode::BAD_REQUEST);
    assert!(
        store
            .load_run(&RunId::of(&store.namespace().await.unwrap(), &scope("h-2")))
            .await
            .unwrap()
            .is_none(),
        "no run"
    );
    assert!(
        store.fetch(&scope("h-2")).await.unwrap().is_none(),
        "the key is not used up"
    );
    // At once: the discarded claim was rolled back, not left holding the key.
    for _ in 0..5 {
        let invalid = post(&app, Some("h-3"), "invalid").await;
        assert_eq!(invalid.status, StatusCode::BAD_REQUEST);
    }
    let valid = post(&app, Some("h-3"), "{}").await;
    assert_eq!(
        valid.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&valid.body)
    );

    // An input is the client's bytes, every digit kept; a number one digit
    // off under the key is another request, the same value written
    // otherwise the same.
    let big = r#"{"x": 123456789012345678901234567890}"#;
    assert_eq!(
        post(&app, Some("h-4"), big).await.status,
        StatusCode::CREATED
    );
    let run = store
        .load_run(&RunId::of(&store.namespace().await.unwrap(), &scope("h-4")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(run.input, big.as_bytes(), "the run's input as sent");
    let spelled = post(
        &app,
        Some("h-4"),
        r#"{"x":1.2345678901234567890123456789e29}"#,
    )
    .await;
    assert_eq!(spelled.headers["idempotent-replayed"], "true");
    let next = post(&app, Some("h-4"), r#"{"x":123456789012345678901234567891}"#).await;
    assert_eq!(
        (next.status, next.problem().as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused")
    );
}

/// A run that outlives the request: 202 for the request that started it,
/// 409 + Retry-After for a retry while it lives, its stored answer after.
pub async fn a_slow_run_is_accepted_then_replayed<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let gate = Gate::new();
    let flow = Flow::new(Plan {
        hold_charge: Some(gate.clone()),
        ..Plan::default()
    });
    let ns = store.namespace().await.unwrap();
    let app = app(
        store,
        flow,
        RunsConfig::default(),
        Duration::from_millis(300),
    );
    let first = post(&app, Some("h-slow"), "{}").await;
    assert_eq!(first.status, StatusCode::ACCEPTED);
    assert_eq!(
        first.json()["run"],
        RunId::of(&ns, &scope("h-slow")).as_str()
    );
    let busy = post(&app, Some("h-slow"), "{}").await;
    assert_eq!(
        (busy.status, busy.problem().as_str()),
        (StatusCode::CONFLICT, "request-in-flight")
    );
    assert!(busy.headers.get("retry-after").is_some());
    gate.open();
    let mut done;
    eventually!("the run finishes and is replayed", {
        done = post(&app, Some("h-slow"), "{}").await;
        done.status == StatusCode::CREATED
    });
    assert_eq!(done.headers["idempotent-replayed"], "true");
}

/// A run waiting for an operator: 409 needs-attention, never executed again.
pub async fn a_blocked_run_answers_needs_attention<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let flow = Flow::new(Plan {
        mail: Mail::AtMostOnce,
        ..Plan::default()
    });
    flow.sink.0.lock().unwrap().lose_answers = 1;
    let app = app(store, flow.clone(), quick(), Duration::from_secs(10));
    let first = post(&app, Some("h-amo"), "{}").await;
    assert_eq!(
        (first.status, first.problem().as_str()),
        (StatusCode::CONFLICT, "needs-attention")
    );
    let again = post(&app, Some("h-amo"), "{}").await;
    assert_eq!(
        (again.status, again.problem().as_str()),
        (StatusCode::CONFLICT, "needs-attention")
    );
    assert!(again.headers.get("retry-after").is_some());
    assert_eq!(flow.sink.accepted().len(), 1);
}

/// With every run slot taken, a new key gets 503 at-capacity and nothing
/// is written.
pub async fn no_slot_no_run<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let gate = Gate::new();
    let flow = Flow::new(Plan {
        hold_charge: Some(gate.clone()),
        ..Plan::default()
    });
    let config = RunsConfig {
        max_concurrent: 1,
        ..RunsConfig::default()
    };
    let app = app(store.clone(), flow, config, Duration::from_millis(100));
    assert_eq!(
        post(&app, Some("h-cap-1"), "{}").await.status,
        StatusCode::ACCEPTED
    );
    let full = post(&app, Some("h-cap-2"), "{}").await;
    assert_eq!(
        (full.status, full.problem().as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "at-capacity")
    );
    assert!(
        store.fetch(&scope("h-cap-2")).await.unwrap().is_none(),
        "nothing written"
    );
    gate.open();
}
