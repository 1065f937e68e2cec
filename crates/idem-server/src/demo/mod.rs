//! The demo payments API, written with the library the way a user would write
//! theirs: [`handlers`] are ordinary generic Rust over [`sql::DemoSql`], which
//! each backend implements; [`Ledger`] consumes the payment events.

use axum::response::Response;
use bytes::Bytes;
use idem_core::steps::RunStore;
use idem_core::{Clock, Migration, SystemClock};
use idem_sql::patterns::PatternExec;
use serde_json::{Value, json};

use crate::respond::{invalid, rfc3339};

mod baseline;
pub mod checkout;
pub mod handlers;
mod ledger;
pub mod mail_sink;
pub mod sql;
pub mod upstream;

pub use baseline::PATH as BASELINE_PATH;
pub use handlers::{router, router_with_clock};
pub use ledger::Ledger;
pub use sql::{DemoSql, PaymentRow, RefundRow};

/// What the demo apps need of a store: their own SQL ([`DemoSql`]), and the
/// checkout's runs, whose transactions run the database patterns. Both
/// backends are one; a gateway's server never asks for it.
pub trait Store: DemoSql + RunStore<Tx: PatternExec> {}

impl<S: DemoSql + RunStore<Tx: PatternExec>> Store for S {}

const DEMO_PAYMENTS: Migration = Migration {
    version: 1,
    name: "demo_payments",
    sql: include_str!("../../migrations/0001_demo.sql"),
};
const DEMO_EFFECTS: Migration = Migration {
    version: 2,
    name: "demo_effects",
    sql: include_str!("../../migrations/0002_demo_effects.sql"),
};
const DEMO_CHECKOUT: Migration = Migration {
    version: 4,
    name: "demo_checkout",
    sql: include_str!("../../migrations/0004_demo_checkout.sql"),
};

/// The demo's tables on SQLite.
pub const SQLITE_MIGRATIONS: &[Migration] = &[
    DEMO_PAYMENTS,
    DEMO_EFFECTS,
    Migration {
        version: 3,
        name: "demo_refund_check",
        sql: include_str!("../../migrations/sqlite/0003_demo_refund_check.sql"),
    },
    DEMO_CHECKOUT,
];

/// The demo's tables on PostgreSQL.
pub const POSTGRES_MIGRATIONS: &[Migration] = &[
    DEMO_PAYMENTS,
    DEMO_EFFECTS,
    Migration {
        version: 3,
        name: "demo_refund_check",
        sql: include_str!("../../migrations/postgres/0003_demo_refund_check.sql"),
    },
    DEMO_CHECKOUT,
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
    /// How the payment and refund routes claim a fresh key (default
    /// pessimistic).
    pub claim_mode: idem_core::ClaimMode,
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
    /// Mount the benchmark's baseline route, `POST
    /// /v1/payments-baseline`: the payment route's work without the
    /// idempotency layer (default off; `idem serve --bench-routes`).
    pub bench_routes: bool,
}

impl Default for DemoConfig {
    fn default() -> Self {
        Self {
            key_ttl: idem_core::Policy::DEFAULT_TTL,
            claim_mode: idem_core::ClaimMode::Pessimistic,
            max_body_bytes: 1 << 20,
            events: false,
            handler_timeout: std::time::Duration::from_secs(30),
            read_timeout: std::time::Duration::from_secs(11),
            bench_routes: false,
        }
    }
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

pub fn payment_json(p: &PaymentRow) -> Value {
    let status = payment_status(p);
    json!({
        "id": p.0, "amount": p.1, "currency": p.2, "customer": p.3, "reference": p.4,
        "status": status, "amount_refunded": p.5, "created_at": rfc3339(p.6),
    })
}

/// A payment as [`payment_json`] writes it, serialised straight from the
/// row: the payment route's answer, without building a map of values
/// first. The fields are in the order the map writes them (a test holds
/// the two to the same bytes).
#[derive(serde::Serialize)]
pub struct PaymentOut<'a> {
    amount: i64,
    amount_refunded: i64,
    created_at: String,
    currency: &'a str,
    customer: &'a str,
    id: &'a str,
    reference: Option<&'a str>,
    status: &'static str,
}

impl<'a> PaymentOut<'a> {
    pub fn of(p: &'a PaymentRow) -> Self {
        Self {
            amount: p.1,
            amount_refunded: p.5,
            created_at: rfc3339(p.6),
            currency: &p.2,
            customer: &p.3,
            id: &p.0,
            reference: p.4.as_deref(),
            status: payment_status(p),
        }
    }
}

fn payment_status(p: &PaymentRow) -> &'static str {
    match p.5 {
        0 => "succeeded",
        r if r >= p.1 => "refunded",
        _ => "partially_refunded",
    }
}

pub fn refund_json(r: &RefundRow) -> Value {
    json!({"id": r.0, "payment_id": r.1, "amount": r.2, "created_at": rfc3339(r.3)})
}

pub fn refund_location(r: &RefundRow) -> String {
    format!("/v1/payments/{}/refunds/{}", r.1, r.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payment_answer_is_the_bytes_of_its_json_value() {
        let rows: [PaymentRow; 3] = [
            (
                "pay_1".into(),
                100,
                "EUR".into(),
                "cus_\"q\"\u{e9}".into(),
                None,
                0,
                1_700_000_000_123,
            ),
            (
                "pay_2".into(),
                100,
                "USD".into(),
                "c".into(),
                Some("ref-1".into()),
                40,
                0,
            ),
            (
                "pay_3".into(),
                7,
                "GBP".into(),
                "c".into(),
                Some("r".into()),
                7,
                i64::MAX,
            ),
        ];
        for row in &rows {
            let typed = serde_json::to_vec(&PaymentOut::of(row)).unwrap();
            let value = serde_json::to_vec(&payment_json(row)).unwrap();
            assert_eq!(
                String::from_utf8(typed).unwrap(),
                String::from_utf8(value).unwrap()
            );
        }
    }
}
