//! The demo payments API, written with the library the way a user would write
//! theirs. The handlers are written once and instantiated per backend.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use idem_core::{Clock, Migration, ResourceRef, SystemClock};
use serde_json::{Value, json};

const DEMO_PAYMENTS: Migration = Migration {
    version: 1,
    name: "demo_payments",
    sql: include_str!("../migrations/0001_demo.sql"),
};
const DEMO_EFFECTS: Migration = Migration {
    version: 2,
    name: "demo_effects",
    sql: include_str!("../migrations/0002_demo_effects.sql"),
};

/// The demo's tables on SQLite.
pub const SQLITE_MIGRATIONS: &[Migration] = &[
    DEMO_PAYMENTS,
    DEMO_EFFECTS,
    Migration {
        version: 3,
        name: "demo_refund_check",
        sql: include_str!("../migrations/sqlite/0003_demo_refund_check.sql"),
    },
];

/// The demo's tables on PostgreSQL.
pub const POSTGRES_MIGRATIONS: &[Migration] = &[
    DEMO_PAYMENTS,
    DEMO_EFFECTS,
    Migration {
        version: 3,
        name: "demo_refund_check",
        sql: include_str!("../migrations/postgres/0003_demo_refund_check.sql"),
    },
];

/// The largest amount (in minor units) a payment or refund may have, so that
/// sums of amounts never overflow a 64-bit column on either backend.
pub const MAX_AMOUNT: i64 = 1_000_000_000_000;

/// Topic of the event written when a payment is created.
pub const PAYMENT_CREATED: &str = "payments.created";
/// Topic of the event written when a payment is refunded.
pub const PAYMENT_REFUNDED: &str = "payments.refunded";

/// A payment event as the consumer reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `payments.created`: a charge in the ledger and a receipt.
    Created {
        tenant: String,
        payment_id: String,
        amount: i64,
    },
    /// `payments.refunded`: a refund in the ledger.
    Refunded {
        tenant: String,
        payment_id: String,
        amount: i64,
    },
}

/// The outbox message for `event`, keyed by its payment so a payment's events
/// are published in order.
pub fn event_message(
    event: &Event,
) -> Result<idem_core::outbox::OutboxMessage, idem_core::outbox::MessageError> {
    let (topic, tenant, payment_id, amount) = match event {
        Event::Created {
            tenant,
            payment_id,
            amount,
        } => (PAYMENT_CREATED, tenant, payment_id, amount),
        Event::Refunded {
            tenant,
            payment_id,
            amount,
        } => (PAYMENT_REFUNDED, tenant, payment_id, amount),
    };
    let body = json!({"tenant": tenant, "payment_id": payment_id, "amount": amount});
    idem_core::outbox::OutboxMessage::new(
        idem_core::outbox::Topic::new(topic)?,
        payment_id.clone(),
        body.to_string(),
    )
}

/// Reads an event; the error says why it cannot be applied (it is then
/// dead-lettered).
pub fn decode_event(subject: &str, payload: &[u8]) -> Result<Event, String> {
    let v: Value =
        serde_json::from_slice(payload).map_err(|e| format!("payload is not JSON: {e}"))?;
    let field = |name: &str| {
        v.get(name)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty() && s.len() <= 255)
            .map(str::to_owned)
            .ok_or_else(|| format!("{name} is missing or not a string"))
    };
    let amount = v
        .get("amount")
        .and_then(Value::as_i64)
        .filter(|a| *a > 0)
        .ok_or("amount is missing or not a positive integer")?;
    let (tenant, payment_id) = (field("tenant")?, field("payment_id")?);
    match subject {
        PAYMENT_CREATED => Ok(Event::Created {
            tenant,
            payment_id,
            amount,
        }),
        PAYMENT_REFUNDED => Ok(Event::Refunded {
            tenant,
            payment_id,
            amount,
        }),
        other => Err(format!("unknown subject {other}")),
    }
}

/// Settings of the demo routes.
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// How long key records live (default 24 h).
    pub key_ttl: std::time::Duration,
    /// Largest request body accepted (default 1 MiB); 413 above.
    pub max_body_bytes: usize,
    /// Whether payments and refunds write their events to the outbox (on
    /// when a broker is configured; without a relay they would only pile up).
    pub events: bool,
    /// How long a handler may run before it is rolled back with 503
    /// `handler-timeout` (default 30 s).
    pub handler_timeout: std::time::Duration,
    /// How long a read route waits for the database before 503 (default
    /// 11 s, the PostgreSQL store's deadline).
    pub read_timeout: std::time::Duration,
}

