//! Idem's own statements on the fresh path, with their values written into
//! the text: `BEGIN` and the claim go to the server in one simple-query
//! message, and so do the stored record and `COMMIT` — two round trips
//! fewer than binding each statement in a message of its own. The
//! statements themselves are prepared once per writer connection; the
//! messages `EXECUTE` them (see `keys::prepared`), so the values written
//! here are the arguments of an `EXECUTE`.
//!
//! Values are encoded, never pasted, and the message is ASCII whatever
//! they hold: bytes as `pg_catalog.decode('…', 'hex')`, text as those
//! bytes (UTF-8) through `pg_catalog.convert_from(…, 'UTF8')`, numbers as
//! digits (a negative one in parentheses), `NULL` as `NULL`; text in the
//! database's default collation, as the key columns are. Inside the
//! quotes there are only hex digits, so the text means the same under any
//! session setting business code may have left on the connection —
//! `standard_conforming_strings` off (a backslash then escapes), or another
//! `client_encoding` (in which a multi-byte character could end in a quote
//! or a backslash) — and no value can end its literal. A NUL character,
//! which no PostgreSQL text can hold, is refused as the caller's input
//! before anything is sent. The statements are [`idem_sql`]'s, with `$n`
//! replaced by the n-th value.

use idem_core::StoreError;

/// One value written into a statement.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Lit<'a> {
    Text(&'a str),
    OptText(Option<&'a str>),
    Bytes(&'a [u8]),
    Int(i64),
}

/// `sql` with each `$n` replaced by `values[n - 1]`, encoded. The texts of
/// [`idem_sql`] hold no `$` but their parameters (a test checks it).
pub(crate) fn inline(sql: &str, values: &[Lit<'_>]) -> Result<String, StoreError> {
    let mut out = String::with_capacity(sql.len() + 64);
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..]
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len() - at - 1);
        let n: usize = rest[at + 1..at + 1 + digits]
            .parse()
            .map_err(|_| corrupt(format!("a `$` without a number in {sql:?}")))?;
        let value = n
            .checked_sub(1)
            .and_then(|i| values.get(i))
            .ok_or_else(|| corrupt(format!("no value for ${n}")))?;
        write(&mut out, *value)?;
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    Ok(out)
}

fn write(out: &mut String, value: Lit<'_>) -> Result<(), StoreError> {
    use std::fmt::Write as _;
    match value {
        Lit::Text(s) | Lit::OptText(Some(s)) => {
            if s.contains('\0') {
                return Err(StoreError::InvalidValue {
                    source: "a text value holds a NUL character, which PostgreSQL text cannot"
                        .into(),
                });
            }
            // `COLLATE "default"`: the result would take the collation of
            // the encoding's name (type `name`, collation "C"), and a
            // comparison with a key column could then not use its index.
            out.push_str("pg_catalog.convert_from(");
            hex(out, s.as_bytes());
            out.push_str(", 'UTF8') COLLATE \"default\"");
        }
        Lit::OptText(None) => out.push_str("NULL"),
        Lit::Bytes(b) => hex(out, b),
        Lit::Int(i) if i < 0 => {
            let _ = write!(out, "({i})");
        }
        Lit::Int(i) => {
            let _ = write!(out, "{i}");
        }
    }
    Ok(())
}

/// `bytes` as a `bytea` expression whose literal holds hex digits only.
fn hex(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.reserve(bytes.len() * 2 + 32);
    out.push_str("pg_catalog.decode('");
    for &byte in bytes {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    out.push_str("', 'hex')");
}

/// What a guarded statement's error says first (see [`guarded`]).
const GUARD: &str = "idem: ";

/// `statement` (which returns one row per row it wrote) as one that fails
/// unless it wrote exactly one row, with `what` in its error: a `COMMIT` in
/// the same message then never runs. The failing branch depends on the
/// count, so PostgreSQL cannot fold it away at planning time.
pub(crate) fn guarded(statement: &str, what: &str) -> String {
    format!(
        "WITH w AS ({statement}) SELECT CASE count(*) WHEN 1 THEN 1 \
         ELSE ('{GUARD}{what} (' || count(*) || ' rows)')::int END FROM w"
    )
}

/// Whether `e` is a [`guarded`] statement's refusal (`22P02`, its text).
pub(crate) fn is_guard(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => {
            db.code().as_deref() == Some("22P02") && db.message().contains(&format!("\"{GUARD}"))
        }
        _ => false,
    }
}

fn corrupt(detail: String) -> StoreError {
    StoreError::Corrupt { detail }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_encoded_in_place() {
        let sql = inline(
            "INSERT INTO t VALUES ($1, $2, $3, $4, $5, $10)",
            &[
                Lit::Text("it's"),
                Lit::OptText(None),
                Lit::Bytes(&[0, 0xab, 0xff]),
                Lit::Int(-42),
                Lit::Text("a\\b''"),
                Lit::Int(0),
                Lit::Int(0),
                Lit::Int(0),
                Lit::Int(0),
                Lit::Int(10),
            ],
        )
        .unwrap();
        assert_eq!(
            sql,
            "INSERT INTO t VALUES (pg_catalog.convert_from(pg_catalog.decode('69742773', 'hex'), 'UTF8') \
             COLLATE \"default\", NULL, pg_catalog.decode('00abff', 'hex'), (-42), \
             pg_catalog.convert_from(pg_catalog.decode('615c622727', 'hex'), 'UTF8') COLLATE \"default\", 10)"
        );
    }

    #[test]
    fn the_message_is_ascii_and_no_value_leaves_its_quotes() {
        let nasty = "\\',$$x$$;COMMIT;--/*ünï✓\u{1F600}\r\n\t\\'";
        let sql = inline(
            "SELECT $1, $2",
            &[Lit::Text(nasty), Lit::Bytes(nasty.as_bytes())],
        )
        .unwrap();
        assert!(sql.is_ascii(), "{sql}");
        // Between the quotes only hex digits: no value can end a literal.
        let quoted: Vec<&str> = sql.split('\'').skip(1).step_by(2).collect();
        assert_eq!(quoted.len(), 5, "{sql}");
        for q in quoted {
            assert!(
                q.chars().all(|c| c.is_ascii_hexdigit()) || q == "hex" || q == "UTF8",
                "{q:?} in {sql}"
            );
        }
        assert!(!sql.contains('\\') && !sql.contains("--") && !sql.contains(';'));
    }

    #[test]
    fn a_nul_or_a_missing_value_is_refused() {
        assert!(matches!(
            inline("SELECT $1", &[Lit::Text("a\0b")]),
            Err(StoreError::InvalidValue { .. })
        ));
        assert!(matches!(
            inline("SELECT $2", &[Lit::Int(1)]),
            Err(StoreError::Corrupt { .. })
        ));
        assert!(matches!(
            inline("SELECT $0", &[Lit::Int(1)]),
            Err(StoreError::Corrupt { .. })
        ));
    }

    #[test]
    fn the_templates_hold_no_dollar_but_their_parameters() {
        use idem_sql::keys::{INSERT_COMPLETED, UPDATE_COMPLETE, postgres::INSERT_CLAIM};
        for sql in [INSERT_CLAIM, INSERT_COMPLETED, UPDATE_COMPLETE] {
            let mut rest = sql;
            while let Some(at) = rest.find('$') {
                let next = rest[at + 1..].chars().next();
                assert!(next.is_some_and(|c| c.is_ascii_digit()), "{sql}");
                rest = &rest[at + 1..];
            }
        }
    }
}
