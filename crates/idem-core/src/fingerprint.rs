//! Request fingerprints: what makes two requests "the same intent".

mod json;

use std::fmt;

use sha2::{Digest, Sha256};

use crate::scope::Operation;

/// SHA-256 over a request's method, operation, target and body.
///
/// JSON bodies are canonicalised first (object keys sorted, insignificant
/// whitespace dropped, configured fields removed), so key order and formatting do
/// not change the fingerprint. Any other body is hashed as raw bytes.
///
/// **Invariant:** two JSON bodies get one fingerprint exactly when they are the
/// same JSON value (after the ignored fields are removed): numbers are compared
/// by exact decimal value, never through `f64`, strings after their escapes are
/// decoded, objects as maps in which the last of duplicated keys wins. See
/// [`FingerprintSpec::canonical_body`] for the canonical form.
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
    /// one intent (client timestamps, trace ids) belong here. Array steps are
    /// indices as RFC 6901 writes them: `/items/0/ts`, while `/items/01/ts`
    /// names no array element.
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
    ///
    /// A body marked as JSON is hashed in its canonical form
    /// ([`canonical_body`](Self::canonical_body)); any other body, and a JSON
    /// body the canonical reader refuses, is hashed as its raw bytes under a
    /// different tag, so the two kinds never collide.
    pub fn fingerprint(&self, parts: &RequestParts<'_>) -> Fingerprint {
        let mut h = Sha256::new();
        h.update(PREFIX);
        frame(&mut h, parts.method.as_bytes());
        frame(&mut h, parts.operation.as_str().as_bytes());
        frame(&mut h, parts.target.as_bytes());
        let canonical = if parts.json {
            self.canonical_body(parts.body)
        } else {
            None
        };
        match canonical {
            Some(canonical) => {
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

    /// The canonical form of a JSON body, as [`fingerprint`](Self::fingerprint)
    /// hashes it, with the ignored fields removed; `None` when the body is
    /// hashed as raw bytes instead.
    ///
    /// The body is read strictly by RFC 8259: UTF-8, escapes decoded (surrogate
    /// pairs joined), any value at the top. The canonical form has no
    /// whitespace, object keys in UTF-8 byte order with the last of duplicated
    /// keys kept (what serde-based servers see), strings escaped minimally
    /// (`"`, `\` and control characters only), and each number in one spelling
    /// of its exact decimal value: `1`, `1.0` and `10e-1` are all `1`, while
    /// `18446744073709551616` and `18446744073709551617`, or
    /// `0.30000000000000001` and `0.3`, stay apart. Integers of up to 21 digits
    /// are written in full, other numbers positionally (`12.34`, `0.00001`) or
    /// in scientific notation (`1e-6`, `1.5e+300`); `-0` is `0`.
    ///
    /// `None` — the raw-bytes fallback — for a body that is not exactly JSON,
    /// nests arrays and objects deeper than 128, or has a number whose exponent
    /// (as written or normalised) is beyond ±999 999 999. The fallback is
    /// deterministic and never merges two different bodies; it only stops
    /// equivalent spellings of such a body from matching.
    ///
    /// ```
    /// use idem_core::FingerprintSpec;
    /// let spec = FingerprintSpec::default();
    /// let canonical = spec.canonical_body(br#"{ "b": 1.50, "a": "\u0041" }"#);
    /// assert_eq!(canonical.as_deref(), Some(&br#"{"a":"A","b":1.5}"#[..]));
    /// assert_eq!(spec.canonical_body(b"{not json"), None);
    /// ```
    pub fn canonical_body(&self, body: &[u8]) -> Option<Vec<u8>> {
        let mut value = json::parse(body)?;
        for path in &self.ignored {
            json::remove_path(&mut value, path);
        }
        let mut canonical = Vec::with_capacity(body.len());
        json::write(&value, &mut canonical);
        Some(canonical)
    }
}

/// Domain separation for the digest.
///
/// Still `v1` after numbers stopped going through `f64`: for ordinary bodies —
/// objects, arrays, strings, booleans, null, integers within `i64`/`u64`
/// written as integers, and non-integers of at most 15 significant digits and
/// 22 decimals such as `12.34` or `1.5` (which `serde_json` read exactly) —
/// the canonical bytes are what they were, so records stored before an
/// upgrade keep replaying a retry that arrives after it; `v2` would turn every
/// such retry within the TTL into a 422. The bytes differ only for numbers the
/// old form rounded (beyond `u64`, more significant digits), integers written
/// with a fraction or an exponent (`1.0` and `1e3` were `1.0` and `1000.0`,
/// now `1` and `1000`), `-0`, and numbers beyond `f64`'s range (then hashed
/// raw): a retry of such a body across the upgrade gets a 422 and nothing runs
/// twice. Every spelling, old or new, is a JSON number denoting its value, so
/// a new request matches an old record only when its value is the number the
/// old form wrote — for an ordinary body, that record's own value.
const PREFIX: &[u8] = b"idem-fingerprint-v1\0";

fn frame(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_be_bytes());
    h.update(bytes);
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod proptests;
