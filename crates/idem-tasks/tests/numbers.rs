//! Payloads, results and cursors are the client's JSON: a number keeps
//! every digit it was sent with — stored, claimed, shown and compared
//! exactly — on a real SQLite file and a real PostgreSQL. Equal values
//! spelled otherwise (key order, `1.0` and `1`, an exponent) are still the
//! same payload, result or cursor; two numbers that differ in their last
//! digit never are.
#![cfg(feature = "http")]
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use idem_core::Tenant;
use idem_core::steps::RunStore;
use idem_core::tasks::TaskStore;
use idem_http::TenantSource;
use idem_tasks::http::{HttpConfig, router};
use idem_tasks::{Tasks, TasksConfig};
use serde_json::value::RawValue;
use tower::ServiceExt;

/// 30 digits: far beyond what an `f64` (or an `i64`) holds.
const BIG: &str = "123456789012345678901234567890";
/// The same, but for its last digit.
const BIG_NEXT: &str = "123456789012345678901234567891";
/// `BIG` written otherwise: the same number.
const BIG_SPELLED: &str = "1.2345678901234567890123456789E+29";
/// A decimal with more significant digits than an `f64` keeps.
const LONG: &str = "0.1000000000000000000000000000000001";
/// The same, but for its last digit.
const LONG_NEXT: &str = "0.1000000000000000000000000000000002";

struct Answer {
    status: StatusCode,
    replayed: bool,
    text: String,
}

impl Answer {
    /// The raw JSON text of the member at `path` (object keys, array
    /// indices), exactly as the answer wrote it.
    fn raw(&self, path: &[&str]) -> String {
        let mut text = self.text.clone();
        for step in path {
            let next: Box<RawValue> = match step.parse::<usize>() {
                Ok(i) => serde_json::from_str::<Vec<Box<RawValue>>>(&text)
                    .unwrap_or_else(|e| panic!("{text}: {e}"))
                    .swap_remove(i),
                Err(_) => serde_json::from_str::<HashMap<String, Box<RawValue>>>(&text)
                    .unwrap_or_else(|e| panic!("{text}: {e}"))
                    .remove(*step)
                    .unwrap_or_else(|| panic!("no {step} in {text}")),
            };
            text = next.get().to_owned();
        }
        text
    }

    /// A string member at `path`.
    fn string(&self, path: &[&str]) -> String {
        serde_json::from_str(&self.raw(path)).unwrap()
    }
}