impl Default for DemoConfig {
    fn default() -> Self {
        Self {
            key_ttl: idem_core::Policy::DEFAULT_TTL,
            max_body_bytes: 1 << 20,
            events: false,
            handler_timeout: std::time::Duration::from_secs(30),
            read_timeout: std::time::Duration::from_secs(11),
        }
    }
}

/// A database error in a demo handler (or an admin or webhook route): 503 +
/// Retry-After when the database is unreachable (the client should retry; a
/// handler's error rolls its transaction back, so nothing was written), 503
/// `outcome-unknown` when a write was sent and not acknowledged, 400 when the
/// database refused
/// a value the client sent, 500 otherwise. The error and its sources are
/// logged, never sent.
pub fn db_error(e: idem_core::StoreError) -> Response {
    let error = &e as &(dyn std::error::Error + 'static);
    match e {
        idem_core::StoreError::InvalidValue { .. } => {
            tracing::info!(error, "the database refused a value of the request");
            invalid("a value is not acceptable")
        }
        idem_core::StoreError::OutcomeUnknown { .. } => {
            tracing::warn!(
                error,
                "a write was sent and not acknowledged; outcome unknown"
            );
            idem_http::Rejection::OutcomeUnknown(std::time::Duration::from_secs(1)).into_response()
        }
        ref e if e.retryable() => {
            tracing::warn!(error, "database unavailable");
            idem_http::Rejection::StoreUnavailable(std::time::Duration::from_secs(1))
                .into_response()
        }
        _ => {
            tracing::error!(error, "database failed");
            internal_problem()
        }
    }
}

pub fn invalid(detail: &str) -> Response {
    idem_http::problem(
        StatusCode::BAD_REQUEST,
        "invalid-request",
        "The request is invalid",
        Some(detail),
        None,
    )
}

pub fn not_found() -> Response {
    idem_http::problem(
        StatusCode::NOT_FOUND,
        "not-found",
        "No such payment",
        None,
        None,
    )
}

pub fn internal(e: impl std::fmt::Display) -> Response {
    tracing::error!(error = %e, "demo handler failed");
    internal_problem()
}

fn internal_problem() -> Response {
    idem_http::problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "Internal error",
        None,
        None,
    )
}

/// A read on the pool, bounded: past `limit` it is abandoned and the client
/// gets 503 `store-unavailable` (a read writes nothing) instead of waiting on
/// a database that went silent.
pub async fn within<T>(
    limit: std::time::Duration,
    read: impl std::future::Future<Output = Result<T, sqlx::Error>>,
) -> Result<Result<T, sqlx::Error>, Response> {
    tokio::time::timeout(limit, read).await.map_err(|_| {
        tracing::warn!(?limit, "the database did not answer a read in time");
        idem_http::Rejection::StoreUnavailable(std::time::Duration::from_secs(1)).into_response()
    })
}

/// A text field the client sent: 1 to 255 bytes, no control characters (a
/// NUL would be refused by PostgreSQL and stored by SQLite; both backends
/// must answer the same, so it is refused here).
pub fn text_field(name: &str, value: Option<&Value>) -> Result<String, Response> {
    match value.and_then(Value::as_str) {
        Some(s) if valid_text(s) => Ok(s.to_owned()),
        _ => Err(invalid(&format!(
            "{name} must be a string of 1 to 255 characters without control characters"
        ))),
    }
}

/// 1 to 255 bytes without control characters.
pub fn valid_text(s: &str) -> bool {
    !s.is_empty() && s.len() <= 255 && !s.chars().any(char::is_control)
}

/// Whether a path segment can be an id the demo issued (`pay_…`, `re_…`).
/// Anything else cannot exist, so it is a 404 without asking the database.
pub fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A positive amount no larger than [`MAX_AMOUNT`].
fn amount(v: Option<&Value>) -> Result<i64, Response> {
    v.and_then(Value::as_i64)
        .filter(|a| (1..=MAX_AMOUNT).contains(a))
        .ok_or_else(|| {
            invalid(&format!(
                "amount must be an integer between 1 and {MAX_AMOUNT}"
            ))
        })
}

