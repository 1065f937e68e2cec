//! The canonical JSON of the fingerprint on any bytes: it never panics,
//! canonicalising is idempotent, whatever `serde_json` reads with only
//! integer numbers is read too, and its fingerprint equals that of serde's own
//! re-serialisation (where no number went through `f64`, the two readers
//! must agree on the value).
#![no_main]

use idem_core::{FingerprintSpec, Operation, RequestParts};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fn integers_only(v: &Value) -> bool {
    match v {
        Value::Number(n) => n.is_i64() || n.is_u64(),
        Value::Array(items) => items.iter().all(integers_only),
        Value::Object(map) => map.values().all(integers_only),
        _ => true,
    }
}

/// Whether every number written in `data` is an integer — duplicated keys
/// included, whose earlier values serde reads and then drops (the last one
/// wins), so the parsed value alone cannot say. A `.` or an exponent `e`
/// follows a digit only inside a number; `true` and `false` put their `e`
/// after a letter.
fn integers_only_in_text(data: &[u8]) -> bool {
    let (mut in_string, mut escaped, mut after_digit) = (false, false, false);
    for &b in data {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'.' | b'e' | b'E' if after_digit => return false,
            _ => {}
        }
        after_digit = b.is_ascii_digit();
    }
    true
}

fuzz_target!(|data: &[u8]| {
    let op = Operation::new("fuzz").expect("a valid operation name");
    let plain = FingerprintSpec::default();
    let ignoring = FingerprintSpec::default()
        .ignore_field("/a")
        .and_then(|s| s.ignore_field("/0/b"))
        .and_then(|s| s.ignore_field("/a~1b/1"))
        .expect("valid pointers");
    let fingerprint = |spec: &FingerprintSpec, body: &[u8]| {
        spec.fingerprint(&RequestParts {
            method: "POST",
            operation: &op,
            target: "/fuzz",
            json: true,
            body,
        })
    };
    for spec in [&plain, &ignoring] {
        let canonical = spec.canonical_body(data);
        if let Some(c) = &canonical {
            assert_eq!(spec.canonical_body(c).as_ref(), Some(c), "not idempotent");
            assert_eq!(fingerprint(spec, c), fingerprint(spec, data));
        }
    }
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    if integers_only(&value) && integers_only_in_text(data) {
        assert!(
            plain.canonical_body(data).is_some(),
            "serde read it, we did not"
        );
        let reserialised = serde_json::to_vec(&value).expect("a Value serialises");
        assert_eq!(
            fingerprint(&plain, data),
            fingerprint(&plain, &reserialised),
            "{}",
            String::from_utf8_lossy(&reserialised)
        );
    }
});
