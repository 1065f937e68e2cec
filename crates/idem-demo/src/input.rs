//! What the demo reads from a request: validated fields, ids, amounts.

use axum::response::Response;
use bytes::Bytes;
use idem_admin::respond::invalid;
use idem_core::{Clock, SystemClock};
use serde_json::Value;

/// The largest amount (in minor units) a payment or refund may have, so that
/// sums of amounts never overflow a 64-bit column on either backend.
pub const MAX_AMOUNT: i64 = 1_000_000_000_000;
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
