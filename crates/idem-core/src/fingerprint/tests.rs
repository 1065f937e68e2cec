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

fn canon(body: &[u8]) -> Option<String> {
    FingerprintSpec::default()
        .canonical_body(body)
        .map(|c| String::from_utf8(c).unwrap())
}

fn same(a: &str, b: &str) -> bool {
    let s = FingerprintSpec::default();
    fp(&s, true, a) == fp(&s, true, b)
}

/// Every body refused by the canonical reader is hashed as its raw bytes.
fn assert_raw(body: &[u8]) {
    let s = FingerprintSpec::default();
    let op = Operation::new("payments.create").unwrap();
    let parts = |json| RequestParts {
        method: "POST",
        operation: &op,
        target: "/v1/payments",
        json,
        body,
    };
    assert_eq!(
        s.canonical_body(body),
        None,
        "{:?}",
        String::from_utf8_lossy(body)
    );
    assert_eq!(s.fingerprint(&parts(true)), s.fingerprint(&parts(false)));
}

#[test]
fn integers_beyond_u64_that_differ_are_a_mismatch() {
    // Through f64 both were 1.8446744073709552e19.
    assert!(!same(
        r#"{"n":18446744073709551616}"#,
        r#"{"n":18446744073709551617}"#
    ));
    assert!(!same(
        r#"{"n":-9223372036854775809}"#,
        r#"{"n":-9223372036854775810}"#
    ));
    assert!(!same(
        "123456789012345678901234567890",
        "123456789012345678901234567891"
    ));
    assert_eq!(
        canon(b"18446744073709551617").as_deref(),
        Some("18446744073709551617")
    );
}

