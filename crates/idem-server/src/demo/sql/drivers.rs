//! `demo_sql!`: [`DemoSql`](super::DemoSql) for one driver, from the shared
//! statements; `crate::backend` instantiates it for SQLite and PostgreSQL.

/// Implements [`DemoSql`] for a store whose transaction derefs to the
/// driver's connection and whose `pool()` is the driver's pool.
macro_rules! demo_sql {
    ($store:ty, $tx:ty, $map_err:path $(,)?) => {
        const _: () = {
            use idem_core::StoreError;
            use $crate::demo::sql::statements::*;
            use $crate::demo::sql::{
                DemoSql, LedgerEntry, OrderRow, PaymentKey, PaymentRow, RefundRow, StockRow,
            };
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
