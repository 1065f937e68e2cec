//! `Verifier::verify` for every scheme, on fuzz-built header values, body and
//! clock: it never panics; random headers never verify against the fixed
//! secrets; and a delivery correctly signed over a fuzzed timestamp verifies
//! exactly when that timestamp is plain digits (no sign, no leading zero)
//! within the tolerance.
//!
//! Standard Webhooks is fuzzed under both of its header sets, `webhook-*`
//! and Svix's `svix-*`.
//!
//! Input: one byte choosing the scheme, the clock and (for Standard
//! Webhooks) the header set, eight bytes for the
//! clock, then up to four header values separated by `\n`, then the body.
#![no_main]

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderValue};
use idem_webhooks::{Scheme, Secret, Verifier};
use libfuzzer_sys::fuzz_target;
use sha2::Sha256;

const NOW: i64 = 1_700_000_000;
const TOLERANCE: i64 = 300;
const HMAC_SECRET: &str = "fuzz-secret";
/// Standard Webhooks: the HMAC key `fuzz-secret-fuzz-secret-fuzz-sec`
/// (32 bytes) and RFC 8032's first ed25519 test public key.
const STANDARD_KEY: &[u8] = b"fuzz-secret-fuzz-secret-fuzz-sec";
const STANDARD_SECRETS: [&str; 2] = [
    "whsec_ZnV6ei1zZWNyZXQtZnV6ei1zZWNyZXQtZnV6ei1zZWM=",
    "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=",
];

const SCHEMES: [Scheme; 5] = [
    Scheme::Github,
    Scheme::Stripe,
    Scheme::Standard,
    Scheme::Shopify,
    Scheme::Slack,
];

/// The headers each scheme reads, in the order the fuzz fields fill them
/// (`svix`: Standard Webhooks under Svix's names).
fn names(scheme: Scheme, svix: bool) -> &'static [&'static str] {
    match scheme {
        Scheme::Github => &[
            "x-hub-signature-256",
            "x-github-delivery",
            "x-github-hook-id",
            "x-github-event",
        ],
        Scheme::Stripe => &["stripe-signature"],
        Scheme::Standard if svix => &["svix-id", "svix-timestamp", "svix-signature"],
        Scheme::Standard => &["webhook-id", "webhook-timestamp", "webhook-signature"],
        Scheme::Shopify => &[
            "x-shopify-hmac-sha256",
            "x-shopify-webhook-id",
            "x-shopify-topic",
        ],
        Scheme::Slack => &["x-slack-signature", "x-slack-request-timestamp"],
    }
}

fn verifier(scheme: Scheme) -> Verifier {
    let secrets: Vec<Secret> = match scheme {
        Scheme::Standard => STANDARD_SECRETS.iter().map(|s| Secret::new(*s)).collect(),
        _ => vec![Secret::new(HMAC_SECRET)],
    };
    Verifier::new(scheme, &secrets, Duration::from_secs(TOLERANCE as u64))
        .expect("fixed secrets are valid")
}

fn mac(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The oracle for a signed timestamp: 1–18 ASCII digits, no leading zero.
fn strict_timestamp(s: &str) -> Option<i64> {
    let ok = (1..=18).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_digit())
        && (s.len() == 1 || !s.starts_with('0'));
    ok.then(|| s.parse().ok()).flatten()
}

/// The timestamp field a scheme signs, as text (the `t=` item for Stripe).
fn timestamp_field<'a>(scheme: Scheme, fields: &[&'a [u8]]) -> Option<&'a [u8]> {
    match scheme {
        Scheme::Standard | Scheme::Slack => fields.get(1).copied(),
        Scheme::Stripe => fields.first().and_then(|f| {
            f.split(|&b| b == b',')
                .find_map(|item| item.trim_ascii().strip_prefix(b"t="))
        }),
        _ => None,
    }
}

