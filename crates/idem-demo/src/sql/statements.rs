//! The demo's statements, shared by both drivers (`$n` parameters).

const ORDER_COLUMNS: &str = "id, customer, sku, quantity, amount, currency, email, status, \
     reason, payment_id, created_at_ms";

/// `SELECT … FROM demo_orders WHERE tenant_id = $1 AND <filter>`.
pub fn select_orders(filter: &str) -> String {
    format!("SELECT {ORDER_COLUMNS} FROM demo_orders WHERE tenant_id = $1 AND {filter}")
}

pub const SELECT_STOCK: &str = "SELECT sku, available, reserved, version FROM demo_inventory \
     WHERE tenant_id = $1 AND sku = $2";

const PAYMENT_COLUMNS: &str =
    "id, amount, currency, customer, reference, amount_refunded, created_at_ms";

pub const INSERT_PAYMENT: &str = "INSERT INTO demo_payments \
     (tenant_id, id, amount, currency, customer, reference, created_at_ms) \
     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (tenant_id, reference) DO NOTHING RETURNING id";

/// The refund's guard against other keys: the key serialises requests with
/// one key only, so two refunds with different keys run concurrently. The
/// increment happens only if it keeps the total within the amount — checked
/// by the database on the row's latest version, under its row lock — and the
/// table's `CHECK` backs it up.
pub const ADD_REFUND: &str = "UPDATE demo_payments SET amount_refunded = amount_refunded + $3 \
     WHERE tenant_id = $1 AND id = $2 AND amount_refunded + $3 <= amount RETURNING amount_refunded";

pub const INSERT_REFUND: &str = "INSERT INTO demo_refunds \
     (tenant_id, id, payment_id, amount, created_at_ms) VALUES ($1, $2, $3, $4, $5)";

pub const SELECT_REFUND: &str = "SELECT id, payment_id, amount, created_at_ms FROM demo_refunds \
     WHERE tenant_id = $1 AND id = $2 AND payment_id = $3";

pub const INSERT_LEDGER_ENTRY: &str = "INSERT INTO demo_ledger_entries \
     (tenant_id, payment_id, kind, amount, message_id, stream_seq, created_at_ms) \
     VALUES ($1, $2, $3, $4, $5, $6, $7)";

/// "Sending" the receipt: recorded once per message id.
pub const INSERT_NOTIFICATION: &str = "INSERT INTO demo_notifications \
     (message_id, tenant_id, payment_id, kind, sent_at_ms) \
     VALUES ($1, $2, $3, 'receipt', $4) ON CONFLICT (message_id) DO NOTHING";

pub const COUNT_EFFECTS: &str = "SELECT \
     (SELECT count(*) FROM demo_ledger_entries WHERE tenant_id = $1 AND payment_id = $2), \
     (SELECT count(*) FROM demo_notifications WHERE tenant_id = $1 AND payment_id = $2)";

/// `SELECT … FROM demo_payments WHERE tenant_id = $1 AND <filter>`.
pub fn select_payments(filter: &str) -> String {
    format!("SELECT {PAYMENT_COLUMNS} FROM demo_payments WHERE tenant_id = $1 AND {filter}")
}

/// A customer's rows, oldest first, at most 1000: the filter for
/// [`select_orders`] and [`select_payments`].
pub const BY_CUSTOMER: &str = "customer = $2 ORDER BY created_at_ms, id LIMIT 1000";
