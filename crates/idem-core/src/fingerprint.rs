//! Request fingerprints: what makes two requests "the same intent".

use std::fmt;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::scope::Operation;

/// SHA-256 over a request's method, operation, target and body.
///
/// JSON bodies are canonicalised first (object keys sorted, insignificant
/// whitespace dropped, configured fields removed), so key order and formatting do
/// not change the fingerprint. Any other body is hashed as raw bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// Wraps raw digest bytes, e.g. read back from a store.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// Parses a digest from a slice, as stored; `None` unless it is 32 bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }

    /// The digest bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The digest as lowercase hex.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", &self.to_hex()[..16])
    }
}

/// The parts of a request that a fingerprint covers.
#[derive(Debug, Clone, Copy)]
pub struct RequestParts<'a> {
    /// HTTP method or another verb, e.g. `POST`.
    pub method: &'a str,
    /// The operation the key is scoped to.
    pub operation: &'a Operation,
    /// The request target (path and query). Included so that one key sent to
    /// `/payments/a/refunds` and to `/payments/b/refunds` is a mismatch, not a replay.
    pub target: &'a str,
    /// Whether the body should be read as JSON (e.g. from `Content-Type`).
    pub json: bool,
    /// The raw body.
    pub body: &'a [u8],
}

/// How fingerprints are computed: which JSON fields are left out.
#[derive(Debug, Clone, Default)]
pub struct FingerprintSpec {
    ignored: Vec<Vec<String>>,
}

impl FingerprintSpec {
    /// Leaves a JSON field out of the fingerprint, named by an RFC 6901 JSON
    /// pointer such as `/metadata/trace_id`. Fields that vary between retries of
    /// one intent (client timestamps, trace ids) belong here.
    ///
    /// Returns `None` if `pointer` is not a JSON pointer (it must start with `/`).
    pub fn ignore_field(mut self, pointer: &str) -> Option<Self> {
        let rest = pointer.strip_prefix('/')?;
        let path = rest
            .split('/')
            .map(|s| s.replace("~1", "/").replace("~0", "~"))
            .collect();
        self.ignored.push(path);
        Some(self)
    }

    /// Computes the fingerprint of a request.
    pub fn fingerprint(&self, parts: &RequestParts<'_>) -> Fingerprint {
        let mut h = Sha256::new();
        h.update(b"idem-fingerprint-v1\0");
        frame(&mut h, parts.method.as_bytes());
        frame(&mut h, parts.operation.as_str().as_bytes());
        frame(&mut h, parts.target.as_bytes());
        let parsed = if parts.json {
            serde_json::from_slice::<Value>(parts.body).ok()
        } else {
            None
        };
        match parsed {
            Some(mut value) => {
                for path in &self.ignored {
                    remove_path(&mut value, path);
                }
                let mut canonical = Vec::with_capacity(parts.body.len());
                write_canonical(&value, &mut canonical);
                h.update(b"J");
                frame(&mut h, &canonical);
            }
            None => {
                h.update(b"R");
                frame(&mut h, parts.body);
            }
        }
        Fingerprint(h.finalize().into())
    }
}

fn frame(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_be_bytes());
    h.update(bytes);
}

fn remove_path(value: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = value;
    for seg in parents {
        cur = match cur {
            Value::Object(map) => match map.get_mut(seg) {
                Some(v) => v,
                None => return,
            },
            Value::Array(items) => match seg.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                Some(v) => v,
                None => return,
            },
            _ => return,
        };
    }
    if let Value::Object(map) = cur {
        map.remove(last);
    }
}