fuzz_target!(|data: &[u8]| {
    let (control, rest) = data.split_first().unwrap_or((&0, &[]));
    let scheme = SCHEMES[usize::from(*control) % SCHEMES.len()];
    let svix = (control / 15) % 2 == 1;
    let mut clock = [0u8; 8];
    let n = rest.len().min(8);
    clock[..n].copy_from_slice(&rest[..n]);
    let rest = &rest[n..];
    let mut fields: Vec<&[u8]> = Vec::new();
    let mut body: &[u8] = rest;
    for _ in 0..names(scheme, svix).len() {
        match body.iter().position(|&b| b == b'\n') {
            Some(i) => {
                fields.push(&body[..i]);
                body = &body[i + 1..];
            }
            None => break,
        }
    }
    // The signed timestamp as the verifier sees it: trimmed visible ASCII.
    let ts_text = timestamp_field(scheme, &fields)
        .and_then(|t| std::str::from_utf8(t).ok())
        .map(str::trim)
        .filter(|t| !t.is_empty() && t.bytes().all(|b| (0x21..=0x7e).contains(&b)));
    let signed_ts = ts_text.and_then(|t| t.parse::<i64>().ok());
    let now = match (control / 5) % 3 {
        0 => NOW,
        // Near the signed timestamp, so the tolerance check is passed often.
        1 => signed_ts
            .unwrap_or(NOW)
            .saturating_add(i64::from(clock[0] as i8) * 4),
        _ => i64::from_le_bytes(clock),
    };
    let v = verifier(scheme);

    let mut headers = HeaderMap::new();
    for (name, value) in names(scheme, svix).iter().zip(&fields) {
        if let Ok(value) = HeaderValue::from_bytes(value) {
            headers.insert(*name, value);
        }
    }
    assert!(
        v.verify(&headers, body, now).is_err(),
        "random input verified: {headers:?}"
    );

    // The same fields, correctly signed (the signature header replaced).
    let text = |i: usize| {
        fields
            .get(i)
            .and_then(|f| std::str::from_utf8(f).ok())
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.bytes().all(|b| (0x21..=0x7e).contains(&b)))
    };
    let key = HMAC_SECRET.as_bytes();
    let (signed, ts) = match scheme {
        Scheme::Github => {
            let sig = format!("sha256={}", hex(&mac(key, &[body])));
            (vec![("x-hub-signature-256", sig)], None)
        }
        Scheme::Shopify => {
            let sig = B64.encode(mac(key, &[body]));
            (vec![("x-shopify-hmac-sha256", sig)], None)
        }
        Scheme::Stripe => {
            let Some(ts) = ts_text else {
                return;
            };
            let sig = hex(&mac(key, &[ts.as_bytes(), b".", body]));
            (
                vec![("stripe-signature", format!("t={ts},v1={sig}"))],
                Some(ts),
            )
        }
        Scheme::Standard => {
            let (Some(id), Some(ts)) = (text(0), ts_text) else {
                return;
            };
            let message = [id.as_bytes(), b".", ts.as_bytes(), b".", body].concat();
            let sig = format!("v1,{}", B64.encode(mac(STANDARD_KEY, &[&message])));
            let [id_name, ts_name, sig_name] = match names(scheme, svix) {
                [a, b, c] => [*a, *b, *c],
                _ => return,
            };
            let h = vec![
                (id_name, id.to_owned()),
                (ts_name, ts.to_owned()),
                (sig_name, sig),
            ];
            (h, Some(ts))
        }
        Scheme::Slack => {
            let Some(ts) = ts_text else {
                return;
            };
            let sig = format!(
                "v0={}",
                hex(&mac(key, &[b"v0:", ts.as_bytes(), b":", body]))
            );
            let h = vec![
                ("x-slack-signature", sig),
                ("x-slack-request-timestamp", ts.to_owned()),
            ];
            (h, Some(ts))
        }
    };
    for (name, value) in signed {
        headers.insert(name, HeaderValue::from_str(&value).expect("visible ASCII"));
    }
    let result = v.verify(&headers, body, now);
    let expected = match ts {
        None => true,
        Some(ts) => strict_timestamp(ts)
            .is_some_and(|t| (i128::from(now) - i128::from(t)).abs() <= i128::from(TOLERANCE)),
    };
    assert_eq!(
        result.is_ok(),
        expected,
        "correctly signed, ts {ts:?}, now {now}: {result:?}"
    );
});
