//! The demo's SQL, behind one small trait so the handlers are ordinary
//! generic Rust. The statements are the same on both backends (both take
//! `$n` parameters); `demo_sql!` only instantiates them per driver.

use idem_core::StoreError;
use idem_core::outbox::OutboxWriter;

/// A payment row as `(id, amount, currency, customer, reference, refunded, created)`.
pub type PaymentRow = (String, i64, String, String, Option<String>, i64, i64);

/// A refund row as `(id, payment_id, amount, created)`.
pub type RefundRow = (String, String, i64, i64);

/// An order row as `(id, customer, sku, quantity, amount, currency, email,
/// status, reason, payment_id, created)`.
pub type OrderRow = (
    String,
    String,
    String,
    i64,
    i64,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    i64,
);

/// A stock row as `(sku, available, reserved, version)`.
pub type StockRow = (String, i64, i64, i64);

/// How a payment is looked up.
#[derive(Debug, Clone, Copy)]
pub enum PaymentKey {
    /// By its id.
    Id,
    /// By the client's `reference`, the business natural key.
    Reference,
}

impl PaymentKey {
    pub(crate) fn filter(self) -> &'static str {
        match self {
            PaymentKey::Id => "id = $2",
            PaymentKey::Reference => "reference = $2",
        }
    }
}

/// A ledger entry written by the consumer, one per event.
#[derive(Debug)]
pub struct LedgerEntry<'a> {
    pub tenant: &'a str,
    pub payment_id: &'a str,
    /// `charge` or `refund`.
    pub kind: &'static str,
    /// Negative for a refund.
    pub amount: i64,
    pub message_id: &'a str,
    pub stream_sequence: i64,
    pub now_ms: i64,
    /// Whether the event also "sends" a receipt (once per message id).
    pub receipt: bool,
}

/// What the demo asks of its database: writes in the request's transaction,
/// reads on the pool. Events go through [`idem_outbox::Outbox`], hence the
/// [`OutboxWriter`] bound.
pub trait DemoSql: OutboxWriter {
    /// Inserts a payment; `false` when its `reference` was used before.
    fn insert_payment<'a>(
        tx: &'a mut Self::Tx,
        tenant: &'a str,
        row: &'a PaymentRow,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'a;

    /// Adds `amount` to the refunded total if it stays within the payment
    /// ([`ADD_REFUND`]); `false` when no row moved.
    fn add_refund<'a>(
        tx: &'a mut Self::Tx,
        tenant: &'a str,
        payment_id: &'a str,
        amount: i64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'a;

    /// The payment whose `key` is `value`, read in the transaction.
    fn payment_in<'a>(
        tx: &'a mut Self::Tx,
        tenant: &'a str,
        key: PaymentKey,
        value: &'a str,
    ) -> impl Future<Output = Result<Option<PaymentRow>, StoreError>> + Send + 'a;

    /// Inserts a refund.
    fn insert_refund<'a>(
        tx: &'a mut Self::Tx,
        tenant: &'a str,
        row: &'a RefundRow,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// Applies one event to the ledger (and the notifications).
    fn record_entry<'a>(
        tx: &'a mut Self::Tx,
        entry: &'a LedgerEntry<'a>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// A payment.
    fn payment(
        &self,
        tenant: &str,
        id: &str,
    ) -> impl Future<Output = Result<Option<PaymentRow>, StoreError>> + Send;

    /// A refund of a payment.
    fn refund(
        &self,
        tenant: &str,
        payment_id: &str,
        id: &str,
    ) -> impl Future<Output = Result<Option<RefundRow>, StoreError>> + Send;

    /// The payment whose `reference` is `reference` (there is at most one).
    fn payment_by_reference(
        &self,
        tenant: &str,
        reference: &str,
    ) -> impl Future<Output = Result<Option<PaymentRow>, StoreError>> + Send;

    /// A customer's payments, oldest first, at most 1000.
    fn payments_of(
        &self,
        tenant: &str,
        customer: &str,
    ) -> impl Future<Output = Result<Vec<PaymentRow>, StoreError>> + Send;

    /// Ledger entries and notifications of a payment.
    fn effects(
        &self,
        tenant: &str,
        id: &str,
    ) -> impl Future<Output = Result<(i64, i64), StoreError>> + Send;

    /// An order.
    fn order(
        &self,
        tenant: &str,
        id: &str,
    ) -> impl Future<Output = Result<Option<OrderRow>, StoreError>> + Send;

    /// A customer's orders, oldest first, at most 1000.
    fn orders_of(
        &self,
        tenant: &str,
        customer: &str,
    ) -> impl Future<Output = Result<Vec<OrderRow>, StoreError>> + Send;

    /// A SKU's stock.
    fn stock(
        &self,
        tenant: &str,
        sku: &str,
    ) -> impl Future<Output = Result<Option<StockRow>, StoreError>> + Send;
}

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

