//! Writes that are idempotent by themselves, the database patterns of the
//! seed article: a **state-machine transition** as one conditional `UPDATE`
//! that tells "moved", "already there" and "illegal" apart; an **update
//! conditional on a version** (optimistic concurrency); an **absolute-value
//! upsert** (`SET x = 5`, never `SET x = x + 1`).
//!
//! Each pattern is a small spec ([`StateMachine`], [`Versioned`],
//! [`Upsert`]) whose table and column names are checked once, when it is
//! built, so the SQL it writes can hold no injection; values are always
//! bound. The logic — which statement, what its answer means — is here and
//! runs through [`PatternExec`], which each backend implements for its
//! connection with [`fetch_text`], [`fetch_int`] and [`execute`] (`idem_sqlite::SqliteTx` and `idem_postgres::PgTx` deref to
//! one). The statements use `$n` placeholders, which both backends accept.
//!
//! ```
//! use idem_sql::patterns::{StateMachine, Transition};
//! let orders = StateMachine::new("orders", &["tenant_id", "id"], "status")?
//!     .allow("pending", &["confirmed", "failed"])
//!     .allow("confirmed", &["refunded"]);
//! // The conditional update names every state `confirmed` may be reached from.
//! assert_eq!(
//!     orders.update_sql("confirmed", &["payment_id"]).as_deref(),
//!     Some("UPDATE orders SET status = $1, payment_id = $2 \
//!           WHERE tenant_id = $3 AND id = $4 AND status IN ($5) RETURNING status"),
//! );
//! // What its answer means: no row moved, and the order is already confirmed.
//! assert_eq!(orders.outcome(false, Some("confirmed".into()), "confirmed"), Transition::AlreadyThere);
//! assert_eq!(
//!     orders.outcome(false, Some("failed".into()), "confirmed"),
//!     Transition::Illegal { current: "failed".into() },
//! );
//! # Ok::<(), idem_sql::patterns::PatternError>(())
//! ```

use idem_core::{BoxFuture, StoreError};

use crate::dialect::{Dialect, On, Stmt};

/// A bound value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    /// Text.
    Text(&'a str),
    /// A 64-bit integer.
    Int(i64),
    /// A text `NULL`.
    NullText,
    /// An integer `NULL`.
    NullInt,
}

/// A table or column name that is not a plain SQL identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not an SQL identifier: use 1 to 63 characters of [a-z0-9_], not starting with a digit"
)]
pub struct PatternError(pub String);

fn ident(name: &str) -> Result<String, PatternError> {
    let ok = (1..=63).contains(&name.len())
        && !name.as_bytes()[0].is_ascii_digit()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(name.to_owned())
    } else {
        Err(PatternError(name.chars().take(80).collect()))
    }
}

fn idents(names: &[&str]) -> Result<Vec<String>, PatternError> {
    if names.is_empty() {
        return Err(PatternError(String::new()));
    }
    names.iter().map(|n| ident(n)).collect()
}

/// `k1 = $first AND k2 = $first+1 …`
fn key_clause(keys: &[String], first: usize) -> String {
    keys.iter()
        .enumerate()
        .map(|(i, k)| format!("{k} = ${}", first + i))
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// Runs the patterns' statements on one connection. Backends implement it
/// for their connection type; the statements come from the specs here.
pub trait PatternExec: Send {
    /// Runs `sql` with `binds` and returns the first column of the first
    /// row as text, if a row came back.
    fn fetch_text<'a>(
        &'a mut self,
        sql: &'a str,
        binds: &'a [Value<'a>],
    ) -> BoxFuture<'a, Result<Option<String>, StoreError>>;

    /// Runs `sql` with `binds` and returns the first column of the first
    /// row as an integer, if a row came back.
    fn fetch_int<'a>(
        &'a mut self,
        sql: &'a str,
        binds: &'a [Value<'a>],
    ) -> BoxFuture<'a, Result<Option<i64>, StoreError>>;

    /// Runs `sql` with `binds`; returns the rows affected.
    fn execute<'a>(
        &'a mut self,
        sql: &'a str,
        binds: &'a [Value<'a>],
    ) -> BoxFuture<'a, Result<u64, StoreError>>;
}

