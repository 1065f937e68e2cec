//! Reading one column of a stored row, for any driver: [`Column`] is
//! implemented for every [`sqlx::Row`] whose database decodes the type, and
//! [`Columns`] names the set the decoders need.
//!
//! One width differs between the dialects: an `INTEGER` column is 64-bit on
//! SQLite and 32-bit on PostgreSQL. [`Int`] reads either and widens it.

use std::borrow::Cow;

use idem_core::StoreError;
use sqlx::{ColumnIndex, Decode, Row, Type, ValueRef};

/// One column of a row read as `T`; a missing column or a value of another
/// type is [`StoreError::Corrupt`].
pub trait Column<T> {
    /// The value of column `name`.
    fn column(&self, name: &str) -> Result<T, StoreError>;
}

fn corrupt(name: &str, e: sqlx::Error) -> StoreError {
    StoreError::Corrupt {
        detail: format!("column {name}: {e}"),
    }
}

macro_rules! decoded {
    ($($t:ty),* $(,)?) => {$(
        impl<R: Row> Column<$t> for R
        where
            $t: for<'r> Decode<'r, R::Database> + Type<R::Database>,
            for<'n> &'n str: ColumnIndex<R>,
        {
            fn column(&self, name: &str) -> Result<$t, StoreError> {
                self.try_get(name).map_err(|e| corrupt(name, e))
            }
        }
    )*};
}

decoded!(
    String,
    Option<String>,
    i64,
    Option<i64>,
    bool,
    Vec<u8>,
    Option<Vec<u8>>,
);

/// An `INTEGER` column (64-bit on SQLite, 32-bit on PostgreSQL), widened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int(pub i64);

fn int_of<R>(row: &R, name: &str) -> Result<Option<i64>, StoreError>
where
    R: Row,
    i64: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    i32: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    for<'n> &'n str: ColumnIndex<R>,
{
    let raw = row.try_get_raw(name).map_err(|e| corrupt(name, e))?;
    if raw.is_null() {
        return Ok(None);
    }
    let wide = match raw.type_info() {
        Cow::Borrowed(t) => <i64 as Type<R::Database>>::compatible(t),
        Cow::Owned(t) => <i64 as Type<R::Database>>::compatible(&t),
    };
    if wide {
        row.try_get::<i64, _>(name).map(Some)
    } else {
        row.try_get::<i32, _>(name).map(|v| Some(i64::from(v)))
    }
    .map_err(|e| corrupt(name, e))
}

impl<R: Row> Column<Option<Int>> for R
where
    i64: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    i32: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    for<'n> &'n str: ColumnIndex<R>,
{
    fn column(&self, name: &str) -> Result<Option<Int>, StoreError> {
        Ok(int_of(self, name)?.map(Int))
    }
}

impl<R: Row> Column<Int> for R
where
    i64: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    i32: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    for<'n> &'n str: ColumnIndex<R>,
{
    fn column(&self, name: &str) -> Result<Int, StoreError> {
        int_of(self, name)?
            .map(Int)
            .ok_or_else(|| StoreError::Corrupt {
                detail: format!("column {name}: NULL"),
            })
    }
}

/// The column types Idem's tables hold, as one bound.
pub trait Columns:
    Column<String>
    + Column<Option<String>>
    + Column<i64>
    + Column<Option<i64>>
    + Column<bool>
    + Column<Vec<u8>>
    + Column<Option<Vec<u8>>>
    + Column<Int>
    + Column<Option<Int>>
{
}

impl<R> Columns for R where
    R: Column<String>
        + Column<Option<String>>
        + Column<i64>
        + Column<Option<i64>>
        + Column<bool>
        + Column<Vec<u8>>
        + Column<Option<Vec<u8>>>
        + Column<Int>
        + Column<Option<Int>>
{
}

/// Column `name` of `row` as `T`.
pub fn get<T, R: Column<T> + ?Sized>(row: &R, name: &str) -> Result<T, StoreError> {
    row.column(name)
}

/// An `INTEGER` column, widened to `i64`.
pub fn int<R: Column<Int> + ?Sized>(row: &R, name: &str) -> Result<i64, StoreError> {
    row.column(name).map(|Int(v)| v)
}

/// A nullable `INTEGER` column, widened to `i64`.
pub fn opt_int<R: Column<Option<Int>> + ?Sized>(
    row: &R,
    name: &str,
) -> Result<Option<i64>, StoreError> {
    Ok(row.column(name)?.map(|Int(v)| v))
}