/// Implements [`DemoSql`] for a store whose transaction derefs to the
/// driver's connection and whose `pool()` is the driver's pool.
macro_rules! demo_sql {
    ($store:ty, $tx:ty, $map_err:path $(,)?) => {
        const _: () = {
            use idem_core::StoreError;
            use $crate::demo::sql::*;
            impl DemoSql for $store {
                async fn insert_payment(
                    tx: &mut $tx,
                    tenant: &str,
                    p: &PaymentRow,
                ) -> Result<bool, StoreError> {
                    let id: Option<String> = sqlx::query_scalar(INSERT_PAYMENT)
                        .bind(tenant)
                        .bind(&p.0)
                        .bind(p.1)
                        .bind(&p.2)
                        .bind(&p.3)
                        .bind(&p.4)
                        .bind(p.6)
                        .fetch_optional(&mut **tx)
                        .await
                        .map_err($map_err)?;
                    Ok(id.is_some())
                }

                async fn add_refund(
                    tx: &mut $tx,
                    tenant: &str,
                    payment_id: &str,
                    amount: i64,
                ) -> Result<bool, StoreError> {
                    let total: Option<i64> = sqlx::query_scalar(ADD_REFUND)
                        .bind(tenant)
                        .bind(payment_id)
                        .bind(amount)
                        .fetch_optional(&mut **tx)
                        .await
                        .map_err($map_err)?;
                    Ok(total.is_some())
                }

                async fn payment_in(
                    tx: &mut $tx,
                    tenant: &str,
                    key: PaymentKey,
                    value: &str,
                ) -> Result<Option<PaymentRow>, StoreError> {
                    sqlx::query_as(&select_payments(key.filter()))
                        .bind(tenant)
                        .bind(value)
                        .fetch_optional(&mut **tx)
                        .await
                        .map_err($map_err)
                }

                async fn insert_refund(
                    tx: &mut $tx,
                    tenant: &str,
                    r: &RefundRow,
                ) -> Result<(), StoreError> {
                    sqlx::query(INSERT_REFUND)
                        .bind(tenant)
                        .bind(&r.0)
                        .bind(&r.1)
                        .bind(r.2)
                        .bind(r.3)
                        .execute(&mut **tx)
                        .await
                        .map(drop)
                        .map_err($map_err)
                }

                async fn record_entry(tx: &mut $tx, e: &LedgerEntry<'_>) -> Result<(), StoreError> {
                    sqlx::query(INSERT_LEDGER_ENTRY)
                        .bind(e.tenant)
                        .bind(e.payment_id)
                        .bind(e.kind)
                        .bind(e.amount)
                        .bind(e.message_id)
                        .bind(e.stream_sequence)
                        .bind(e.now_ms)
                        .execute(&mut **tx)
                        .await
                        .map_err($map_err)?;
                    if e.receipt {
                        sqlx::query(INSERT_NOTIFICATION)
                            .bind(e.message_id)
                            .bind(e.tenant)
                            .bind(e.payment_id)
                            .bind(e.now_ms)
                            .execute(&mut **tx)
                            .await
                            .map_err($map_err)?;
                    }
                    Ok(())
                }

                async fn payment(
                    &self,
                    tenant: &str,
                    id: &str,
                ) -> Result<Option<PaymentRow>, StoreError> {
                    sqlx::query_as(&select_payments("id = $2"))
                        .bind(tenant)
                        .bind(id)
                        .fetch_optional(self.pool())
                        .await
                        .map_err($map_err)
                }

                async fn refund(
                    &self,
                    tenant: &str,
                    payment_id: &str,
                    id: &str,
                ) -> Result<Option<RefundRow>, StoreError> {
                    sqlx::query_as(SELECT_REFUND)
                        .bind(tenant)
                        .bind(id)
                        .bind(payment_id)
                        .fetch_optional(self.pool())
                        .await
                        .map_err($map_err)
                }

                async fn payment_by_reference(
                    &self,
                    tenant: &str,
                    reference: &str,
                ) -> Result<Option<PaymentRow>, StoreError> {
                    sqlx::query_as(&select_payments(PaymentKey::Reference.filter()))
                        .bind(tenant)
                        .bind(reference)
                        .fetch_optional(self.pool())
                        .await
                        .map_err($map_err)
                }

                async fn payments_of(
                    &self,
                    tenant: &str,
                    customer: &str,
                ) -> Result<Vec<PaymentRow>, StoreError> {
                    sqlx::query_as(&select_payments(
                        "customer = $2 ORDER BY created_at_ms, id LIMIT 1000",
                    ))
                    .bind(tenant)
                    .bind(customer)
                    .fetch_all(self.pool())
                    .await
                    .map_err($map_err)
                }

                async fn effects(&self, tenant: &str, id: &str) -> Result<(i64, i64), StoreError> {
                    sqlx::query_as(COUNT_EFFECTS)
                        .bind(tenant)
                        .bind(id)
                        .fetch_one(self.pool())
                        .await
                        .map_err($map_err)
                }

                async fn order(
                    &self,
                    tenant: &str,
                    id: &str,
                ) -> Result<Option<OrderRow>, StoreError> {
                    sqlx::query_as(&select_orders("id = $2"))
                        .bind(tenant)
                        .bind(id)
                        .fetch_optional(self.pool())
                        .await
                        .map_err($map_err)
                }

                async fn orders_of(
                    &self,
                    tenant: &str,
                    customer: &str,
                ) -> Result<Vec<OrderRow>, StoreError> {
                    sqlx::query_as(&select_orders(
                        "customer = $2 ORDER BY created_at_ms, id LIMIT 1000",
                    ))
                    .bind(tenant)
                    .bind(customer)
                    .fetch_all(self.pool())
                    .await
                    .map_err($map_err)
                }

                async fn stock(
                    &self,
                    tenant: &str,
                    sku: &str,
                ) -> Result<Option<StockRow>, StoreError> {
                    sqlx::query_as(SELECT_STOCK)
                        .bind(tenant)
                        .bind(sku)
                        .fetch_optional(self.pool())
                        .await
                        .map_err($map_err)
                }
            }
        };
    };
}

pub(crate) use demo_sql;