/// What a [`StateMachine::transition`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// The row moved to the new state (and took the other values).
    Moved,
    /// The row was in the new state already: a repeat, nothing changed.
    AlreadyThere,
    /// The row is in a state the new one cannot be reached from; nothing
    /// changed.
    Illegal {
        /// The state it is in.
        current: String,
    },
    /// No such row.
    Missing,
}

/// A state column whose changes follow allowed edges, each applied as one
/// conditional `UPDATE`: repeating a transition is harmless and a
/// transition from a state that does not allow it changes nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateMachine {
    table: String,
    keys: Vec<String>,
    column: String,
    edges: Vec<(String, String)>,
}

impl StateMachine {
    /// The state `column` of `table`, rows found by the `keys` columns.
    pub fn new(table: &str, keys: &[&str], column: &str) -> Result<Self, PatternError> {
        Ok(Self {
            table: ident(table)?,
            keys: idents(keys)?,
            column: ident(column)?,
            edges: Vec::new(),
        })
    }

    /// Allows moving from `from` to each of `to`.
    pub fn allow(mut self, from: &str, to: &[&str]) -> Self {
        self.edges
            .extend(to.iter().map(|t| (from.to_owned(), (*t).to_owned())));
        self
    }

    /// The states `to` may be reached from.
    pub fn sources(&self, to: &str) -> Vec<&str> {
        self.edges
            .iter()
            .filter(|(_, t)| t == to)
            .map(|(f, _)| f.as_str())
            .collect()
    }

    /// The conditional update to `to`, also setting the `set` columns:
    /// binds the new state, the `set` values, the keys, then the source
    /// states. `None` when no state leads to `to`.
    pub fn update_sql(&self, to: &str, set: &[&str]) -> Option<String> {
        let sources = self.sources(to);
        if sources.is_empty() {
            return None;
        }
        let mut assignments = vec![format!("{} = $1", self.column)];
        for (i, c) in set.iter().enumerate() {
            assignments.push(format!("{c} = ${}", i + 2));
        }
        let first_key = set.len() + 2;
        let first_source = first_key + self.keys.len();
        let placeholders = (0..sources.len())
            .map(|i| format!("${}", first_source + i))
            .collect::<Vec<_>>()
            .join(", ");
        Some(format!(
            "UPDATE {} SET {} WHERE {} AND {} IN ({placeholders}) RETURNING {}",
            self.table,
            assignments.join(", "),
            key_clause(&self.keys, first_key),
            self.column,
            self.column
        ))
    }

    /// Reads the current state (binds the keys).
    pub fn read_sql(&self) -> String {
        format!(
            "SELECT {} FROM {} WHERE {}",
            self.column,
            self.table,
            key_clause(&self.keys, 1)
        )
    }

    /// What the update's answer means: `moved` when it returned a row,
    /// else the state read afterwards decides.
    pub fn outcome(&self, moved: bool, current: Option<String>, to: &str) -> Transition {
        match (moved, current) {
            (true, _) => Transition::Moved,
            (false, None) => Transition::Missing,
            (false, Some(c)) if c == to => Transition::AlreadyThere,
            (false, Some(current)) => Transition::Illegal { current },
        }
    }

