//! The payment events the demo writes to the outbox and its ledger reads.

use serde_json::{Value, json};

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
