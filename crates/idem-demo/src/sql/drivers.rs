//! [`DemoSql`] for [`SqlStore<D>`], written once over any
//! [`Dialect`]: each call is the shared statement of
//! [`statements`](super::statements) as a [`Stmt`], run with the dialect's
//! primitives ([`Dialect::execute`]; reads through
//! [`idem_sql::dialect::read_row`] and `read_rows`, under the store's read
//! deadline) and its rows decoded through [`idem_sql::row`].
//! Every demo column is a `BIGINT` or text, the same width on both
//! backends; only the `demo_refund_check` migration differs, picked by
//! [`Dialect::FAMILY`].

use idem_core::{Migration, StoreError};
use idem_sql::dialect::{On, Stmt, read_row, read_rows};
use idem_sql::row::{Column, get_at};
use idem_sql::{Dialect, SqlStore};

use crate::sql::migrations::{POSTGRES_MIGRATIONS, SQLITE_MIGRATIONS};
use crate::sql::statements::*;
use crate::sql::{DemoSql, LedgerEntry, OrderRow, PaymentKey, PaymentRow, RefundRow, StockRow};

/// The demo's migrations in `D`'s SQL family.
fn migrations<D: Dialect>() -> &'static [Migration] {
    D::FAMILY.pick(SQLITE_MIGRATIONS, POSTGRES_MIGRATIONS)
}

