//! The demo's SQL, behind one small trait so the handlers are ordinary
//! generic Rust. The statements are the same on both backends (both take
//! `$n` parameters): [`statements`] holds them, and [`drivers`] implements
//! the trait once for `idem_sql::SqlStore<D>`, generic over the dialect.

use idem_core::StoreError;
use idem_core::outbox::OutboxWriter;

pub mod drivers;
pub mod migrations;
pub mod statements;

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
    /// Creates or updates the demo's tables (the `demo` component's
    /// migrations), beside the key store's.
    fn migrate_demo(&self) -> impl Future<Output = Result<(), StoreError>>;

    /// Inserts a payment; `false` when its `reference` was used before.
    fn insert_payment<'a>(
        tx: &'a mut Self::Tx,
        tenant: &'a str,
        row: &'a PaymentRow,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'a;

    /// Adds `amount` to the refunded total if it stays within the payment
    /// ([`ADD_REFUND`](statements::ADD_REFUND)); `false` when no row moved.
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
