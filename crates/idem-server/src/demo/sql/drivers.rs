//! `demo_sql!`: [`DemoSql`](super::DemoSql) for one driver, from the shared
//! statements, instantiated at the bottom for SQLite and PostgreSQL.

/// Implements [`DemoSql`] for a store whose transaction derefs to the
/// driver's connection and whose `pool()` is the driver's pool (of `$db`).
macro_rules! demo_sql {
    ($store:ty, $tx:ty, $db:ty, $map_err:path, $migrate:path, $migrations:expr $(,)?) => {
        const _: () = {
            use idem_core::StoreError;
            use sqlx::Database;
            use $crate::demo::sql::statements::*;
            use $crate::demo::sql::{
                DemoSql, LedgerEntry, OrderRow, PaymentKey, PaymentRow, RefundRow, StockRow,
            };

            /// A read of rows `T` by text parameters `$1`, `$2`, … on the pool.
            fn read<'q, T>(
                sql: &'q str,
                args: &[&'q str],
            ) -> sqlx::query::QueryAs<'q, $db, T, <$db as Database>::Arguments<'q>>
            where
                T: for<'r> sqlx::FromRow<'r, <$db as Database>::Row>,
            {
                args.iter().fold(sqlx::query_as(sql), |q, a| q.bind(*a))
            }

            impl DemoSql for $store {
                async fn migrate_demo(&self) -> Result<(), StoreError> {
                    $migrate(self.pool(), "demo", $migrations).await
                }

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
                    let sql = select_payments(PaymentKey::Id.filter());
                    let q = read(&sql, &[tenant, id]);
                    q.fetch_optional(self.pool()).await.map_err($map_err)
                }

                async fn refund(
                    &self,
                    tenant: &str,
                    payment_id: &str,
                    id: &str,
                ) -> Result<Option<RefundRow>, StoreError> {
                    let q = read(SELECT_REFUND, &[tenant, id, payment_id]);
                    q.fetch_optional(self.pool()).await.map_err($map_err)
                }

                async fn payment_by_reference(
                    &self,
                    tenant: &str,
                    reference: &str,
                ) -> Result<Option<PaymentRow>, StoreError> {
                    let sql = select_payments(PaymentKey::Reference.filter());
                    let q = read(&sql, &[tenant, reference]);
                    q.fetch_optional(self.pool()).await.map_err($map_err)
                }

                async fn payments_of(
                    &self,
                    tenant: &str,
                    customer: &str,
                ) -> Result<Vec<PaymentRow>, StoreError> {
                    let sql = select_payments(BY_CUSTOMER);
                    let q = read(&sql, &[tenant, customer]);
                    q.fetch_all(self.pool()).await.map_err($map_err)
                }

                async fn effects(&self, tenant: &str, id: &str) -> Result<(i64, i64), StoreError> {
                    let q = read(COUNT_EFFECTS, &[tenant, id]);
                    q.fetch_one(self.pool()).await.map_err($map_err)
                }

                async fn order(
                    &self,
                    tenant: &str,
                    id: &str,
                ) -> Result<Option<OrderRow>, StoreError> {
                    let sql = select_orders("id = $2");
                    let q = read(&sql, &[tenant, id]);
                    q.fetch_optional(self.pool()).await.map_err($map_err)
                }

                async fn orders_of(
                    &self,
                    tenant: &str,
                    customer: &str,
                ) -> Result<Vec<OrderRow>, StoreError> {
                    let sql = select_orders(BY_CUSTOMER);
                    let q = read(&sql, &[tenant, customer]);
                    q.fetch_all(self.pool()).await.map_err($map_err)
                }

                async fn stock(
                    &self,
                    tenant: &str,
                    sku: &str,
                ) -> Result<Option<StockRow>, StoreError> {
                    let q = read(SELECT_STOCK, &[tenant, sku]);
                    q.fetch_optional(self.pool()).await.map_err($map_err)
                }
            }
        };
    };
}

demo_sql!(
    idem_sqlite::SqliteStore,
    idem_sqlite::SqliteTx,
    sqlx::Sqlite,
    idem_sqlite::map_err,
    idem_sqlite::migrate_component,
    crate::demo::SQLITE_MIGRATIONS,
);
demo_sql!(
    idem_postgres::PgStore,
    idem_postgres::PgTx,
    sqlx::Postgres,
    idem_postgres::map_err,
    idem_postgres::migrate_component,
    crate::demo::POSTGRES_MIGRATIONS,
);
