//! What the demo answers: payments and refunds as JSON.

use idem_admin::respond::rfc3339;
use serde_json::{Value, json};

use crate::sql::{PaymentRow, RefundRow};

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