    /// Moves the row with `key` to `to`, setting `set` (columns the spec
    /// does not check: checked here) along with it. Runs in the caller's
    /// transaction; a second statement reads the state only when nothing
    /// moved.
    pub async fn transition<E: PatternExec + ?Sized>(
        &self,
        exec: &mut E,
        key: &[Value<'_>],
        to: &str,
        set: &[(&str, Value<'_>)],
    ) -> Result<Transition, StoreError> {
        let columns: Vec<&str> = set.iter().map(|(c, _)| *c).collect();
        for c in &columns {
            ident(c).map_err(|e| StoreError::Database { source: e.into() })?;
        }
        self.check_key(key)?;
        let moved = match self.update_sql(to, &columns) {
            None => false,
            Some(sql) => {
                let sources = self.sources(to);
                let mut binds = vec![Value::Text(to)];
                binds.extend(set.iter().map(|(_, v)| *v));
                binds.extend_from_slice(key);
                binds.extend(sources.iter().map(|s| Value::Text(s)));
                exec.fetch_text(&sql, &binds).await?.is_some()
            }
        };
        if moved {
            return Ok(Transition::Moved);
        }
        let current = exec.fetch_text(&self.read_sql(), key).await?;
        Ok(self.outcome(false, current, to))
    }

    fn check_key(&self, key: &[Value<'_>]) -> Result<(), StoreError> {
        check_arity(self.keys.len(), key.len())
    }
}

fn check_arity(want: usize, got: usize) -> Result<(), StoreError> {
    if want == got {
        Ok(())
    } else {
        Err(StoreError::Database {
            source: format!("the pattern has {want} key columns, {got} key values were given")
                .into(),
        })
    }
}

/// What a [`Versioned::update`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionedUpdate {
    /// Applied; the row now has this version.
    Updated {
        /// The new version.
        version: i64,
    },
    /// The row has another version than the one expected: nothing changed.
    Stale {
        /// The version it has.
        current: i64,
    },
    /// No such row.
    Missing,
}

/// An update applied only to the version of a row the writer read, which
/// then moves to the next version: a repeat, or a writer working from an
/// older read, changes nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned {
    table: String,
    keys: Vec<String>,
    version: String,
}

impl Versioned {
    /// The integer `version` column of `table`, rows found by `keys`.
    pub fn new(table: &str, keys: &[&str], version: &str) -> Result<Self, PatternError> {
        Ok(Self {
            table: ident(table)?,
            keys: idents(keys)?,
            version: ident(version)?,
        })
    }

    /// The conditional update setting `set`: binds the `set` values, the
    /// keys, then the expected version; returns the new version.
    pub fn update_sql(&self, set: &[&str]) -> String {
        let mut assignments: Vec<String> = set
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c} = ${}", i + 1))
            .collect();
        assignments.push(format!("{v} = {v} + 1", v = self.version));
        let first_key = set.len() + 1;
        format!(
            "UPDATE {} SET {} WHERE {} AND {} = ${} RETURNING {}",
            self.table,
            assignments.join(", "),
            key_clause(&self.keys, first_key),
            self.version,
            first_key + self.keys.len(),
            self.version
        )
    }

    /// Reads the current version (binds the keys).
    pub fn read_sql(&self) -> String {
        format!(
            "SELECT {} FROM {} WHERE {}",
            self.version,
            self.table,
            key_clause(&self.keys, 1)
        )
    }

    /// Sets `set` on the row with `key` if its version is `expected`.
    pub async fn update<E: PatternExec + ?Sized>(
        &self,
        exec: &mut E,
        key: &[Value<'_>],
        expected: i64,
        set: &[(&str, Value<'_>)],
    ) -> Result<VersionedUpdate, StoreError> {
        check_arity(self.keys.len(), key.len())?;
        let columns: Vec<&str> = set.iter().map(|(c, _)| *c).collect();
        for c in &columns {
            ident(c).map_err(|e| StoreError::Database { source: e.into() })?;
        }
        let mut binds: Vec<Value<'_>> = set.iter().map(|(_, v)| *v).collect();
        binds.extend_from_slice(key);
        binds.push(Value::Int(expected));
        if let Some(version) = exec.fetch_int(&self.update_sql(&columns), &binds).await? {
            return Ok(VersionedUpdate::Updated { version });
        }
        Ok(match exec.fetch_int(&self.read_sql(), key).await? {
            Some(current) => VersionedUpdate::Stale { current },
            None => VersionedUpdate::Missing,
        })
    }
}

/// A row set to absolute values: inserted if missing, overwritten if not.
/// Repeating it leaves the same row; columns it does not name keep their
/// values (or their defaults on insert).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upsert {
    table: String,
    keys: Vec<String>,
    values: Vec<String>,
    version: Option<String>,
}

impl Upsert {
    /// `table`'s row found by `keys`, setting `values`.
    pub fn new(table: &str, keys: &[&str], values: &[&str]) -> Result<Self, PatternError> {
        Ok(Self {
            table: ident(table)?,
            keys: idents(keys)?,
            values: idents(values)?,
            version: None,
        })
    }

    /// Also moves this integer column to the next version on overwrite, so
    /// a [`Versioned`] writer that read the row before sees it changed.
    pub fn bumping(mut self, version: &str) -> Result<Self, PatternError> {
        self.version = Some(ident(version)?);
        Ok(self)
    }

    /// `INSERT … ON CONFLICT (keys) DO UPDATE SET v = excluded.v …`: binds
    /// the keys, then the values.
    pub fn sql(&self) -> String {
        let columns: Vec<&str> = self
            .keys
            .iter()
            .chain(&self.values)
            .map(String::as_str)
            .collect();
        let placeholders = (1..=columns.len())
            .map(|i| format!("${i}"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut assignments: Vec<String> = self
            .values
            .iter()
            .map(|v| format!("{v} = excluded.{v}"))
            .collect();
        if let Some(v) = &self.version {
            assignments.push(format!("{v} = {}.{v} + 1", self.table));
        }
        format!(
            "INSERT INTO {} ({}) VALUES ({placeholders}) ON CONFLICT ({}) DO UPDATE SET {}",
            self.table,
            columns.join(", "),
            self.keys.join(", "),
            assignments.join(", ")
        )
    }

    /// Writes the row.
    pub async fn write<E: PatternExec + ?Sized>(
        &self,
        exec: &mut E,
        key: &[Value<'_>],
        values: &[Value<'_>],
    ) -> Result<(), StoreError> {
        check_arity(self.keys.len(), key.len())?;
        check_arity(self.values.len(), values.len())?;
        let binds: Vec<Value<'_>> = key.iter().chain(values).copied().collect();
        exec.execute(&self.sql(), &binds).await.map(drop)
    }
}

/// A pattern's values as a statement's.
fn stmt<'a>(sql: &'a str, binds: &'a [Value<'a>]) -> Stmt<'a> {
    binds.iter().fold(Stmt::new(sql), |s, v| match *v {
        Value::Text(t) => s.bind(t),
        Value::Int(i) => s.bind(i),
        Value::NullText => s.bind(None::<&str>),
        Value::NullInt => s.bind(None::<i64>),
    })
}

/// [`PatternExec::fetch_text`] on a dialect's connection: the first column
/// of the first row.
pub async fn fetch_text<D: Dialect>(
    conn: &mut <D::Db as sqlx::Database>::Connection,
    sql: &str,
    binds: &[Value<'_>],
) -> Result<Option<String>, StoreError> {
    match D::fetch_optional(On::Conn(conn), stmt(sql, binds))
        .await
        .map_err(D::map_err)?
    {
        Some(row) => crate::row::get_at(&row, 0).map(Some).map_err(caller_sql),
        None => Ok(None),
    }
}

/// A first column that does not decode as asked is the caller's SQL asking
/// for the wrong type ([`StoreError::Database`], as the driver says it), not
/// a corrupt record of Idem's.
fn caller_sql(e: StoreError) -> StoreError {
    match e {
        StoreError::Corrupt { detail } => StoreError::Database {
            source: detail.into(),
        },
        other => other,
    }
}

/// [`PatternExec::fetch_int`] on a dialect's connection.
pub async fn fetch_int<D: Dialect>(
    conn: &mut <D::Db as sqlx::Database>::Connection,
    sql: &str,
    binds: &[Value<'_>],
) -> Result<Option<i64>, StoreError> {
    match D::fetch_optional(On::Conn(conn), stmt(sql, binds))
        .await
        .map_err(D::map_err)?
    {
        Some(row) => crate::row::get_at(&row, 0).map(Some).map_err(caller_sql),
        None => Ok(None),
    }
}

/// [`PatternExec::execute`] on a dialect's connection.
pub async fn execute<D: Dialect>(
    conn: &mut <D::Db as sqlx::Database>::Connection,
    sql: &str,
    binds: &[Value<'_>],
) -> Result<u64, StoreError> {
    D::execute(On::Conn(conn), stmt(sql, binds))
        .await
        .map_err(D::map_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn orders() -> StateMachine {
        StateMachine::new("orders", &["tenant_id", "id"], "status")
            .unwrap()
            .allow("pending", &["confirmed", "failed"])
            .allow("confirmed", &["refunded"])
    }

    #[test]
    fn identifiers_are_checked_once() {
        assert!(StateMachine::new("orders; drop", &["id"], "status").is_err());
        assert!(StateMachine::new("orders", &[], "status").is_err());
        assert!(Versioned::new("t", &["Id"], "version").is_err());
        assert!(Upsert::new("t", &["id"], &["1x"]).is_err());
        assert!(
            Upsert::new("t", &["id"], &["x"])
                .unwrap()
                .bumping("v v")
                .is_err()
        );
    }

    #[test]
    fn transitions_name_their_sources() {
        let sm = orders();
        assert_eq!(sm.sources("confirmed"), vec!["pending"]);
        assert_eq!(
            sm.update_sql("pending", &[]),
            None,
            "nothing leads back to pending"
        );
        assert_eq!(
            sm.update_sql("refunded", &[]).unwrap(),
            "UPDATE orders SET status = $1 WHERE tenant_id = $2 AND id = $3 \
             AND status IN ($4) RETURNING status"
        );
        assert_eq!(
            sm.read_sql(),
            "SELECT status FROM orders WHERE tenant_id = $1 AND id = $2"
        );
        assert_eq!(sm.outcome(true, None, "x"), Transition::Moved);
        assert_eq!(sm.outcome(false, None, "x"), Transition::Missing);
    }

    #[test]
    fn versioned_updates_check_the_version_last() {
        let v = Versioned::new("stock", &["sku"], "version").unwrap();
        assert_eq!(
            v.update_sql(&["available"]),
            "UPDATE stock SET available = $1, version = version + 1 \
             WHERE sku = $2 AND version = $3 RETURNING version"
        );
    }

    #[test]
    fn upserts_set_absolute_values() {
        let u = Upsert::new("stock", &["tenant_id", "sku"], &["available"])
            .unwrap()
            .bumping("version")
            .unwrap();
        assert_eq!(
            u.sql(),
            "INSERT INTO stock (tenant_id, sku, available) VALUES ($1, $2, $3) \
             ON CONFLICT (tenant_id, sku) DO UPDATE SET available = excluded.available, \
             version = stock.version + 1"
        );
    }

    /// An in-memory table of one row, to run the logic without a database.
    struct OneRow(Option<String>);

    impl PatternExec for OneRow {
        fn fetch_text<'a>(
            &'a mut self,
            sql: &'a str,
            binds: &'a [Value<'a>],
        ) -> BoxFuture<'a, Result<Option<String>, StoreError>> {
            Box::pin(async move {
                if sql.starts_with("SELECT") {
                    return Ok(self.0.clone());
                }
                let Value::Text(to) = binds[0] else {
                    unreachable!()
                };
                let sources: Vec<&str> = binds[3..]
                    .iter()
                    .map(|v| match v {
                        Value::Text(s) => *s,
                        _ => "",
                    })
                    .collect();
                match &self.0 {
                    Some(s) if sources.contains(&s.as_str()) => {
                        self.0 = Some(to.to_owned());
                        Ok(self.0.clone())
                    }
                    _ => Ok(None),
                }
            })
        }
        fn fetch_int<'a>(
            &'a mut self,
            _: &'a str,
            _: &'a [Value<'a>],
        ) -> BoxFuture<'a, Result<Option<i64>, StoreError>> {
            Box::pin(async { Ok(None) })
        }
        fn execute<'a>(
            &'a mut self,
            _: &'a str,
            _: &'a [Value<'a>],
        ) -> BoxFuture<'a, Result<u64, StoreError>> {
            Box::pin(async { Ok(0) })
        }
    }

    #[tokio::test]
    async fn a_repeated_transition_is_already_there_and_a_wrong_one_illegal() {
        let sm = orders();
        let key = [Value::Text("t"), Value::Text("o1")];
        let mut row = OneRow(Some("pending".into()));
        assert_eq!(
            sm.transition(&mut row, &key, "confirmed", &[])
                .await
                .unwrap(),
            Transition::Moved
        );
        assert_eq!(
            sm.transition(&mut row, &key, "confirmed", &[])
                .await
                .unwrap(),
            Transition::AlreadyThere
        );
        assert_eq!(
            sm.transition(&mut row, &key, "failed", &[]).await.unwrap(),
            Transition::Illegal {
                current: "confirmed".into()
            }
        );
        assert_eq!(
            sm.transition(&mut OneRow(None), &key, "failed", &[])
                .await
                .unwrap(),
            Transition::Missing
        );
        assert!(
            sm.transition(&mut row, &key[..1], "failed", &[])
                .await
                .is_err()
        );
        assert!(
            sm.transition(&mut row, &key, "failed", &[("x; --", Value::Int(1))])
                .await
                .is_err()
        );
    }
}
