//! The schemes' checks: one module per provider; here the helpers and what
//! holds for every scheme (strict encodings, timestamps, secrets kept out of
//! `Debug`, repeated headers).

mod github;
mod shopify;
mod slack;
mod standard;
mod stripe;

use super::*;
use ed25519_dalek::{Signer, SigningKey};
use http::HeaderValue;

fn headers(pairs: &[(&'static str, String)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (n, v) in pairs {
        h.insert(*n, HeaderValue::from_str(v).unwrap());
    }
    h
}

fn hmac_hex(key: &[u8], parts: &[&[u8]]) -> String {
    let mut mac = HmacSha256::new_from_slice(key).unwrap();
    for p in parts {
        mac.update(p);
    }
    hex(&mac.finalize().into_bytes())
}

fn hmac_b64(key: &[u8], parts: &[&[u8]]) -> String {
    B64.encode(hex_decode(&hmac_hex(key, parts)).unwrap())
}

fn verifier(scheme: Scheme, secrets: &[&str]) -> Verifier {
    let secrets: Vec<Secret> = secrets.iter().map(|s| Secret::new(*s)).collect();
    Verifier::new(scheme, &secrets, Duration::from_secs(300)).unwrap()
}

const NOW: i64 = 1_700_000_000;

#[test]
fn secrets_never_show_in_debug() {
    let v = verifier(Scheme::Github, &["hunter2-super-secret"]);
    let dbg = format!("{v:?} {:?}", Secret::new("hunter2-super-secret"));
    assert!(!dbg.contains("hunter2"), "{dbg}");
    assert!(dbg.contains("redacted"));
    assert_eq!(
        Verifier::new(Scheme::Github, &[], Duration::ZERO).unwrap_err(),
        SecretError::Missing
    );
    assert_eq!(
        Verifier::new(Scheme::Github, &[Secret::new("")], Duration::ZERO).unwrap_err(),
        SecretError::Empty { index: 0 }
    );
}

#[test]
fn hex_signatures_are_strict() {
    assert_eq!(hex_decode("00ff0A"), Some(vec![0, 0xff, 0x0a]));
    for bad in ["+f", "0+f0", "-f", " f", "f ", "0x", "g0", "é0", "0"] {
        assert_eq!(hex_decode(bad), None, "{bad:?}");
    }
    // Real signatures whose first byte is below 0x10, spelled with `+`
    // instead of their leading `0`: the same bytes to a lenient decoder.
    let body = br#"{"id":"evt_1"}"#;
    let t = NOW.to_string();
    let sign = |scheme: Scheme, secret: &str| {
        (0..)
            .map(|i| format!("{}{i}", secret))
            .map(|secret| {
                let key = secret.as_bytes();
                let sig = match scheme {
                    Scheme::Stripe => hmac_hex(key, &[t.as_bytes(), b".", body]),
                    Scheme::Slack => hmac_hex(key, &[b"v0:", t.as_bytes(), b":", body]),
                    _ => hmac_hex(key, &[body]),
                };
                (verifier(scheme, &[&secret]), sig)
            })
            .find(|(_, sig)| sig.starts_with('0'))
            .unwrap()
    };
    let (github, sig) = sign(Scheme::Github, "gh");
    let h = |sig: &str| headers(&[("x-hub-signature-256", format!("sha256={sig}"))]);
    assert!(github.verify(&h(&sig), body, NOW).is_ok());
    assert!(github.verify(&h(&sig.to_uppercase()), body, NOW).is_ok());
    assert_eq!(
        github.verify(&h(&format!("+{}", &sig[1..])), body, NOW),
        Err(VerifyError::Malformed("x-hub-signature-256"))
    );
    let (slack, sig) = sign(Scheme::Slack, "sl");
    let h = |sig: &str| {
        headers(&[
            ("x-slack-signature", format!("v0={sig}")),
            ("x-slack-request-timestamp", t.clone()),
        ])
    };
    assert!(slack.verify(&h(&sig), body, NOW).is_ok());
    assert_eq!(
        slack.verify(&h(&format!("+{}", &sig[1..])), body, NOW),
        Err(VerifyError::Malformed("x-slack-signature"))
    );
    // Stripe skips v1 entries it cannot read, so it is no match at all.
    let (stripe, sig) = sign(Scheme::Stripe, "st");
    let h = |v1: &str| headers(&[("stripe-signature", format!("t={t},v1={v1}"))]);
    assert!(stripe.verify(&h(&sig), body, NOW).is_ok());
    assert_eq!(
        stripe.verify(&h(&format!("+{}", &sig[1..])), body, NOW),
        Err(VerifyError::NoMatch)
    );
}

#[test]
fn signed_timestamps_are_digits_only() {
    assert_eq!(parse_timestamp("1700000000"), Some(NOW));
    assert_eq!(parse_timestamp("0"), Some(0));
    assert_eq!(
        parse_timestamp("999999999999999999"),
        Some(999_999_999_999_999_999)
    );
    for bad in [
        "+1700000000",
        "-1700000000",
        "01700000000",
        "00",
        "",
        " 1700000000",
        "1700000000 ",
        "17000 00000",
        "1_700_000_000",
        "1700000000.0",
        "1e9",
        "１７００００００００",
        "1000000000000000000",
    ] {
        assert_eq!(parse_timestamp(bad), None, "{bad:?}");
    }
    let body = br#"{"id":"evt_1","type":"x"}"#;
    // Each scheme with a timestamp, correctly signed over a lenient spelling
    // of `NOW`: refused as malformed, not verified.
    for ts in ["+1700000000", "01700000000"] {
        let stripe = headers(&[(
            "stripe-signature",
            format!(
                "t={ts},v1={}",
                hmac_hex(b"st", &[ts.as_bytes(), b".", body])
            ),
        )]);
        assert_eq!(
            verifier(Scheme::Stripe, &["st"]).verify(&stripe, body, NOW),
            Err(VerifyError::Malformed("stripe-signature")),
            "{ts}"
        );
        let key = b"0123456789abcdef0123456789abcdef";
        let v1 = hmac_b64(key, &[b"msg_1.", ts.as_bytes(), b".", body]);
        let standard = headers(&[
            ("webhook-id", "msg_1".into()),
            ("webhook-timestamp", ts.into()),
            ("webhook-signature", format!("v1,{v1}")),
        ]);
        let secret = format!("whsec_{}", B64.encode(key));
        assert_eq!(
            verifier(Scheme::Standard, &[&secret]).verify(&standard, body, NOW),
            Err(VerifyError::Malformed("webhook-timestamp")),
            "{ts}"
        );
        let slack = headers(&[
            (
                "x-slack-signature",
                format!(
                    "v0={}",
                    hmac_hex(b"sl", &[b"v0:", ts.as_bytes(), b":", body])
                ),
            ),
            ("x-slack-request-timestamp", ts.into()),
        ]);
        assert_eq!(
            verifier(Scheme::Slack, &["sl"]).verify(&slack, body, NOW),
            Err(VerifyError::Malformed("x-slack-request-timestamp")),
            "{ts}"
        );
    }
}

#[test]
fn extreme_clocks_are_out_of_tolerance_not_a_panic() {
    let v = verifier(Scheme::Slack, &["sl"]);
    let body = b"{}";
    for (ts, now) in [
        ("0", i64::MIN),
        ("0", i64::MAX),
        ("999999999999999999", i64::MIN),
        ("999999999999999999", i64::MAX),
    ] {
        let sig = format!(
            "v0={}",
            hmac_hex(b"sl", &[b"v0:", ts.as_bytes(), b":", body])
        );
        let h = headers(&[
            ("x-slack-signature", sig),
            ("x-slack-request-timestamp", ts.into()),
        ]);
        let result = v.verify(&h, body, now);
        assert!(
            matches!(
                result,
                Err(VerifyError::TooOld(_) | VerifyError::InFuture(_))
            ),
            "{ts} at {now}: {result:?}"
        );
    }
}

#[test]
fn a_header_sent_twice_is_malformed_whatever_its_values() {
    let secret = format!("whsec_{}", B64.encode(STANDARD_KEY));
    let v = verifier(Scheme::Standard, &[&secret]);
    let body = br#"{"type":"invoice.paid"}"#;
    for prefix in ["webhook", "svix"] {
        let signed = standard_signed(prefix, STANDARD_KEY, "msg_D", NOW, body);
        assert!(v.verify(&signed, body, NOW).is_ok());
        for (name, extra) in [("id", "msg_E"), ("timestamp", "1")] {
            let name: &'static str = Box::leak(format!("{prefix}-{name}").into_boxed_str());
            let mut twice = signed.clone();
            twice.append(name, HeaderValue::from_static(extra));
            assert_eq!(
                v.verify(&twice, body, NOW),
                Err(VerifyError::Malformed(name)),
                "a second value would be stored unverified"
            );
        }
    }
    // The other set's id or time, sent twice beside the verified set: each
    // value must repeat the verified one.
    let mut both = standard_signed("webhook", STANDARD_KEY, "msg_K", NOW, body);
    both.insert("svix-id", HeaderValue::from_static("msg_K"));
    both.append("svix-id", HeaderValue::from_static("msg_EVIL"));
    assert_eq!(
        v.verify(&both, body, NOW),
        Err(VerifyError::Malformed("svix-id"))
    );
}

#[test]
fn many_signatures_are_malformed_and_one_tag_serves_them_all() {
    let secret = format!("whsec_{}", B64.encode(STANDARD_KEY));
    let v = verifier(Scheme::Standard, &[&secret]);
    let body = br#"{"type":"invoice.paid"}"#;
    let good = standard_signed("webhook", STANDARD_KEY, "msg_1", NOW, body);
    let good_sig = good["webhook-signature"].to_str().unwrap().to_owned();
    let junk = "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
    // Rotation: the good one among the most allowed, last.
    let mut rotated = good.clone();
    let entries: Vec<&str> = std::iter::repeat_n(junk, MAX_SIGNATURES - 1)
        .chain([good_sig.as_str()])
        .collect();
    rotated.insert(
        "webhook-signature",
        HeaderValue::from_str(&entries.join(" ")).unwrap(),
    );
    assert_eq!(v.verify(&rotated, body, NOW).unwrap().delivery_id, "msg_1");
    // One more: malformed before any HMAC, however the rest looks.
    let mut flood = good.clone();
    let entries: Vec<&str> = std::iter::repeat_n(junk, MAX_SIGNATURES)
        .chain([good_sig.as_str()])
        .collect();
    flood.insert(
        "webhook-signature",
        HeaderValue::from_str(&entries.join(" ")).unwrap(),
    );
    assert_eq!(
        v.verify(&flood, body, NOW),
        Err(VerifyError::Malformed("webhook-signature"))
    );
    // Stripe's v1= entries likewise.
    let s = verifier(Scheme::Stripe, &["whsec_x"]);
    let zeros = format!("v1={}", "00".repeat(32));
    let header = format!("t={NOW},{}", [zeros.as_str(); MAX_SIGNATURES + 1].join(","));
    let h = headers(&[("stripe-signature", header)]);
    assert_eq!(
        s.verify(&h, b"{}", NOW),
        Err(VerifyError::Malformed("stripe-signature"))
    );
}

/// A Standard Webhooks delivery of `body` signed with `key`, under the
/// header names `prefix-id`, `prefix-timestamp`, `prefix-signature`.
fn standard_signed(prefix: &str, key: &[u8], id: &str, ts: i64, body: &[u8]) -> HeaderMap {
    let ts = ts.to_string();
    let v1 = hmac_b64(key, &[id.as_bytes(), b".", ts.as_bytes(), b".", body]);
    let mut h = HeaderMap::new();
    for (name, value) in [
        ("id", id.to_owned()),
        ("timestamp", ts),
        ("signature", format!("v1,{v1}")),
    ] {
        let name = http::HeaderName::from_bytes(format!("{prefix}-{name}").as_bytes()).unwrap();
        h.insert(name, HeaderValue::from_str(&value).unwrap());
    }
    h
}

const STANDARD_KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
