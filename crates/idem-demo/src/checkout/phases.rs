//! The checkout's transactional phases: the stock reserved with the order
//! created, its compensation, and the order confirmed — each a conditional
//! write in the transaction of its phase.

use idem_core::BoxError;
use idem_sql::patterns::{PatternExec, StateMachine, Transition, Value};
use serde::{Deserialize, Serialize};

use super::order::NewOrder;
use crate::input::now_ms;

/// A phase's failure as the error its closure returns.
pub(super) fn fault(what: String) -> BoxError {
    what.into()
}

/// What the reserve phase found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Reserved {
    /// Stock reserved and the order created.
    Yes,
    /// Not enough stock: nothing written.
    OutOfStock,
    /// The order exists already (its key expired and the intent came again):
    /// nothing written.
    Exists,
    /// An order with other fields exists under this key (its key expired and
    /// was reused for another order): nothing written.
    Other,
}

/// Stock reserved and the order created, or why not.
pub(super) async fn reserve<E: PatternExec + ?Sized>(
    tx: &mut E,
    tenant: &str,
    id: &str,
    o: &NewOrder,
    created_at_ms: i64,
) -> Result<Reserved, BoxError> {
    // The order's columns as `$1`..`$8`, for the comparison and the insert.
    let order = [
        Value::Text(tenant),
        Value::Text(id),
        Value::Text(&o.customer),
        Value::Text(&o.sku),
        Value::Int(o.quantity),
        Value::Int(o.amount),
        Value::Text(&o.currency),
        Value::Text(&o.email),
    ];
    let exists = tx
        .fetch_text(
            "SELECT CASE WHEN customer = $3 AND sku = $4 AND quantity = $5 AND amount = $6 \
             AND currency = $7 AND email = $8 THEN 'same' ELSE 'other' END \
             FROM demo_orders WHERE tenant_id = $1 AND id = $2",
            &order,
        )
        .await?;
    match exists.as_deref() {
        Some("same") => return Ok(Reserved::Exists),
        Some(_) => return Ok(Reserved::Other),
        None => {}
    }
    let now = now_ms();
    let moved = tx
        .fetch_int(
            "UPDATE demo_inventory SET available = available - $3, reserved = reserved + $3, \
             version = version + 1, updated_at_ms = $4 \
             WHERE tenant_id = $1 AND sku = $2 AND available >= $3 RETURNING available",
            &[
                Value::Text(tenant),
                Value::Text(&o.sku),
                Value::Int(o.quantity),
                Value::Int(now),
            ],
        )
        .await?;
    if moved.is_none() {
        return Ok(Reserved::OutOfStock);
    }
    tx.execute(
        "INSERT INTO demo_orders (tenant_id, id, customer, sku, quantity, amount, currency, email, \
         status, created_at_ms, updated_at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'pending', $9, $9)",
        &[&order[..], &[Value::Int(created_at_ms)]].concat(),
    )
    .await?;
    Ok(Reserved::Yes)
}

/// The compensation of `reserve`: the reserved quantity is available again.
pub(super) async fn release<E: PatternExec + ?Sized>(
    tx: &mut E,
    tenant: &str,
    o: &NewOrder,
) -> Result<(), BoxError> {
    let n = tx
        .execute(
            "UPDATE demo_inventory SET available = available + $3, reserved = reserved - $3, \
             version = version + 1, updated_at_ms = $4 \
             WHERE tenant_id = $1 AND sku = $2 AND reserved >= $3",
            &[
                Value::Text(tenant),
                Value::Text(&o.sku),
                Value::Int(o.quantity),
                Value::Int(now_ms()),
            ],
        )
        .await?;
    if n != 1 {
        return Err(fault(format!(
            "{} of {} are not reserved",
            o.quantity, o.sku
        )));
    }
    Ok(())
}

/// The order confirmed and its reserved stock taken out.
pub(super) async fn confirm<E: PatternExec + ?Sized>(
    tx: &mut E,
    orders: &StateMachine,
    tenant: &str,
    id: &str,
    o: &NewOrder,
    payment_id: &str,
) -> Result<(), BoxError> {
    let key = [Value::Text(tenant), Value::Text(id)];
    let set = [
        ("payment_id", Value::Text(payment_id)),
        ("updated_at_ms", Value::Int(now_ms())),
    ];
    match orders.transition(tx, &key, "confirmed", &set).await? {
        Transition::Moved => {}
        Transition::AlreadyThere => return Ok(()),
        Transition::Illegal { current } => {
            return Err(fault(format!(
                "order {id} is {current}, it cannot be confirmed"
            )));
        }
        Transition::Missing => return Err(fault(format!("order {id} is missing"))),
    }
    let n = tx
        .execute(
            "UPDATE demo_inventory SET reserved = reserved - $3, version = version + 1, \
             updated_at_ms = $4 WHERE tenant_id = $1 AND sku = $2 AND reserved >= $3",
            &[
                Value::Text(tenant),
                Value::Text(&o.sku),
                Value::Int(o.quantity),
                Value::Int(now_ms()),
            ],
        )
        .await?;
    if n != 1 {
        return Err(fault(format!(
            "{} of {} are not reserved",
            o.quantity, o.sku
        )));
    }
    Ok(())
}
