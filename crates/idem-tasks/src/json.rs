//! [`JsonText`]: JSON as its client wrote it — payloads, results, cursors.

use std::fmt;

use idem_core::FingerprintSpec;
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::TasksError;

/// JSON as its client wrote it: a task's payload, a result, a poller's
/// cursor. It is kept as text, so a number keeps every digit it was sent
/// with — a [`serde_json::Value`] holds a number as an `f64` or a 64-bit
/// integer and rounds the rest (`123456789012345678901234567890` would be
/// `1.2345678901234568e+29`).
///
/// An operation checks it when it reads it: strict JSON (RFC 8259, nested
/// at most 128 deep, every number within the range of an `f64` — what
/// every JSON reader an agent uses holds, rounded or not); it is stored as
/// written, without the white space between its tokens, and compared as a
/// JSON value, by the reader of request fingerprints
/// ([`FingerprintSpec::canonical_body`]): key order, white space and how a
/// number is written (`1`, `1.0`, `10e-1`) do not matter, any digit does.
///
/// Made from a `Value` it is that value's JSON; read with `serde_json`
/// (it is `Deserialize` with `serde_json` only) it is the text of the value
/// as the document wrote it.
#[derive(Clone, PartialEq, Eq)]
pub struct JsonText(String);

impl JsonText {
    /// `text`, a JSON text, checked when an operation reads it.
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// The text as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The text checked: what is stored and what is compared; refused
    /// ([`TasksError::Invalid`], naming `what`) when it is not JSON or its
    /// stored form is over `limit` bytes.
    pub(crate) fn check(&self, limit: usize, what: &str) -> Result<Checked, TasksError> {
        let canonical = FingerprintSpec::default()
            .canonical_body(self.0.as_bytes())
            .and_then(|c| String::from_utf8(c).ok())
            .ok_or_else(|| {
                TasksError::invalid(format!(
                    "{what} is not JSON (RFC 8259, nested at most 128 deep)"
                ))
            })?;
        let text = compact(&self.0);
        if text.len() > limit {
            return Err(TasksError::invalid(format!(
                "{what} is {} bytes of JSON; at most {limit}",
                text.len()
            )));
        }
        // A number beyond an f64's range makes a whole answer unreadable
        // to most JSON readers (serde_json and Go refuse it), not merely
        // rounded: refused, as it always was.
        if let Err(e) = serde_json::from_str::<Value>(&text) {
            return Err(TasksError::invalid(format!("{what}: {e}")));
        }
        Ok(Checked { text, canonical })
    }
}

impl Default for JsonText {
    /// `null`.
    fn default() -> Self {
        Self("null".into())
    }
}

impl From<Value> for JsonText {
    fn from(value: Value) -> Self {
        Self(value.to_string())
    }
}

impl From<&Value> for JsonText {
    fn from(value: &Value) -> Self {
        Self(value.to_string())
    }
}

/// Its length only: a payload is a client's data, never logged.
impl fmt::Debug for JsonText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JsonText({} bytes)", self.0.len())
    }
}

/// With `serde_json`: the value's text exactly as the document wrote it
/// (through [`RawValue`], so no number is read into an `f64`).
impl<'de> Deserialize<'de> for JsonText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        Ok(Self(raw.get().to_owned()))
    }
}

/// A [`JsonText`] checked.
#[derive(Debug, Clone)]
pub(crate) struct Checked {
    /// As written, without white space between tokens: stored and shown.
    pub(crate) text: String,
    /// Its canonical form: what is compared and hashed.
    pub(crate) canonical: String,
}

/// The canonical form of stored JSON text, to compare it with a
/// [`Checked`]; `None` when it is not JSON.
pub(crate) fn canonical(text: &str) -> Option<String> {
    FingerprintSpec::default()
        .canonical_body(text.as_bytes())
        .and_then(|c| String::from_utf8(c).ok())
}

/// `text` (JSON, already read) without the white space between its tokens;
/// everything else — numbers, escapes, key order — as written.
fn compact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in text.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            in_string = c == '"';
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_drops_white_space_between_tokens_only() {
        let text = " { \"a b\" : [ 1.50 , \"x \\\" y\\\\\" ,\n\t-0 ] , \"c\":1E+2 } ";
        assert_eq!(compact(text), r#"{"a b":[1.50,"x \" y\\",-0],"c":1E+2}"#);
    }

    #[test]
    fn checked_keeps_digits_and_compares_values() {
        let big = JsonText::new(r#"{"b": 0.10, "a": 123456789012345678901234567890}"#);
        let c = big.check(1024, "payload").unwrap();
        assert_eq!(c.text, r#"{"b":0.10,"a":123456789012345678901234567890}"#);
        let same = JsonText::new(r#"{"a":1.2345678901234567890123456789e29,"b":0.1}"#);
        assert_eq!(same.check(1024, "payload").unwrap().canonical, c.canonical);
        let next = JsonText::new(r#"{"a":123456789012345678901234567891,"b":0.1}"#);
        assert_ne!(next.check(1024, "payload").unwrap().canonical, c.canonical);
    }

    #[test]
    fn checked_refuses_what_no_reader_holds() {
        let refused = |text: &str, limit: usize| match JsonText::new(text).check(limit, "payload") {
            Err(TasksError::Invalid(detail)) => detail,
            other => panic!("{text}: {other:?}"),
        };
        assert!(refused("{", 64).contains("not JSON"));
        assert!(refused(r#"{"a":1} x"#, 64).contains("not JSON"));
        assert!(refused(r#"{"a":1e400}"#, 64).contains("number out of range"));
        assert!(refused(r#"[1,  2,  3]"#, 6).contains("7 bytes of JSON; at most 6"));
        assert!(JsonText::new("[1,  2,  3]").check(7, "payload").is_ok());
    }
}