async fn send(app: &Router, method: &str, path: &str, key: Option<&str>, body: &str) -> Answer {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .header("x-tenant-id", "acme");
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    let body = if body.is_empty() {
        Body::empty()
    } else {
        Body::from(body.to_owned())
    };
    let res = app.clone().oneshot(req.body(body).unwrap()).await.unwrap();
    let status = res.status();
    let replayed = res.headers().get("idempotent-replayed").is_some();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        replayed,
        text: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

async fn app<S: TaskStore + RunStore>(store: S) -> Router {
    let tasks = Tasks::new(store, TasksConfig::default()).await.unwrap();
    let tenant = TenantSource::TrustedHeader {
        name: axum::http::HeaderName::from_static("x-tenant-id"),
        default: Tenant::new("default").ok(),
    };
    router(tasks, HttpConfig::new(tenant)).unwrap()
}

async fn on_sqlite(tag: &str) -> (Router, idem_testkit::TempDir) {
    let dir = idem_testkit::TempDir::new(tag);
    let store =
        idem_sqlite::SqliteStore::connect(&dir.sqlite_url(), idem_sqlite::SqliteConfig::default())
            .await
            .unwrap();
    store.migrate().await.unwrap();
    (app(store).await, dir)
}

async fn on_postgres(tag: &str) -> (Router, idem_testkit::PgDatabase) {
    let db = idem_testkit::PgDatabase::create(tag).await;
    let store = idem_postgres::PgStore::connect(&db.url, idem_postgres::PgConfig::default())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    (app(store).await, db)
}

/// The payload every test creates under key `k-1`.
fn payload() -> String {
    format!(r#"{{"a":{BIG},"b":{LONG},"c":[1.50,-0,2e3]}}"#)
}

async fn create(app: &Router, key: &str, payload: &str) -> Answer {
    let body = format!(r#"{{"payload":{payload}}}"#);
    send(app, "POST", "/v1/queues/q/tasks", Some(key), &body).await
}

async fn claim(app: &Router, key: &str) -> Answer {
    let claim = send(
        app,
        "POST",
        "/v1/queues/q/claims",
        Some(key),
        r#"{"worker":"w","lease":"30s"}"#,
    )
    .await;
    assert_eq!(claim.status, StatusCode::OK, "{}", claim.text);
    claim
}

/// A task's payload is stored, answered, claimed and shown with every
/// digit, also when a retry wrote it otherwise.
async fn payloads_keep_every_digit(app: Router) {
    let payload = payload();
    let first = create(&app, "k-1", &payload).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text);
    assert_eq!(
        first.raw(&["payload"]),
        payload,
        "the created task's payload"
    );
    let id = first.string(&["id"]);

    // The same value, written otherwise: keys reordered, white space, an
    // exponent, trailing zeros. The first answer again.
    let spelled = format!(r#"{{ "c": [1.5, 0, 2000.0], "b": {LONG}000, "a": {BIG_SPELLED} }}"#);
    let again = create(&app, "k-1", &spelled).await;
    assert_eq!(
        (again.status, again.replayed),
        (StatusCode::CREATED, true),
        "the same payload written otherwise: {}",
        again.text
    );
    assert_eq!(again.raw(&["payload"]), payload, "the replay's payload");

    let claim = claim(&app, "w:claim:1").await;
    assert_eq!(claim.string(&["tasks", "0", "id"]), id);
    assert_eq!(
        claim.raw(&["tasks", "0", "payload"]),
        payload,
        "the claimed payload"
    );
    let shown = send(&app, "GET", &format!("/v1/tasks/{id}"), None, "").await;
    assert_eq!(shown.raw(&["payload"]), payload, "the task shown");
}

#[tokio::test]
async fn payloads_keep_every_digit_on_sqlite() {
    let (app, _dir) = on_sqlite("tasks-numbers-payload").await;
    payloads_keep_every_digit(app).await;
}

#[tokio::test]
async fn payloads_keep_every_digit_on_postgres() {
    let (app, _db) = on_postgres("idem_tasks_numbers_payload").await;
    payloads_keep_every_digit(app).await;
}

/// The key of a payload with a payload that differs in a last digit is
/// `422 idempotency-key-reused`, and nothing changes.
async fn a_key_with_another_number_is_refused(app: Router) {
    let first = create(&app, "k-1", &payload()).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text);
    for other in [
        format!(r#"{{"a":{BIG_NEXT},"b":{LONG},"c":[1.50,-0,2e3]}}"#),
        format!(r#"{{"a":{BIG},"b":{LONG_NEXT},"c":[1.50,-0,2e3]}}"#),
    ] {
        let reused = create(&app, "k-1", &other).await;
        assert_eq!(
            (reused.status, reused.replayed),
            (StatusCode::UNPROCESSABLE_ENTITY, false),
            "the key with {other}: {}",
            reused.text
        );
        assert!(
            reused.text.contains("idempotency-key-reused"),
            "{}",
            reused.text
        );
    }
    let claim = claim(&app, "w:claim:1").await;
    assert_eq!(claim.raw(&["tasks", "0", "payload"]), payload());
}

#[tokio::test]
async fn a_key_with_another_number_is_refused_on_sqlite() {
    let (app, _dir) = on_sqlite("tasks-numbers-key").await;
    a_key_with_another_number_is_refused(app).await;
}

#[tokio::test]
async fn a_key_with_another_number_is_refused_on_postgres() {
    let (app, _db) = on_postgres("idem_tasks_numbers_key").await;
    a_key_with_another_number_is_refused(app).await;
}

/// The task `k-r` claimed: its id and fence.
async fn claimed(app: &Router) -> (String, String) {
    let created = create(app, "k-r", "{}").await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
    let claim = claim(app, "w:claim:r").await;
    (
        claim.string(&["tasks", "0", "id"]),
        claim.raw(&["tasks", "0", "fence"]),
    )
}

async fn complete(app: &Router, (id, fence): &(String, String), result: &str) -> Answer {
    let body = format!(r#"{{"fence":{fence},"result":{result}}}"#);
    send(
        app,
        "POST",
        &format!("/v1/tasks/{id}/complete"),
        None,
        &body,
    )
    .await
}

fn result() -> String {
    format!(r#"{{"total":{BIG},"ratio":{LONG}}}"#)
}

/// A result is kept and shown with every digit; completing again under
/// the fence with the same result written otherwise is a replay.
async fn results_keep_every_digit(app: Router) {
    let task = claimed(&app).await;
    let result = result();
    let done = complete(&app, &task, &result).await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.text);
    assert_eq!(done.raw(&["result"]), result, "the completed task's result");
    let spelled = format!(r#"{{"ratio":{LONG}0,"total":{BIG_SPELLED}}}"#);
    let again = complete(&app, &task, &spelled).await;
    assert_eq!(
        (again.status, again.replayed),
        (StatusCode::OK, true),
        "the same result written otherwise: {}",
        again.text
    );
    assert_eq!(again.raw(&["result"]), result, "the replay's result");
    let shown = send(&app, "GET", &format!("/v1/tasks/{}", task.0), None, "").await;
    assert_eq!(shown.raw(&["result"]), result, "the result shown");
}

#[tokio::test]
async fn results_keep_every_digit_on_sqlite() {
    let (app, _dir) = on_sqlite("tasks-numbers-result").await;
    results_keep_every_digit(app).await;
}

#[tokio::test]
async fn results_keep_every_digit_on_postgres() {
    let (app, _db) = on_postgres("idem_tasks_numbers_result").await;
    results_keep_every_digit(app).await;
}

/// Completing again under the fence with a result that differs in a last
/// digit is `422 result-mismatch`.
async fn a_fence_with_another_result_is_refused(app: Router) {
    let task = claimed(&app).await;
    let done = complete(&app, &task, &result()).await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.text);
    for other in [
        format!(r#"{{"total":{BIG_NEXT},"ratio":{LONG}}}"#),
        format!(r#"{{"total":{BIG},"ratio":{LONG_NEXT}}}"#),
    ] {
        let mismatch = complete(&app, &task, &other).await;
        assert_eq!(
            (mismatch.status, mismatch.replayed),
            (StatusCode::UNPROCESSABLE_ENTITY, false),
            "the fence completed again with {other}: {}",
            mismatch.text
        );
        assert!(
            mismatch.text.contains("result-mismatch"),
            "{}",
            mismatch.text
        );
    }
}

#[tokio::test]
async fn a_fence_with_another_result_is_refused_on_sqlite() {
    let (app, _dir) = on_sqlite("tasks-numbers-mismatch").await;
    a_fence_with_another_result_is_refused(app).await;
}

#[tokio::test]
async fn a_fence_with_another_result_is_refused_on_postgres() {
    let (app, _db) = on_postgres("idem_tasks_numbers_mismatch").await;
    a_fence_with_another_result_is_refused(app).await;
}

async fn observe(app: &Router, expected: &str, value: &str, key: &str) -> Answer {
    let body = format!(
        r#"{{"cursor":{{"expected":{expected},"value":{value}}},
            "tasks":[{{"queue":"q","key":"{key}","payload":{{"seen":{value}}}}}]}}"#
    );
    send(app, "POST", "/v1/pollers/p/observations", None, &body).await
}

fn first_cursor() -> String {
    format!(r#"{{"after":{BIG},"ratio":{LONG}}}"#)
}

fn second_cursor() -> String {
    format!(r#"{{"after":{BIG_NEXT},"ratio":{LONG}}}"#)
}

/// A cursor keeps every digit: in the observation's answer, the poller's
/// and the payloads of the tasks it created; the cursor it is at, written
/// otherwise, moves it (compared as JSON values), and a repeat is one.
async fn cursors_keep_every_digit(app: Router) {
    let first = first_cursor();
    let o1 = observe(&app, "null", &first, "o-1").await;
    assert_eq!(o1.status, StatusCode::OK, "{}", o1.text);
    assert_eq!(o1.raw(&["cursor"]), first, "the observation's cursor");
    let task = o1.string(&["tasks", "0", "id"]);
    let shown = send(&app, "GET", &format!("/v1/tasks/{task}"), None, "").await;
    assert_eq!(
        shown.raw(&["payload"]),
        format!(r#"{{"seen":{first}}}"#),
        "the observed task's payload"
    );
    let poller = send(&app, "GET", "/v1/pollers/p", None, "").await;
    assert_eq!(poller.raw(&["cursor"]), first, "the poller's cursor");

    let second = second_cursor();
    let spelled = format!(r#"{{"ratio":{LONG}00,"after":{BIG_SPELLED}}}"#);
    let o2 = observe(&app, &spelled, &second, "o-2").await;
    assert_eq!(o2.status, StatusCode::OK, "expected {spelled}: {}", o2.text);
    assert_eq!(o2.raw(&["repeated"]), "false");
    let repeat = observe(&app, &spelled, &second, "o-2").await;
    assert_eq!(repeat.status, StatusCode::OK, "{}", repeat.text);
    assert_eq!(repeat.raw(&["repeated"]), "true");
    let poller = send(&app, "GET", "/v1/pollers/p", None, "").await;
    assert_eq!(poller.raw(&["cursor"]), second, "the moved cursor");
}

#[tokio::test]
async fn cursors_keep_every_digit_on_sqlite() {
    let (app, _dir) = on_sqlite("tasks-numbers-cursor").await;
    cursors_keep_every_digit(app).await;
}

#[tokio::test]
async fn cursors_keep_every_digit_on_postgres() {
    let (app, _db) = on_postgres("idem_tasks_numbers_cursor").await;
    cursors_keep_every_digit(app).await;
}

/// An `expected` cursor that differs from the poller's in a last digit is
/// `409 cursor-moved`, with the cursor where it is; nothing is written.
async fn a_cursor_one_digit_off_is_elsewhere(app: Router) {
    let first = first_cursor();
    let o1 = observe(&app, "null", &first, "o-1").await;
    assert_eq!(o1.status, StatusCode::OK, "{}", o1.text);
    for stale in [
        format!(r#"{{"after":{BIG_NEXT},"ratio":{LONG}}}"#),
        format!(r#"{{"after":{BIG},"ratio":{LONG_NEXT}}}"#),
    ] {
        let moved = observe(&app, &stale, &second_cursor(), "o-2").await;
        assert_eq!(
            moved.status,
            StatusCode::CONFLICT,
            "expected {stale}: {}",
            moved.text
        );
        assert!(moved.text.contains("cursor-moved"), "{}", moved.text);
        assert_eq!(
            moved.raw(&["current"]),
            first,
            "the cursor-moved problem's current"
        );
    }
    let poller = send(&app, "GET", "/v1/pollers/p", None, "").await;
    assert_eq!(poller.raw(&["version"]), "1", "{}", poller.text);
}

#[tokio::test]
async fn a_cursor_one_digit_off_is_elsewhere_on_sqlite() {
    let (app, _dir) = on_sqlite("tasks-numbers-stale").await;
    a_cursor_one_digit_off_is_elsewhere(app).await;
}

#[tokio::test]
async fn a_cursor_one_digit_off_is_elsewhere_on_postgres() {
    let (app, _db) = on_postgres("idem_tasks_numbers_stale").await;
    a_cursor_one_digit_off_is_elsewhere(app).await;
}
