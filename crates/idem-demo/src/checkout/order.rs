//! What an order is: the request's fields and their checks, the order id a
//! run names, and the order as the API shows it.

use idem_core::steps::RunId;
use serde::{Deserialize, Serialize};
use serde_json::{Value as Json, json};

use crate::input::{MAX_AMOUNT, text_field};

/// The largest quantity of one order.
pub const MAX_QUANTITY: i64 = 1_000_000;

/// A validated order request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewOrder {
    pub customer: String,
    pub sku: String,
    pub quantity: i64,
    pub amount: i64,
    pub currency: String,
    pub email: String,
}

/// A SKU: 1 to 64 characters of `[A-Za-z0-9._-]`.
pub fn valid_sku(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn valid_email(s: &str) -> bool {
    (3..=254).contains(&s.len())
        && s.split_once('@')
            .is_some_and(|(local, domain)| !local.is_empty() && domain.contains('.'))
        && !s.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// Reads an order request; the error is the problem's detail.
pub fn parse_order(body: &[u8]) -> Result<NewOrder, String> {
    let v: Json =
        serde_json::from_slice(body).map_err(|e| format!("body is not valid JSON: {e}"))?;
    let obj = v.as_object().ok_or("body must be a JSON object")?;
    let int = |name: &str, max: i64| {
        obj.get(name)
            .and_then(Json::as_i64)
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| format!("{name} must be an integer between 1 and {max}"))
    };
    let customer = text_field("customer", obj.get("customer")).map_err(|_| {
        "customer must be a string of 1 to 255 characters without control characters".to_owned()
    })?;
    let sku = obj
        .get("sku")
        .and_then(Json::as_str)
        .filter(|s| valid_sku(s))
        .ok_or("sku must be 1 to 64 characters of A-Z, a-z, 0-9, '.', '_' or '-'")?;
    let currency = obj
        .get("currency")
        .and_then(Json::as_str)
        .filter(|c| c.len() == 3 && c.bytes().all(|b| b.is_ascii_uppercase()))
        .ok_or("currency must be a 3-letter upper-case code such as EUR")?;
    let email = obj
        .get("email")
        .and_then(Json::as_str)
        .filter(|e| valid_email(e))
        .ok_or("email must be an address such as ada@example.com")?;
    Ok(NewOrder {
        customer,
        sku: sku.to_owned(),
        quantity: int("quantity", MAX_QUANTITY)?,
        amount: int("amount", MAX_AMOUNT)?,
        currency: currency.to_owned(),
        email: email.to_owned(),
    })
}

/// The id of the order a run creates: `ord_` and the run's suffix, so the
/// order names its run and every retry names the same order.
pub fn order_id(run: &RunId) -> String {
    format!("ord_{}", run.suffix())
}

/// The run of an order id, if it can be one.
pub fn run_of(order_id: &str) -> Option<RunId> {
    RunId::from_suffix(order_id.strip_prefix("ord_")?).ok()
}

/// An order as the API shows it.
pub fn order_json(
    id: &str,
    status: &str,
    o: &NewOrder,
    payment_id: Option<&str>,
    reason: Option<&str>,
    created_at_ms: i64,
) -> Json {
    let mut v = json!({
        "id": id, "status": status, "customer": o.customer, "sku": o.sku,
        "quantity": o.quantity, "amount": o.amount, "currency": o.currency,
        "payment_id": payment_id, "created_at": idem_admin::respond::rfc3339(created_at_ms),
    });
    if let Some(r) = reason {
        v["reason"] = r.into();
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_are_validated() {
        let good = br#"{"customer":"cus_1","sku":"tee-m","quantity":2,"amount":3000,"currency":"EUR","email":"ada@example.com"}"#;
        let o = parse_order(good).unwrap();
        assert_eq!((o.quantity, o.amount, o.sku.as_str()), (2, 3000, "tee-m"));
        for (bad, says) in [
            (&br#"{"customer":"c","sku":"a b","quantity":1,"amount":1,"currency":"EUR","email":"a@b.c"}"#[..], "sku"),
            (br#"{"customer":"c","sku":"a","quantity":0,"amount":1,"currency":"EUR","email":"a@b.c"}"#, "quantity"),
            (br#"{"customer":"c","sku":"a","quantity":1,"amount":1,"currency":"eur","email":"a@b.c"}"#, "currency"),
            (br#"{"customer":"c","sku":"a","quantity":1,"amount":1,"currency":"EUR","email":"nope"}"#, "email"),
            (br#"{"customer":"","sku":"a","quantity":1,"amount":1,"currency":"EUR","email":"a@b.c"}"#, "customer"),
            (br#"[1]"#, "object"),
            (b"{", "JSON"),
        ] {
            let e = parse_order(bad).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn order_ids_name_their_run() {
        let run = RunId::parse("run_0123456789abcdef0123456789abcdef").unwrap();
        let id = order_id(&run);
        assert_eq!(id, "ord_0123456789abcdef0123456789abcdef");
        assert_eq!(run_of(&id), Some(run));
        assert_eq!(run_of("ord_x"), None);
        assert_eq!(run_of("pay_0123456789abcdef0123456789abcdef"), None);
    }
}
