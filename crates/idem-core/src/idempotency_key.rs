//! The `Idempotency-Key` value and its parser.

use std::fmt;

use crate::error::KeyError;

/// A validated idempotency key: 1 to 255 visible ASCII characters (`0x21..=0x7E`).
///
/// The only ways to build one are [`IdempotencyKey::new`] and
/// [`IdempotencyKey::from_header`], so holding one proves it is valid.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The longest key accepted, in characters (which are bytes: keys are ASCII).
    pub const MAX_LEN: usize = 255;

    /// Validates a raw key (no quoting).
    pub fn new(key: impl Into<String>) -> Result<Self, KeyError> {
        let key = key.into();
        validate(key.as_bytes())?;
        Ok(Self(key))
    }

    /// Parses an `Idempotency-Key` header value: either an RFC 8941 string
    /// (`"abc"`, with `\"` and `\\` escapes) or a bare token (`abc`).
    ///
    /// Leading and trailing spaces and tabs are ignored, as HTTP allows.
    pub fn from_header(value: &[u8]) -> Result<Self, KeyError> {
        let value = trim_ows(value);
        if value.is_empty() {
            return Err(KeyError::Empty);
        }
        if value[0] == b'"' {
            let unquoted = parse_sf_string(value)?;
            validate(unquoted.as_bytes())?;
            return Ok(Self(unquoted));
        }
        validate(value)?;
        if let Some(position) = value.iter().position(|b| matches!(b, b'"' | b'\\')) {
            return Err(KeyError::NeedsQuoting { position });
        }
        // `validate` proved every byte is visible ASCII, hence valid UTF-8.
        Ok(Self(value.iter().map(|&b| b as char).collect()))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A short hash of the key for logs and traces ([`short_hash`]): never
    /// log the key itself.
    pub fn short_hash(&self) -> String {
        short_hash(self.0.as_bytes())
    }
}

/// The first 12 hex characters of the SHA-256 of `bytes`: enough to tell
/// keys (or message ids) apart in logs and traces without revealing them.
pub fn short_hash(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    use std::fmt::Write;
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(12);
    for b in &digest[..6] {
        let _ = write!(out, "{b:02x}");
    }
    out
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("IdempotencyKey").field(&self.0).finish()
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn trim_ows(mut value: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = value {
        value = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = value {
        value = rest;
    }
    value
}

fn validate(key: &[u8]) -> Result<(), KeyError> {
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > IdempotencyKey::MAX_LEN {
        return Err(KeyError::TooLong { len: key.len() });
    }
    if let Some(position) = key.iter().position(|b| !(0x21..=0x7e).contains(b)) {
        return Err(KeyError::InvalidChar { position });
    }
    Ok(())
}

/// RFC 8941 §4.2.5: `"` then printable ASCII with `\"` / `\\` escapes, then `"`.
fn parse_sf_string(value: &[u8]) -> Result<String, KeyError> {
    let mut out = String::with_capacity(value.len());
    let mut bytes = value.iter().enumerate().skip(1);
    while let Some((i, &b)) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some((_, &e @ (b'"' | b'\\'))) => out.push(e as char),
                _ => return Err(KeyError::BadQuoting { position: i }),
            },
            b'"' => {
                return if i + 1 == value.len() {
                    Ok(out)
                } else {
                    Err(KeyError::BadQuoting { position: i + 1 })
                };
            }
            0x20..=0x7e => out.push(b as char),
            _ => return Err(KeyError::InvalidChar { position: i }),
        }
    }
    Err(KeyError::BadQuoting {
        position: value.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_hash_is_twelve_hex_of_sha256() {
        // SHA-256("abc") = ba7816bf8f01cfea…
        assert_eq!(short_hash(b"abc"), "ba7816bf8f01");
        let key = IdempotencyKey::new("abc").unwrap();
        assert_eq!(key.short_hash(), "ba7816bf8f01");
    }

    #[test]
    fn bare_and_quoted_forms_parse_to_the_same_key() {
        let bare = IdempotencyKey::from_header(b"order-42").unwrap();
        let quoted = IdempotencyKey::from_header(b"\"order-42\"").unwrap();
        assert_eq!(bare, quoted);
        assert_eq!(bare.as_str(), "order-42");
        let padded = IdempotencyKey::from_header(b" \t\"order-42\" ").unwrap();
        assert_eq!(padded, bare);
    }

    #[test]
    fn escapes_in_quoted_form_are_decoded() {
        let k = IdempotencyKey::from_header(br#""a\"b\\c""#).unwrap();
        assert_eq!(k.as_str(), r#"a"b\c"#);
    }

    #[test]
    fn boundaries_of_length() {
        assert_eq!(IdempotencyKey::from_header(b""), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::from_header(b"   "), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::from_header(b"\"\""), Err(KeyError::Empty));
        let max = "k".repeat(255);
        assert!(IdempotencyKey::from_header(max.as_bytes()).is_ok());
        let over = "k".repeat(256);
        assert_eq!(
            IdempotencyKey::from_header(over.as_bytes()),
            Err(KeyError::TooLong { len: 256 })
        );
        let quoted_over = format!("\"{over}\"");
        assert_eq!(
            IdempotencyKey::from_header(quoted_over.as_bytes()),
            Err(KeyError::TooLong { len: 256 })
        );
    }

    #[test]
    fn non_visible_characters_are_rejected() {
        assert_eq!(
            IdempotencyKey::from_header(b"a b"),
            Err(KeyError::InvalidChar { position: 1 })
        );
        assert!(matches!(
            IdempotencyKey::from_header(b"\"a b\""),
            Err(KeyError::InvalidChar { .. })
        ));
        assert!(IdempotencyKey::from_header("caf\u{e9}".as_bytes()).is_err());
        assert!(IdempotencyKey::from_header(b"a\x7fb").is_err());
        assert!(IdempotencyKey::from_header(b"a\x00b").is_err());
        assert!(IdempotencyKey::new("tab\there").is_err());
    }

    #[test]
    fn broken_quoting_is_rejected() {
        assert!(matches!(
            IdempotencyKey::from_header(b"\"abc"),
            Err(KeyError::BadQuoting { .. })
        ));
        assert!(matches!(
            IdempotencyKey::from_header(b"\"abc\"def"),
            Err(KeyError::BadQuoting { .. })
        ));
        assert!(matches!(
            IdempotencyKey::from_header(br#""a\nb""#),
            Err(KeyError::BadQuoting { .. })
        ));
        assert!(matches!(
            IdempotencyKey::from_header(b"ab\"c"),
            Err(KeyError::NeedsQuoting { position: 2 })
        ));
        let bare_backslash = IdempotencyKey::from_header(b"ab\\").unwrap_err();
        assert_eq!(bare_backslash, KeyError::NeedsQuoting { position: 2 });
        assert!(
            bare_backslash.to_string().contains("quoted key"),
            "{bare_backslash}"
        );
        // The same characters, quoted and escaped, are a key.
        assert_eq!(
            IdempotencyKey::from_header(br#""ab\\\"c""#)
                .unwrap()
                .as_str(),
            r#"ab\"c"#
        );
    }
}
