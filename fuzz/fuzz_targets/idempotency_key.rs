//! `IdempotencyKey::from_header` on any bytes: it never panics, a key it
//! returns is 1–255 visible ASCII, and the key's RFC 8941 quoting (and its
//! bare form, where it has one) parses back to the same key.
#![no_main]

use idem_core::IdempotencyKey;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(key) = IdempotencyKey::from_header(data) else {
        return;
    };
    let s = key.as_str();
    assert!((1..=IdempotencyKey::MAX_LEN).contains(&s.len()), "{s:?}");
    assert!(s.bytes().all(|b| (0x21..=0x7e).contains(&b)), "{s:?}");
    let mut quoted = String::with_capacity(s.len() + 2);
    quoted.push('"');
    for c in s.chars() {
        if matches!(c, '"' | '\\') {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('"');
    assert_eq!(
        IdempotencyKey::from_header(quoted.as_bytes()).as_ref(),
        Ok(&key),
        "{quoted}"
    );
    if !s.contains(['"', '\\']) {
        assert_eq!(IdempotencyKey::from_header(s.as_bytes()).as_ref(), Ok(&key));
    }
    assert_eq!(IdempotencyKey::new(s).as_ref(), Ok(&key));
});