#[test]
fn decimals_beyond_f64_precision_that_differ_are_a_mismatch() {
    // Through f64 both were 0.3.
    assert!(!same(r#"{"n":0.30000000000000001}"#, r#"{"n":0.3}"#));
    assert!(!same("1.0000000000000000000001", "1"));
    assert!(!same("1e-400", "0"), "once an underflow to 0");
    assert!(!same("1e400", "2e400"), "once out of range for both");
    assert_eq!(
        canon(b"0.30000000000000001").as_deref(),
        Some("0.30000000000000001")
    );
}

#[test]
fn equal_numbers_have_one_spelling() {
    for (spellings, canonical) in [
        (
            &[
                "1", "1.0", "10e-1", "0.1e1", "1E0", "1e+0", "100e-2", "1.000e00",
            ][..],
            "1",
        ),
        (
            &["1.5", "1.50", "15e-1", "0.15E1", "150E-2", "0.0015e+3"][..],
            "1.5",
        ),
        (&["-2.5", "-25e-1", "-0.25e1"][..], "-2.5"),
        (&["1000", "1e3", "1E+3", "1000.000", "0.001e6"][..], "1000"),
        (
            &["0", "-0", "0.0", "-0.0", "0e5", "-0E-3", "0.000e+7"][..],
            "0",
        ),
        (&["1e21", "1000000000000000000000", "10e20"][..], "1e+21"),
        (
            &["123456789012345678901", "1.23456789012345678901e20"][..],
            "123456789012345678901",
        ),
        (&["0.00001", "1e-5", "10e-6"][..], "0.00001"),
        (&["0.000001", "1e-6", "0.1e-5"][..], "1e-6"),
        (&["12.34", "1234e-2", "0.1234e2"][..], "12.34"),
        (&["-1.5e300", "-15e299"][..], "-1.5e+300"),
        (&["1e999999999"][..], "1e+999999999"),
        (&["1e-999999999"][..], "1e-999999999"),
        (&["1.5e-7", "0.00000015"][..], "1.5e-7"),
    ] {
        for s in spellings {
            assert_eq!(canon(s.as_bytes()).as_deref(), Some(canonical), "{s}");
        }
    }
    assert!(same(r#"{"amount":1000}"#, r#"{"amount":1e3}"#));
    assert!(!same("1", "-1"));
    assert!(!same("1e21", "1e22"));
    assert!(!same("0.00001", "0.0001"));
}

#[test]
fn exponents_beyond_the_bound_fall_back_to_raw_bytes() {
    assert_raw(b"1e1000000000");
    assert_raw(b"1e-1000000000");
    assert_raw(b"[1e99999999999999999999]");
    // Normalised beyond the bound: 10 x 10^999999999 = 10^1000000000.
    assert_raw(b"10e999999999");
    assert_raw(b"0.1e-999999999");
    // Leading zeros of an exponent do not count.
    assert_eq!(canon(b"1e0000000000000002").as_deref(), Some("100"));
}

#[test]
fn string_escapes_are_decoded_and_written_canonically() {
    assert!(same(r#"{"k":"\u0041\/"}"#, r#"{"k":"A/"}"#));
    assert!(same(r#"{"\u006b":1}"#, r#"{"k":1}"#), "keys too");
    assert!(same(r#""\uD83D\uDE00""#, "\"\u{1f600}\""));
    assert!(same(r#""\ud83d\ude00""#, r#""\uD83D\uDE00""#));
    assert!(same(r#""\n\t\"\\""#, r#""\u000a\u0009\u0022\u005C""#));
    assert!(!same(r#""a\u0000""#, r#""a""#));
    assert_eq!(
        canon(br#""\u0041\/\u00e9\u007f\u0001\b\f\n\r\t\"\\""#).as_deref(),
        Some("\"A/\u{e9}\u{7f}\\u0001\\b\\f\\n\\r\\t\\\"\\\\\"")
    );
    // Lone or broken surrogates, unknown escapes, raw control characters and
    // bytes that are not UTF-8 are not JSON.
    for bad in [
        &br#""\uD83D""#[..],
        br#""\uDE00""#,
        br#""\uD83D\u0041""#,
        br#""\uD83Dx""#,
        br#""\uDE00\uD83D""#,
        br#""\u12""#,
        br#""\u+123""#,
        br#""\x41""#,
        br#""\'""#,
        b"\"a\nb\"",
        b"\"a\x00\"",
        b"\"\xff\"",
        b"\"\xc3\"",
        b"\"\xed\xa0\x80\"",
        b"\"\xc0\xaf\"",
        b"\"abc",
    ] {
        assert_raw(bad);
    }
}

#[test]
fn duplicate_keys_keep_the_last_value() {
    assert!(same(r#"{"a":1,"a":2}"#, r#"{"a":2}"#));
    assert!(!same(r#"{"a":1,"a":2}"#, r#"{"a":1}"#));
    assert!(same(r#"{"a":{"x":1},"b":0,"a":[]}"#, r#"{"b":0,"a":[]}"#));
    assert!(same(r#"{"a":1,"\u0061":3}"#, r#"{"a":3}"#));
    // An ignored field is gone whichever occurrence carried it.
    let s = FingerprintSpec::default().ignore_field("/ts").unwrap();
    assert_eq!(
        fp(&s, true, r#"{"ts":1,"n":1,"ts":2}"#),
        fp(&s, true, r#"{"n":1}"#)
    );
}

#[test]
fn nesting_is_bounded() {
    let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    assert_eq!(
        canon(nested(json::MAX_DEPTH).as_bytes()),
        Some(nested(json::MAX_DEPTH))
    );
    assert_raw(nested(json::MAX_DEPTH + 1).as_bytes());
    let objects = |depth: usize| format!("{}1{}", r#"{"a":"#.repeat(depth), "}".repeat(depth));
    assert!(canon(objects(json::MAX_DEPTH).as_bytes()).is_some());
    assert_raw(objects(json::MAX_DEPTH + 1).as_bytes());
    // serde_json's own limit is lower, so whatever a serde-based server
    // accepts is read here.
    assert!(serde_json::from_str::<serde_json::Value>(&nested(json::MAX_DEPTH)).is_err());
}

#[test]
fn whitespace_is_only_what_rfc_8259_allows() {
    assert!(same(
        " \t\r\n{ \"a\" :\t[ 1 ,\n2 ] } \r\n",
        r#"{"a":[1,2]}"#
    ));
    for bad in [
        &b"\x0c{}"[..],
        "\u{a0}{}".as_bytes(),
        "{}\u{feff}".as_bytes(),
        "\u{feff}{}".as_bytes(),
        b"{}\x0b",
    ] {
        assert_raw(bad);
    }
}

#[test]
fn anything_that_is_not_exactly_json_falls_back_to_raw_bytes() {
    for bad in [
        "",
        " ",
        "{",
        "}",
        "[1,]",
        "[,1]",
        r#"{"a":1,}"#,
        r#"{"a" 1}"#,
        r#"{a:1}"#,
        "{'a':1}",
        "01",
        "-01",
        "1.",
        ".5",
        "+1",
        "1e",
        "1e+",
        "-",
        "--1",
        "0x10",
        "NaN",
        "Infinity",
        "-Infinity",
        "tru",
        "nul",
        "True",
        "[1 2]",
        "{} {}",
        "1 2",
        r#"{"a":1}x"#,
        "[]]",
        "1.5.2",
        "1e5e5",
    ] {
        assert_raw(bad.as_bytes());
    }
    // Any value may stand at the top (RFC 8259 section 2).
    for (body, canonical) in [
        ("true", "true"),
        ("null", "null"),
        (r#""s""#, r#""s""#),
        ("[]", "[]"),
        ("{}", "{}"),
    ] {
        assert_eq!(canon(body.as_bytes()).as_deref(), Some(canonical));
    }
}

#[test]
fn array_steps_of_ignored_pointers_are_canonical_indices() {
    let s = FingerprintSpec::default()
        .ignore_field("/items/1/ts")
        .unwrap()
        .ignore_field("/items/01/id")
        .unwrap();
    let a = fp(&s, true, r#"{"items":[{"ts":1},{"ts":2,"id":"a"}]}"#);
    let b = fp(&s, true, r#"{"items":[{"ts":1},{"ts":3,"id":"a"}]}"#);
    assert_eq!(a, b, "/items/1/ts is ignored");
    let c = fp(&s, true, r#"{"items":[{"ts":1},{"ts":2,"id":"b"}]}"#);
    assert_ne!(a, c, "01 is no index, so /items/01/id is not ignored");
}

/// The canonical form before numbers were read exactly: `serde_json::Value`
/// with its `f64` numbers, keys sorted by bytes.
fn v1_canonical(body: &str) -> Option<String> {
    use serde_json::Value;
    fn write(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<_> = map.iter().collect();
                entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                out.push('{');
                for (i, (k, v)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    write(v, out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(v, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let value = serde_json::from_str(body).ok()?;
    let mut out = String::new();
    write(&value, &mut out);
    Some(out)
}

#[test]
fn ordinary_bodies_keep_their_v1_canonical_bytes() {
    let mut every_ascii = String::from("\"");
    for c in (0u8..0x80).map(char::from) {
        match c {
            '"' => every_ascii.push_str("\\\""),
            '\\' => every_ascii.push_str("\\\\"),
            c if c < ' ' => every_ascii.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => every_ascii.push(c),
        }
    }
    every_ascii.push('"');
    let ordinary = [
        r#"{"amount":1000,"currency":"EUR"}"#,
        r#"{ "currency": "EUR", "amount": 1000 }"#,
        "1.5",
        "-5",
        "0",
        "18446744073709551615",
        "-9223372036854775808",
        "[12.34,0.5,-0.001,0.00001,1e-6,1.5e-7,2.5E-10,123456.789,99999999999999.9]",
        "[1.79769313486231e300,2.22507385850720e-300,0.1,0.7,3.14159265358979]",
        r#"{"note":"caf\u00e9 \"x\" \/ \u0001 \u007f é 😀","tags":["a","b"],"ok":true,"n":null}"#,
        r#"{"z":{"y":{"x":[1,{"w":"\uD83D\uDE00"}]}},"":0,"é":1,"e":2}"#,
        &every_ascii,
    ];
    for body in ordinary {
        assert_eq!(canon(body.as_bytes()), v1_canonical(body), "{body}");
    }
    // Non-integers of up to 15 significant digits and at most 22 decimals:
    // serde_json read those exactly as f64, so v1 wrote their digits back.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..5000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mantissa = (x % 10u64.pow(1 + (x >> 40) as u32 % 15)) / 10 * 10 + 1 + x % 9;
        let scale = 1 + (x >> 50) as usize % 22;
        let digits = format!("{mantissa:0>width$}", width = scale + 1);
        let (int, frac) = digits.split_at(digits.len() - scale);
        let sign = if x & 1 == 0 { "" } else { "-" };
        let body = format!("{sign}{int}.{frac}");
        assert_eq!(canon(body.as_bytes()), v1_canonical(&body), "{body}");
    }
    // And the digest itself: prefix, framing and canonical bytes unchanged,
    // pinned from the v1 implementation.
    let s = FingerprintSpec::default();
    assert_eq!(
        fp(&s, true, r#"{"amount":1000,"currency":"EUR"}"#).to_hex(),
        "82ff2d46373f986162c88d313328a56af416be1af75422d3d61eb7baf05694cb"
    );
    assert_eq!(
        fp(&s, true, "1.5").to_hex(),
        "6cb1b27f1824260858a7e9d45d4c057af4c183decd319a6201a9e6b362ec8a1e"
    );
    assert_eq!(
        fp(&s, true, "-5").to_hex(),
        "4cd20acc9fe71e5c31e527be2f5c963f85f6689df9485befd2d6b9fdd1075ffa"
    );
    assert_eq!(
        fp(&s, true, "{not json").to_hex(),
        fp(&s, false, "{not json").to_hex()
    );
}
