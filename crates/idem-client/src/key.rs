//! The idempotency key: checked the way an Idem server checks it, and put on
//! the wire in a form every server reads.

use http::HeaderValue;

use crate::ClientError;

/// The longest key, in characters (keys are ASCII, so also in bytes).
pub const MAX_KEY_LEN: usize = idem_core::IdempotencyKey::MAX_LEN;

/// Checks a caller's key with the server's own rule
/// ([`idem_core::IdempotencyKey::new`]: 1 to 255 visible ASCII characters,
/// `0x21..=0x7E`), so a key the server would refuse is refused here,
/// before anything is sent.
pub(crate) fn validate(key: &str) -> Result<(), ClientError> {
    idem_core::IdempotencyKey::new(key)
        .map(drop)
        .map_err(|e| ClientError::InvalidKey {
            reason: e.to_string(),
        })
}

/// A generated key: a v4 UUID, hyphenated (36 characters).
pub(crate) fn generate() -> String {
    uuid::Uuid::new_v4().hyphenated().to_string()
}

/// The header value for a valid key: the bare token, or, when the key holds
/// `"` or `\`, an RFC 8941 string with those escaped (a bare token may not
/// hold them; Idem accepts both forms and unquotes the second).
pub(crate) fn header_value(key: &str) -> Result<HeaderValue, ClientError> {
    let value = if key.bytes().any(|b| matches!(b, b'"' | b'\\')) {
        let mut quoted = String::with_capacity(key.len() + 4);
        quoted.push('"');
        for c in key.chars() {
            if matches!(c, '"' | '\\') {
                quoted.push('\\');
            }
            quoted.push(c);
        }
        quoted.push('"');
        HeaderValue::from_str(&quoted)
    } else {
        HeaderValue::from_str(key)
    };
    value.map_err(|_| ClientError::InvalidKey {
        reason: "not a valid header value".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundaries() {
        assert!(validate("k").is_ok());
        assert!(validate(&"k".repeat(255)).is_ok());
        assert!(validate("!~").is_ok());
        for bad in [
            String::new(),
            "k".repeat(256),
            "a b".into(),
            "a\tb".into(),
            "a\nb".into(),
            "a\x7fb".into(),
            "a\x00b".into(),
            "caf\u{e9}".into(),
        ] {
            assert!(
                matches!(validate(&bad), Err(ClientError::InvalidKey { .. })),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn generated_keys_are_valid_and_distinct() {
        let (a, b) = (generate(), generate());
        assert!(validate(&a).is_ok());
        assert_eq!(a.len(), 36);
        assert_ne!(a, b);
    }

    #[test]
    fn quotes_and_backslashes_are_sent_as_an_sf_string() {
        assert_eq!(header_value("order-42").unwrap(), "order-42");
        assert_eq!(header_value(r#"a"b\c"#).unwrap(), r#""a\"b\\c""#);
    }
}