/// Writes JSON with object keys sorted by their UTF-8 bytes and no whitespace,
/// independently of how `serde_json` orders its maps.
fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(k, out);
                out.push(b':');
                write_canonical(v, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(v, out);
            }
            out.push(b']');
        }
        Value::String(s) => write_string(s, out),
        // Scalars: serde_json's own rendering is already minimal and stable.
        other => out.extend_from_slice(other.to_string().as_bytes()),
    }
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(Value::String(s.to_owned()).to_string().as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(spec: &FingerprintSpec, json: bool, body: &str) -> Fingerprint {
        let op = Operation::new("payments.create").unwrap();
        spec.fingerprint(&RequestParts {
            method: "POST",
            operation: &op,
            target: "/v1/payments",
            json,
            body: body.as_bytes(),
        })
    }

    #[test]
    fn key_order_and_whitespace_do_not_matter_for_json() {
        let s = FingerprintSpec::default();
        let a = fp(
            &s,
            true,
            r#"{"amount":100,"currency":"EUR","meta":{"x":1,"y":[1,2]}}"#,
        );
        let b = fp(
            &s,
            true,
            "{ \"meta\": {\"y\": [1, 2], \"x\": 1},\n \"currency\": \"EUR\", \"amount\": 100 }",
        );
        assert_eq!(a, b);
    }

    #[test]
    fn values_and_array_order_do_matter() {
        let s = FingerprintSpec::default();
        assert_ne!(
            fp(&s, true, r#"{"amount":100}"#),
            fp(&s, true, r#"{"amount":101}"#)
        );
        assert_ne!(
            fp(&s, true, r#"{"a":[1,2]}"#),
            fp(&s, true, r#"{"a":[2,1]}"#)
        );
        assert_ne!(fp(&s, true, r#"{"a":"1"}"#), fp(&s, true, r#"{"a":1}"#));
    }

    #[test]
    fn raw_bodies_are_hashed_byte_for_byte() {
        let s = FingerprintSpec::default();
        assert_ne!(fp(&s, false, r#"{"a":1}"#), fp(&s, false, r#"{ "a": 1 }"#));
        // Invalid JSON under a JSON content type falls back to raw bytes.
        assert_eq!(fp(&s, true, "{not json"), fp(&s, false, "{not json"));
    }

    #[test]
    fn method_operation_and_target_are_covered() {
        let s = FingerprintSpec::default();
        let op = Operation::new("refunds.create").unwrap();
        let other = Operation::new("refunds.other").unwrap();
        let base = RequestParts {
            method: "POST",
            operation: &op,
            target: "/v1/payments/a/refunds",
            json: true,
            body: b"{}",
        };
        let f = s.fingerprint(&base);
        assert_ne!(
            f,
            s.fingerprint(&RequestParts {
                method: "PATCH",
                ..base
            })
        );
        assert_ne!(
            f,
            s.fingerprint(&RequestParts {
                operation: &other,
                ..base
            })
        );
        assert_ne!(
            f,
            s.fingerprint(&RequestParts {
                target: "/v1/payments/b/refunds",
                ..base
            })
        );
    }

    #[test]
    fn ignored_fields_are_left_out() {
        let s = FingerprintSpec::default()
            .ignore_field("/client_ts")
            .unwrap()
            .ignore_field("/meta/trace~1id")
            .unwrap();
        let a = fp(
            &s,
            true,
            r#"{"amount":1,"client_ts":"x","meta":{"trace/id":"a","k":1}}"#,
        );
        let b = fp(
            &s,
            true,
            r#"{"amount":1,"client_ts":"y","meta":{"trace/id":"b","k":1}}"#,
        );
        let c = fp(&s, true, r#"{"amount":1,"meta":{"k":1}}"#);
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert_ne!(a, fp(&s, true, r#"{"amount":1,"meta":{"k":2}}"#));
        assert!(
            FingerprintSpec::default()
                .ignore_field("no-slash")
                .is_none()
        );
    }

    #[test]
    fn hex_roundtrip() {
        let f = fp(&FingerprintSpec::default(), true, "{}");
        assert_eq!(f.to_hex().len(), 64);
        assert_eq!(Fingerprint::from_slice(f.as_bytes()), Some(f));
        assert_eq!(Fingerprint::from_slice(&[0u8; 31]), None);
    }
}