/// `sql` with each of `args` bound as text to `$1`, `$2`, …
fn read<'a>(sql: impl Into<std::borrow::Cow<'a, str>>, args: &[&'a str]) -> Stmt<'a> {
    args.iter().fold(Stmt::new(sql), |s, a| s.bind(*a))
}

fn payment_row<R: Column<String> + Column<Option<String>> + Column<i64>>(
    r: &R,
) -> Result<PaymentRow, StoreError> {
    Ok((
        get_at(r, 0)?,
        get_at(r, 1)?,
        get_at(r, 2)?,
        get_at(r, 3)?,
        get_at(r, 4)?,
        get_at(r, 5)?,
        get_at(r, 6)?,
    ))
}

fn refund_row<R: Column<String> + Column<i64>>(r: &R) -> Result<RefundRow, StoreError> {
    Ok((get_at(r, 0)?, get_at(r, 1)?, get_at(r, 2)?, get_at(r, 3)?))
}

fn order_row<R: Column<String> + Column<Option<String>> + Column<i64>>(
    r: &R,
) -> Result<OrderRow, StoreError> {
    Ok((
        get_at(r, 0)?,
        get_at(r, 1)?,
        get_at(r, 2)?,
        get_at(r, 3)?,
        get_at(r, 4)?,
        get_at(r, 5)?,
        get_at(r, 6)?,
        get_at(r, 7)?,
        get_at(r, 8)?,
        get_at(r, 9)?,
        get_at(r, 10)?,
    ))
}

fn stock_row<R: Column<String> + Column<i64>>(r: &R) -> Result<StockRow, StoreError> {
    Ok((get_at(r, 0)?, get_at(r, 1)?, get_at(r, 2)?, get_at(r, 3)?))
}

impl<D: Dialect> DemoSql for SqlStore<D> {
    async fn migrate_demo(&self) -> Result<(), StoreError> {
        idem_sql::migrate::run::<D>(self.pool(), "demo", migrations::<D>()).await
    }

    async fn insert_payment(
        tx: &mut D::Tx,
        tenant: &str,
        p: &PaymentRow,
    ) -> Result<bool, StoreError> {
        let s = Stmt::new(INSERT_PAYMENT)
            .bind(tenant)
            .bind(&p.0)
            .bind(p.1)
            .bind(&p.2)
            .bind(&p.3)
            .bind(&p.4)
            .bind(p.6);
        let id = D::fetch_optional(On::Conn(&mut **tx), s)
            .await
            .map_err(D::map_err)?;
        Ok(id.is_some())
    }

    async fn add_refund(
        tx: &mut D::Tx,
        tenant: &str,
        payment_id: &str,
        amount: i64,
    ) -> Result<bool, StoreError> {
        let s = Stmt::new(ADD_REFUND)
            .bind(tenant)
            .bind(payment_id)
            .bind(amount);
        let total = D::fetch_optional(On::Conn(&mut **tx), s)
            .await
            .map_err(D::map_err)?;
        Ok(total.is_some())
    }

    async fn payment_in(
        tx: &mut D::Tx,
        tenant: &str,
        key: PaymentKey,
        value: &str,
    ) -> Result<Option<PaymentRow>, StoreError> {
        let s = read(select_payments(key.filter()), &[tenant, value]);
        let row = D::fetch_optional(On::Conn(&mut **tx), s)
            .await
            .map_err(D::map_err)?;
        row.as_ref().map(payment_row).transpose()
    }

    async fn insert_refund(tx: &mut D::Tx, tenant: &str, r: &RefundRow) -> Result<(), StoreError> {
        let s = Stmt::new(INSERT_REFUND)
            .bind(tenant)
            .bind(&r.0)
            .bind(&r.1)
            .bind(r.2)
            .bind(r.3);
        D::execute(On::Conn(&mut **tx), s)
            .await
            .map(drop)
            .map_err(D::map_err)
    }

    async fn record_entry(tx: &mut D::Tx, e: &LedgerEntry<'_>) -> Result<(), StoreError> {
        let s = Stmt::new(INSERT_LEDGER_ENTRY)
            .bind(e.tenant)
            .bind(e.payment_id)
            .bind(e.kind)
            .bind(e.amount)
            .bind(e.message_id)
            .bind(e.stream_sequence)
            .bind(e.now_ms);
        D::execute(On::Conn(&mut **tx), s)
            .await
            .map_err(D::map_err)?;
        if e.receipt {
            let s = Stmt::new(INSERT_NOTIFICATION)
                .bind(e.message_id)
                .bind(e.tenant)
                .bind(e.payment_id)
                .bind(e.now_ms);
            D::execute(On::Conn(&mut **tx), s)
                .await
                .map_err(D::map_err)?;
        }
        Ok(())
    }

    async fn payment(&self, tenant: &str, id: &str) -> Result<Option<PaymentRow>, StoreError> {
        let s = read(select_payments(PaymentKey::Id.filter()), &[tenant, id]);
        read_row(self.dialect(), s, payment_row).await
    }

    async fn refund(
        &self,
        tenant: &str,
        payment_id: &str,
        id: &str,
    ) -> Result<Option<RefundRow>, StoreError> {
        let s = read(SELECT_REFUND, &[tenant, id, payment_id]);
        read_row(self.dialect(), s, refund_row).await
    }

    async fn payment_by_reference(
        &self,
        tenant: &str,
        reference: &str,
    ) -> Result<Option<PaymentRow>, StoreError> {
        let s = read(
            select_payments(PaymentKey::Reference.filter()),
            &[tenant, reference],
        );
        read_row(self.dialect(), s, payment_row).await
    }

    async fn payments_of(
        &self,
        tenant: &str,
        customer: &str,
    ) -> Result<Vec<PaymentRow>, StoreError> {
        let s = read(select_payments(BY_CUSTOMER), &[tenant, customer]);
        read_rows(self.dialect(), s, payment_row).await
    }

    async fn effects(&self, tenant: &str, id: &str) -> Result<(i64, i64), StoreError> {
        let s = read(COUNT_EFFECTS, &[tenant, id]);
        let counts = read_row(self.dialect(), s, |row| {
            Ok((get_at(row, 0)?, get_at(row, 1)?))
        });
        // A count always answers one row.
        counts.await?.ok_or_else(|| StoreError::Corrupt {
            detail: "the effects count answered no row".into(),
        })
    }

    async fn order(&self, tenant: &str, id: &str) -> Result<Option<OrderRow>, StoreError> {
        let s = read(select_orders("id = $2"), &[tenant, id]);
        read_row(self.dialect(), s, order_row).await
    }

    async fn orders_of(&self, tenant: &str, customer: &str) -> Result<Vec<OrderRow>, StoreError> {
        let s = read(select_orders(BY_CUSTOMER), &[tenant, customer]);
        read_rows(self.dialect(), s, order_row).await
    }

    async fn stock(&self, tenant: &str, sku: &str) -> Result<Option<StockRow>, StoreError> {
        let s = read(SELECT_STOCK, &[tenant, sku]);
        read_row(self.dialect(), s, stock_row).await
    }
}