/// A validated create-payment request.
pub struct NewPayment {
    pub amount: i64,
    pub currency: String,
    pub customer: String,
    pub reference: Option<String>,
}

pub fn parse_payment(body: &Bytes) -> Result<NewPayment, Response> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| invalid(&format!("body is not valid JSON: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| invalid("body must be a JSON object"))?;
    let amount = amount(obj.get("amount"))?;
    let currency = obj
        .get("currency")
        .and_then(Value::as_str)
        .filter(|c| c.len() == 3 && c.bytes().all(|b| b.is_ascii_uppercase()))
        .ok_or_else(|| invalid("currency must be a 3-letter upper-case code such as EUR"))?;
    let customer = text_field("customer", obj.get("customer"))?;
    let reference = match obj.get("reference") {
        None | Some(Value::Null) => None,
        r => Some(text_field("reference", r)?),
    };
    Ok(NewPayment {
        amount,
        currency: currency.to_owned(),
        customer,
        reference,
    })
}

pub fn parse_refund(body: &Bytes) -> Result<i64, Response> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| invalid(&format!("body is not valid JSON: {e}")))?;
    amount(v.get("amount"))
}

pub fn now_ms() -> i64 {
    SystemClock.now_ms()
}

pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

pub fn rfc3339(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// A payment row as `(id, amount, currency, customer, reference, refunded, created)`.
pub type PaymentRow = (String, i64, String, String, Option<String>, i64, i64);

pub fn payment_json(p: &PaymentRow) -> Value {
    let status = match p.5 {
        0 => "succeeded",
        r if r >= p.1 => "refunded",
        _ => "partially_refunded",
    };
    json!({
        "id": p.0, "amount": p.1, "currency": p.2, "customer": p.3, "reference": p.4,
        "status": status, "amount_refunded": p.5, "created_at": rfc3339(p.6),
    })
}

pub fn json_response(
    status: StatusCode,
    body: &Value,
    location: Option<String>,
    resource: Option<ResourceRef>,
) -> Response {
    let mut res = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response();
    if let Some(loc) = location.and_then(|l| HeaderValue::try_from(l).ok()) {
        res.headers_mut().insert(header::LOCATION, loc);
    }
    if let Some(r) = resource {
        res.extensions_mut().insert(r);
    }
    res
}

pub const SELECT_PAYMENT: &str = "SELECT id, amount, currency, customer, reference, amount_refunded, created_at_ms \
     FROM demo_payments WHERE tenant_id = $1 AND id = $2";

/// The refund's guard against other keys: the key serialises requests with
/// one key only, so two refunds with different keys run concurrently. The
/// increment happens only if it keeps the total within the amount — checked
/// by the database on the row's latest version, under its row lock — and the
/// table's `CHECK` backs it up.
pub const ADD_REFUND: &str = "UPDATE demo_payments SET amount_refunded = amount_refunded + $3 \
     WHERE tenant_id = $1 AND id = $2 AND amount_refunded + $3 <= amount RETURNING amount_refunded";

/// A refund row as `(id, payment_id, amount, created)`.
pub type RefundRow = (String, String, i64, i64);

pub fn refund_json(r: &RefundRow) -> Value {
    json!({"id": r.0, "payment_id": r.1, "amount": r.2, "created_at": rfc3339(r.3)})
}

pub fn refund_location(r: &RefundRow) -> String {
    format!("/v1/payments/{}/refunds/{}", r.1, r.0)
}

/// Generates the demo router for one backend.
#[macro_export]
macro_rules! demo_app {
    ($modname:ident, $store:ty, $tx:ty, $pool:ty, $map_err:path, $enqueue:path) => {
        pub mod $modname {
            use axum::extract::{Path, Query, State};
            use axum::http::{HeaderMap, StatusCode};
            use axum::response::Response;
            use axum::routing::{get, post};
            use axum::{Extension, Router};
            use bytes::Bytes;
            use idem_core::{Clock, Operation, Policy, ResourceRef, SystemClock, Tenant};
            use idem_http::{IdemTx, IdempotencyLayer, RouteConfig, TenantSource};
            use serde_json::json;
            use $crate::demo::*;

            #[derive(Clone)]
            struct App {
                pool: $pool,
                tenant: TenantSource,
                events: bool,
                read_timeout: std::time::Duration,
            }

            /// Writes `event` to the outbox in the request's transaction.
            async fn emit(app: &App, tx: &mut $tx, event: Event, now: i64) -> Result<(), Response> {
                if !app.events {
                    return Ok(());
                }
                let message = event_message(&event).map_err(internal)?;
                $enqueue(&mut **tx, &message, now).await.map(drop).map_err(db_error)
            }

            fn tenant_of(app: &App, headers: &HeaderMap) -> Result<Tenant, Response> {
                let mut parts = axum::http::Request::new(()).into_parts().0;
                parts.headers = headers.clone();
                app.tenant.resolve(&parts).map_err(|r| r.into_response())
            }

            async fn create(State(app): State<App>, Extension(tx): Extension<IdemTx<$tx>>, Extension(tenant): Extension<Tenant>, body: Bytes) -> Response {
                let p = match parse_payment(&body) { Ok(p) => p, Err(r) => return r };
                let mut tx = match tx.lock().await { Ok(t) => t, Err(_) => return internal("transaction finished") };
                let id = new_id("pay");
                let now = now_ms();
                let inserted: Result<Option<String>, _> = sqlx::query_scalar(
                    "INSERT INTO demo_payments (tenant_id, id, amount, currency, customer, reference, created_at_ms) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (tenant_id, reference) DO NOTHING RETURNING id")
                    .bind(tenant.as_str()).bind(&id).bind(p.amount).bind(&p.currency).bind(&p.customer)
                    .bind(&p.reference).bind(now)
                    .fetch_optional(&mut **tx).await;
                match inserted {
                    Ok(Some(_)) => {
                        let event = Event::Created { tenant: tenant.to_string(), payment_id: id.clone(), amount: p.amount };
                        if let Err(r) = emit(&app, &mut tx, event, now).await { return r; }
                        let row = (id.clone(), p.amount, p.currency, p.customer, p.reference, 0, now);
                        json_response(StatusCode::CREATED, &payment_json(&row), Some(format!("/v1/payments/{id}")),
                            Some(ResourceRef { kind: "payment".into(), id }))
                    }
                    Ok(None) => {
                        // The business natural key: this reference was used before.
                        let existing: Result<PaymentRow, _> = sqlx::query_as(
                            "SELECT id, amount, currency, customer, reference, amount_refunded, created_at_ms \
                             FROM demo_payments WHERE tenant_id = $1 AND reference = $2")
                            .bind(tenant.as_str()).bind(&p.reference).fetch_one(&mut **tx).await;
                        match existing {
                            Ok(row) if row.1 == p.amount && row.2 == p.currency && row.3 == p.customer => {
                                let id = row.0.clone();
                                json_response(StatusCode::OK, &payment_json(&row), Some(format!("/v1/payments/{id}")),
                                    Some(ResourceRef { kind: "payment".into(), id }))
                            }
                            Ok(row) => idem_http::problem(StatusCode::CONFLICT, "reference-conflict",
                                "This reference belongs to a different payment", Some(&format!("payment {}", row.0)), None),
                            Err(e) => db_error($map_err(e)),
                        }
                    }
                    Err(e) => db_error($map_err(e)),
                }
            }

            async fn refund(State(app): State<App>, Extension(tx): Extension<IdemTx<$tx>>, Extension(tenant): Extension<Tenant>,
                            Path(payment_id): Path<String>, body: Bytes) -> Response {
                if !valid_id(&payment_id) { return not_found(); }
                let amount = match parse_refund(&body) { Ok(a) => a, Err(r) => return r };
                let mut tx = match tx.lock().await { Ok(t) => t, Err(_) => return internal("transaction finished") };
                // The conditional update first: when it moves no row, nothing
                // was written and the 422 (which is stored) commits nothing.
                let added: Result<Option<i64>, _> = sqlx::query_scalar(ADD_REFUND)
                    .bind(tenant.as_str()).bind(&payment_id).bind(amount).fetch_optional(&mut **tx).await;
                match added {
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        let payment: Result<Option<PaymentRow>, _> = sqlx::query_as(SELECT_PAYMENT)
                            .bind(tenant.as_str()).bind(&payment_id).fetch_optional(&mut **tx).await;
                        return match payment {
                            Ok(Some(p)) => idem_http::problem(StatusCode::UNPROCESSABLE_ENTITY, "refund-exceeds-payment",
                                "The refund is larger than what remains of the payment",
                                Some(&format!("{} remains refundable", p.1 - p.5)), None),
                            Ok(None) => not_found(),
                            Err(e) => db_error($map_err(e)),
                        };
                    }
                    Err(e) => return db_error($map_err(e)),
                }
                let row: RefundRow = (new_id("re"), payment_id, amount, now_ms());
                let inserted = sqlx::query("INSERT INTO demo_refunds (tenant_id, id, payment_id, amount, created_at_ms) VALUES ($1, $2, $3, $4, $5)")
                    .bind(tenant.as_str()).bind(&row.0).bind(&row.1).bind(row.2).bind(row.3)
                    .execute(&mut **tx).await;
                if let Err(e) = inserted { return db_error($map_err(e)); }
                let event = Event::Refunded { tenant: tenant.to_string(), payment_id: row.1.clone(), amount };
                if let Err(r) = emit(&app, &mut tx, event, row.3).await { return r; }
                json_response(StatusCode::CREATED, &refund_json(&row), Some(refund_location(&row)),
                    Some(ResourceRef { kind: "refund".into(), id: row.0.clone() }))
            }

            async fn show_refund(State(app): State<App>, headers: HeaderMap, Path((payment_id, id)): Path<(String, String)>) -> Response {
                let tenant = match tenant_of(&app, &headers) { Ok(t) => t, Err(r) => return r };
                if !valid_id(&payment_id) || !valid_id(&id) { return not_found(); }
                let row: Result<Option<RefundRow>, _> = match within(app.read_timeout, sqlx::query_as(
                    "SELECT id, payment_id, amount, created_at_ms FROM demo_refunds WHERE tenant_id = $1 AND id = $2 AND payment_id = $3")
                    .bind(tenant.as_str()).bind(&id).bind(&payment_id).fetch_optional(&app.pool)).await { Ok(r) => r, Err(late) => return late };
                match row {
                    Ok(Some(r)) => json_response(StatusCode::OK, &refund_json(&r), None, None),
                    Ok(None) => not_found(),
                    Err(e) => db_error($map_err(e)),
                }
            }

            async fn show(State(app): State<App>, headers: HeaderMap, Path(id): Path<String>) -> Response {
                let tenant = match tenant_of(&app, &headers) { Ok(t) => t, Err(r) => return r };
                if !valid_id(&id) { return not_found(); }
                let row: Result<Option<PaymentRow>, _> = match within(app.read_timeout, sqlx::query_as(SELECT_PAYMENT)
                    .bind(tenant.as_str()).bind(&id).fetch_optional(&app.pool)).await { Ok(r) => r, Err(late) => return late };
                match row {
                    Ok(Some(p)) => json_response(StatusCode::OK, &payment_json(&p), None, None),
                    Ok(None) => not_found(),
                    Err(e) => db_error($map_err(e)),
                }
            }

            async fn list(State(app): State<App>, headers: HeaderMap,
                          Query(q): Query<std::collections::HashMap<String, String>>) -> Response {
                let tenant = match tenant_of(&app, &headers) { Ok(t) => t, Err(r) => return r };
                let Some(customer) = q.get("customer") else { return invalid("query parameter customer is required") };
                if !valid_text(customer) { return invalid("customer must be 1 to 255 characters without control characters"); }
                let rows: Result<Vec<PaymentRow>, _> = match within(app.read_timeout, sqlx::query_as(
                    "SELECT id, amount, currency, customer, reference, amount_refunded, created_at_ms \
                     FROM demo_payments WHERE tenant_id = $1 AND customer = $2 ORDER BY created_at_ms, id LIMIT 1000")
                    .bind(tenant.as_str()).bind(customer).fetch_all(&app.pool)).await { Ok(r) => r, Err(late) => return late };
                match rows {
                    Ok(rows) => json_response(StatusCode::OK,
                        &json!({"data": rows.iter().map(payment_json).collect::<Vec<_>>()}), None, None),
                    Err(e) => db_error($map_err(e)),
                }
            }

            async fn effects(State(app): State<App>, headers: HeaderMap, Path(id): Path<String>) -> Response {
                let tenant = match tenant_of(&app, &headers) { Ok(t) => t, Err(r) => return r };
                if !valid_id(&id) { return not_found(); }
                let counts: Result<(i64, i64), _> = match within(app.read_timeout, sqlx::query_as(
                    "SELECT (SELECT count(*) FROM demo_ledger_entries WHERE tenant_id = $1 AND payment_id = $2), \
                            (SELECT count(*) FROM demo_notifications WHERE tenant_id = $1 AND payment_id = $2)")
                    .bind(tenant.as_str()).bind(&id).fetch_one(&app.pool)).await { Ok(r) => r, Err(late) => return late };
                match counts {
                    Ok((l, n)) => json_response(StatusCode::OK, &json!({"ledger_entries": l, "notifications": n}), None, None),
                    Err(e) => db_error($map_err(e)),
                }
            }

            /// The consumer of payment events: a ledger entry per event and a
            /// receipt per payment, in the inbox transaction.
            pub struct Ledger;

            impl idem_inbox::Handler<$tx> for Ledger {
                fn handle<'a>(&'a self, tx: &'a mut $tx, m: &'a idem_inbox::InboxMessage)
                    -> idem_core::BoxFuture<'a, Result<(), idem_inbox::HandlerError>> {
                    Box::pin(async move {
                        use idem_inbox::HandlerError;
                        let event = decode_event(&m.subject, &m.payload).map_err(HandlerError::Reject)?;
                        let now = now_ms();
                        let retry = |e: sqlx::Error| HandlerError::Retry(e.into());
                        let (tenant, payment_id, kind, amount) = match &event {
                            Event::Created { tenant, payment_id, amount } => (tenant, payment_id, "charge", *amount),
                            Event::Refunded { tenant, payment_id, amount } => (tenant, payment_id, "refund", -*amount),
                        };
                        sqlx::query("INSERT INTO demo_ledger_entries (tenant_id, payment_id, kind, amount, message_id, stream_seq, created_at_ms) \
                                     VALUES ($1, $2, $3, $4, $5, $6, $7)")
                            .bind(tenant).bind(payment_id).bind(kind).bind(amount)
                            .bind(m.message_id.as_str()).bind(m.stream_sequence as i64).bind(now)
                            .execute(&mut **tx).await.map_err(retry)?;
                        if let Event::Created { .. } = event {
                            // "Sending" the receipt: recorded once per message id.
                            sqlx::query("INSERT INTO demo_notifications (message_id, tenant_id, payment_id, kind, sent_at_ms) \
                                         VALUES ($1, $2, $3, 'receipt', $4) ON CONFLICT (message_id) DO NOTHING")
                                .bind(m.message_id.as_str()).bind(tenant).bind(payment_id).bind(now)
                                .execute(&mut **tx).await.map_err(retry)?;
                        }
                        Ok(())
                    })
                }
            }

            /// The demo router. The tenant comes from `X-Tenant-Id`, trusted here
            /// only because this is a demo; `default` when absent.
            pub fn router(store: $store, pool: $pool, config: &DemoConfig) -> Router {
                router_with_clock(store, pool, config, SystemClock)
            }

            /// The demo router on another clock (tests pass a TTL without sleeping).
            pub fn router_with_clock<C: Clock + Clone>(store: $store, pool: $pool, config: &DemoConfig, clock: C) -> Router {
                let tenant = TenantSource::TrustedHeader {
                    name: axum::http::HeaderName::from_static("x-tenant-id"),
                    default: Tenant::new("default").ok(),
                };
                let route = |op: &str| {
                    let op = Operation::new(op).unwrap_or_else(|e| panic!("operation name {op}: {e}"));
                    let mut cfg = RouteConfig::required(op, tenant.clone());
                    cfg.max_request_bytes = config.max_body_bytes;
                    cfg.policy = Policy::with_ttl(config.key_ttl);
                    cfg.handler_timeout = config.handler_timeout;
                    IdempotencyLayer::new(store.clone(), cfg).with_clock(clock.clone())
                };
                Router::new()
                    .route("/v1/payments", post(create).layer(route("payments.create")).get(list))
                    .route("/v1/payments/{id}", get(show))
                    .route("/v1/payments/{id}/refunds", post(refund).layer(route("refunds.create")))
                    .route("/v1/payments/{id}/refunds/{refund_id}", get(show_refund))
                    .route("/v1/payments/{id}/effects", get(effects))
                    .with_state(App { pool, tenant, events: config.events, read_timeout: config.read_timeout })
            }
        }
    };
}
