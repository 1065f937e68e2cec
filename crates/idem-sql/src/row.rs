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

    /// The value of the column at `index` (0 the first).
    fn column_at(&self, index: usize) -> Result<T, StoreError>;
}

fn corrupt(name: impl std::fmt::Display, e: sqlx::Error) -> StoreError {
    StoreError::Corrupt {
        detail: format!("column {name}: {e}"),
    }
}

/// A type read from a column as the driver decodes it; [`Int`], which
/// widens, has its own impls below.
pub trait Decoded {}

impl Decoded for String {}
impl Decoded for Option<String> {}
impl Decoded for i64 {}
impl Decoded for Option<i64> {}
impl Decoded for bool {}
impl Decoded for Vec<u8> {}
impl Decoded for Option<Vec<u8>> {}

impl<R: Row, T: Decoded> Column<T> for R
where
    T: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    for<'n> &'n str: ColumnIndex<R>,
    usize: ColumnIndex<R>,
{
    fn column(&self, name: &str) -> Result<T, StoreError> {
        self.try_get(name).map_err(|e| corrupt(name, e))
    }

    fn column_at(&self, index: usize) -> Result<T, StoreError> {
        self.try_get(index).map_err(|e| corrupt(index, e))
    }
}

/// An `INTEGER` column (64-bit on SQLite, 32-bit on PostgreSQL), widened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int(pub i64);

fn int_of<R, I>(row: &R, name: I) -> Result<Option<i64>, StoreError>
where
    R: Row,
    I: ColumnIndex<R> + std::fmt::Display + Copy,
    i64: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    i32: for<'r> Decode<'r, R::Database> + Type<R::Database>,
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
    usize: ColumnIndex<R>,
{
    fn column(&self, name: &str) -> Result<Option<Int>, StoreError> {
        Ok(int_of(self, name)?.map(Int))
    }

    fn column_at(&self, index: usize) -> Result<Option<Int>, StoreError> {
        Ok(int_of(self, index)?.map(Int))
    }
}

impl<R: Row> Column<Int> for R
where
    i64: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    i32: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    for<'n> &'n str: ColumnIndex<R>,
    usize: ColumnIndex<R>,
{
    fn column(&self, name: &str) -> Result<Int, StoreError> {
        not_null(int_of(self, name)?, name)
    }

    fn column_at(&self, index: usize) -> Result<Int, StoreError> {
        not_null(int_of(self, index)?, index)
    }
}

fn not_null(v: Option<i64>, name: impl std::fmt::Display) -> Result<Int, StoreError> {
    v.map(Int).ok_or_else(|| StoreError::Corrupt {
        detail: format!("column {name}: NULL"),
    })
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

/// The column at `index` of `row` as `T` (0 the first).
pub fn get_at<T, R: Column<T> + ?Sized>(row: &R, index: usize) -> Result<T, StoreError> {
    row.column_at(index)
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
