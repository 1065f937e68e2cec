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
fn github_published_example_verifies() {
    // docs.github.com, "Validating webhook deliveries".
    let v = verifier(Scheme::Github, &["It's a Secret to Everybody"]);
    let h = headers(&[
        (
            "x-hub-signature-256",
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17".into(),
        ),
        (
            "x-github-delivery",
            "72d3162e-cc78-11e3-81ab-4c9367dc0958".into(),
        ),
        ("x-github-hook-id", "292430182".into()),
        ("x-github-event", "push".into()),
    ]);
    let ok = v.verify(&h, b"Hello, World!", NOW).unwrap();
    assert_eq!(
        ok.delivery_id,
        "292430182:72d3162e-cc78-11e3-81ab-4c9367dc0958"
    );
    assert_eq!(ok.event_type.as_deref(), Some("push"));
    assert_eq!(
        v.verify(&h, b"Hello, World?", NOW),
        Err(VerifyError::NoMatch)
    );
}

#[test]
fn github_negative_space() {
    let body = br#"{"action":"opened"}"#;
    let sig = format!("sha256={}", hmac_hex(b"new-secret", &[body]));
    let h = headers(&[
        ("x-hub-signature-256", sig.clone()),
        ("x-github-delivery", "d1".into()),
    ]);
    assert!(
        verifier(Scheme::Github, &["old-secret", "new-secret"])
            .verify(&h, body, NOW)
            .is_ok(),
        "rotation"
    );
    assert_eq!(
        verifier(Scheme::Github, &["other"]).verify(&h, body, NOW),
        Err(VerifyError::NoMatch)
    );
    let v = verifier(Scheme::Github, &["new-secret"]);
    for bad in ["sha256=", "sha256=abc", "sha1=00", &sig[..sig.len() - 2]] {
        let h = headers(&[("x-hub-signature-256", bad.to_owned())]);
        assert!(v.verify(&h, body, NOW).is_err(), "{bad:?}");
    }
    assert_eq!(
        v.verify(&HeaderMap::new(), body, NOW),
        Err(VerifyError::MissingHeader("x-hub-signature-256"))
    );
    // No delivery header: the documented fallback, a body hash.
    let h = headers(&[("x-hub-signature-256", sig)]);
    assert!(
        v.verify(&h, body, NOW)
            .unwrap()
            .delivery_id
            .starts_with("sha256:")
    );
}

#[test]
fn stripe_matches_an_independent_computation() {
    // HMAC-SHA256("whsec_idem_doc_secret", "1700000000." + body), computed with
    // Python's hmac module following Stripe's documented scheme.
    let body =
        br#"{"id":"evt_1NwDq2","type":"payment_intent.succeeded","data":{"object":{"id":"pi_1"}}}"#;
    let h = headers(&[(
        "stripe-signature",
        "t=1700000000,v1=ae407c0cf3d64a308f549bbc0bcbd1d72378cdaf61fceca033189c1f00ca180c".into(),
    )]);
    let ok = verifier(Scheme::Stripe, &["whsec_idem_doc_secret"])
        .verify(&h, body, NOW)
        .unwrap();
    assert_eq!(ok.delivery_id, "evt_1NwDq2");
    assert_eq!(ok.event_type.as_deref(), Some("payment_intent.succeeded"));
}

#[test]
fn stripe_negative_space() {
    let body = br#"{"id":"evt_2","type":"charge.refunded"}"#;
    let t = NOW.to_string();
    let good = hmac_hex(b"sk2", &[t.as_bytes(), b".", body]);
    let other = hmac_hex(b"sk1", &[t.as_bytes(), b".", body]);
    let sig = |t: i64, v1: &str| headers(&[("stripe-signature", format!("t={t},v1={v1}"))]);
    let v = verifier(Scheme::Stripe, &["sk1", "sk2"]);
    // Several v1 entries (rotation) and unknown schemes are fine.
    let h = headers(&[(
        "stripe-signature",
        format!("t={NOW},v0=deadbeef,v1={},v1={good}", "00".repeat(32)),
    )]);
    assert!(v.verify(&h, body, NOW).is_ok());
    assert!(
        v.verify(&sig(NOW, &other), body, NOW).is_ok(),
        "the first secret also verifies its own"
    );
    assert_eq!(
        v.verify(&sig(NOW, &good), b"tampered", NOW),
        Err(VerifyError::NoMatch)
    );
    assert_eq!(
        verifier(Scheme::Stripe, &["sk9"]).verify(&sig(NOW, &good), body, NOW),
        Err(VerifyError::NoMatch)
    );
    // Stale and future timestamps are refused even with a correct signature.
    let old = NOW - 301;
    let s_old = hmac_hex(b"sk2", &[old.to_string().as_bytes(), b".", body]);
    assert_eq!(
        v.verify(&sig(old, &s_old), body, NOW),
        Err(VerifyError::TooOld(301))
    );
    let future = NOW + 301;
    let s_future = hmac_hex(b"sk2", &[future.to_string().as_bytes(), b".", body]);
    assert_eq!(
        v.verify(&sig(future, &s_future), body, NOW),
        Err(VerifyError::InFuture(301))
    );
    assert_eq!(
        v.verify(&sig(NOW, ""), body, NOW),
        Err(VerifyError::NoMatch),
        "empty v1"
    );
    let no_t = headers(&[("stripe-signature", format!("v1={good}"))]);
    assert_eq!(
        v.verify(&no_t, body, NOW),
        Err(VerifyError::Malformed("stripe-signature"))
    );
    assert_eq!(
        v.verify(&HeaderMap::new(), body, NOW),
        Err(VerifyError::MissingHeader("stripe-signature"))
    );
}

#[test]
fn standard_webhooks_published_vector_verifies() {
    // The test vector of the Standard Webhooks specification.
    let v = verifier(
        Scheme::Standard,
        &["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
    );
    let h = headers(&[
        ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek".into()),
        ("webhook-timestamp", "1614265330".into()),
        (
            "webhook-signature",
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=".into(),
        ),
    ]);
    let ok = v
        .verify(&h, br#"{"test": 2432232314}"#, 1_614_265_330)
        .unwrap();
    assert_eq!(ok.delivery_id, "msg_p5jXN8AQM9LWM0D4loKWxJek");
    assert_eq!(
        v.verify(&h, br#"{"test": 2432232315}"#, 1_614_265_330),
        Err(VerifyError::NoMatch)
    );
}

#[test]
fn standard_webhooks_negative_space_and_ed25519() {
    let key = b"0123456789abcdef0123456789abcdef";
    let secret = format!("whsec_{}", B64.encode(key));
    let body = br#"{"type":"invoice.paid"}"#;
    let id = "msg_1";
    let ts = NOW.to_string();
    let v1 = hmac_b64(key, &[id.as_bytes(), b".", ts.as_bytes(), b".", body]);
    let h = |sig: &str, ts: &str| {
        headers(&[
            ("webhook-id", id.into()),
            ("webhook-timestamp", ts.into()),
            ("webhook-signature", sig.into()),
        ])
    };
    let other = format!("whsec_{}", B64.encode(b"another key, rotated out soon"));
    let v = verifier(Scheme::Standard, &[&other, &secret]);
    let ok = v.verify(&h(&format!("v1,{v1}"), &ts), body, NOW).unwrap();
    assert_eq!(
        (ok.delivery_id.as_str(), ok.event_type.as_deref()),
        ("msg_1", Some("invoice.paid"))
    );
    // Space-separated entries: one bad, one good; unknown versions ignored.
    assert!(
        v.verify(&h(&format!("v2,abc v1,AAAA v1,{v1}"), &ts), body, NOW)
            .is_ok()
    );
    assert_eq!(
        v.verify(&h("v1,", &ts), body, NOW),
        Err(VerifyError::NoMatch),
        "empty signature"
    );
    assert_eq!(
        v.verify(&h(&format!("v1,{v1}"), &ts), b"{}", NOW),
        Err(VerifyError::NoMatch)
    );
    assert_eq!(
        verifier(Scheme::Standard, &[&other]).verify(&h(&format!("v1,{v1}"), &ts), body, NOW),
        Err(VerifyError::NoMatch)
    );
    assert_eq!(
        v.verify(&h(&format!("v1,{v1}"), &ts), body, NOW + 301),
        Err(VerifyError::TooOld(301))
    );
    assert_eq!(
        v.verify(&h(&format!("v1,{v1}"), &ts), body, NOW - 301),
        Err(VerifyError::InFuture(301))
    );
    let mut missing = h(&format!("v1,{v1}"), &ts);
    missing.remove("webhook-id");
    assert_eq!(
        v.verify(&missing, body, NOW),
        Err(VerifyError::MissingHeader("webhook-id"))
    );
    // v1a: ed25519 with a whpk_ public key.
    let signing = SigningKey::from_bytes(&[7; 32]);
    let public = format!("whpk_{}", B64.encode(signing.verifying_key().to_bytes()));
    let message = [id.as_bytes(), b".", ts.as_bytes(), b".", body].concat();
    let v1a = B64.encode(signing.sign(&message).to_bytes());
    let ed = verifier(Scheme::Standard, &[&public]);
    assert!(ed.verify(&h(&format!("v1a,{v1a}"), &ts), body, NOW).is_ok());
    assert_eq!(
        ed.verify(&h(&format!("v1a,{v1a}"), &ts), b"{}", NOW),
        Err(VerifyError::NoMatch)
    );
    assert_eq!(
        ed.verify(&h(&format!("v1,{v1}"), &ts), body, NOW),
        Err(VerifyError::NoMatch),
        "an HMAC is not an ed25519 signature"
    );
    let wrong = SigningKey::from_bytes(&[8; 32]);
    let forged = B64.encode(wrong.sign(&message).to_bytes());
    assert_eq!(
        ed.verify(&h(&format!("v1a,{forged}"), &ts), body, NOW),
        Err(VerifyError::NoMatch)
    );
    // Secrets must say what they are.
    for bad in ["plain", "whsec_", "whsec_***", "whpk_AAAA"] {
        assert!(
            Verifier::new(
                Scheme::Standard,
                &[Secret::new(bad)],
                Duration::from_secs(1)
            )
            .is_err(),
            "{bad}"
        );
    }
}

#[test]
fn shopify_matches_an_independent_computation() {
    // base64(HMAC-SHA256("shopify-shared-secret", body)), computed with
    // Python's hmac module following Shopify's documented scheme.
    let body = br#"{"id":820982911946154508,"email":"jon@doe.ca"}"#;
    let h = headers(&[
        (
            "x-shopify-hmac-sha256",
            "pCD6gt/jTWB0b3mAPGiOA6sJMc2Q8cGmhZHTHzqI83A=".into(),
        ),
        (
            "x-shopify-webhook-id",
            "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043".into(),
        ),
        ("x-shopify-topic", "orders/create".into()),
    ]);
    let v = verifier(Scheme::Shopify, &["rotated-out", "shopify-shared-secret"]);
    let ok = v.verify(&h, body, NOW).unwrap();
    assert_eq!(ok.delivery_id, "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043");
    assert_eq!(ok.event_type.as_deref(), Some("orders/create"));
    assert_eq!(v.verify(&h, b"{}", NOW), Err(VerifyError::NoMatch));
    assert_eq!(
        verifier(Scheme::Shopify, &["nope"]).verify(&h, body, NOW),
        Err(VerifyError::NoMatch)
    );
    let empty = headers(&[("x-shopify-hmac-sha256", "=".into())]);
    assert!(v.verify(&empty, body, NOW).is_err());
    assert_eq!(
        v.verify(&HeaderMap::new(), body, NOW),
        Err(VerifyError::MissingHeader("x-shopify-hmac-sha256"))
    );
}

#[test]
fn slack_published_example_verifies() {
    // api.slack.com, "Verifying requests from Slack".
    let body = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    let h = headers(&[
        (
            "x-slack-signature",
            "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503".into(),
        ),
        ("x-slack-request-timestamp", "1531420618".into()),
    ]);
    let v = verifier(Scheme::Slack, &["8f742231b10e8888abcd99yyyzzz85a5"]);
    let ok = v.verify(&h, body, 1_531_420_618).unwrap();
    assert!(
        ok.delivery_id.starts_with("1531420618:sha256:"),
        "no event id in a slash command: the fallback"
    );
    assert_eq!(
        v.verify(&h, body, 1_531_420_618 + 301),
        Err(VerifyError::TooOld(301))
    );
}

#[test]
fn slack_negative_space() {
    let body = br#"{"event_id":"Ev01","event":{"type":"message"}}"#;
    let ts = NOW.to_string();
    let sig = format!(
        "v0={}",
        hmac_hex(b"slack2", &[b"v0:", ts.as_bytes(), b":", body])
    );
    let h = |sig: &str, ts: &str| {
        headers(&[
            ("x-slack-signature", sig.into()),
            ("x-slack-request-timestamp", ts.into()),
        ])
    };
    let v = verifier(Scheme::Slack, &["slack1", "slack2"]);
    let ok = v.verify(&h(&sig, &ts), body, NOW).unwrap();
    assert_eq!(
        (ok.delivery_id.as_str(), ok.event_type.as_deref()),
        ("Ev01", Some("message"))
    );
    assert_eq!(
        v.verify(&h(&sig, &ts), b"{}", NOW),
        Err(VerifyError::NoMatch)
    );
    assert_eq!(
        verifier(Scheme::Slack, &["x"]).verify(&h(&sig, &ts), body, NOW),
        Err(VerifyError::NoMatch)
    );
    assert_eq!(
        v.verify(&h(&sig, &ts), body, NOW - 301),
        Err(VerifyError::InFuture(301))
    );
    assert!(
        v.verify(&h("v0=", &ts), body, NOW).is_err(),
        "empty signature"
    );
    assert_eq!(
        v.verify(&h(&sig, "soon"), body, NOW),
        Err(VerifyError::Malformed("x-slack-request-timestamp"))
    );
    let only_sig = headers(&[("x-slack-signature", sig.clone())]);
    assert_eq!(
        v.verify(&only_sig, body, NOW),
        Err(VerifyError::MissingHeader("x-slack-request-timestamp"))
    );
}

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

#[test]
fn standard_webhooks_accepts_svix_default_headers() {
    let secret = format!("whsec_{}", B64.encode(STANDARD_KEY));
    let v = verifier(Scheme::Standard, &[&secret]);
    let body = br#"{"type":"invoice.paid"}"#;
    let svix = standard_signed("svix", STANDARD_KEY, "msg_svix", NOW, body);
    let ok = v.verify(&svix, body, NOW).unwrap();
    assert_eq!(
        (ok.delivery_id.as_str(), ok.event_type.as_deref()),
        ("msg_svix", Some("invoice.paid"))
    );
    assert_eq!(v.verify(&svix, b"{}", NOW), Err(VerifyError::NoMatch));
    assert_eq!(
        v.verify(&svix, body, NOW + 301),
        Err(VerifyError::TooOld(301)),
        "the tolerance holds under svix names too"
    );
    let mut bad_ts = svix.clone();
    bad_ts.insert("svix-timestamp", HeaderValue::from_static("+1700000000"));
    assert_eq!(
        v.verify(&bad_ts, body, NOW),
        Err(VerifyError::Malformed("svix-timestamp"))
    );
    let mut no_sig = svix.clone();
    no_sig.remove("svix-signature");
    assert_eq!(
        v.verify(&no_sig, body, NOW),
        Err(VerifyError::MissingHeader("svix-signature"))
    );
    assert_eq!(
        v.verify(&HeaderMap::new(), body, NOW),
        Err(VerifyError::MissingHeader("webhook-id")),
        "neither set: the specification's names"
    );
}

#[test]
fn standard_webhooks_never_mixes_header_sets() {
    let secret = format!("whsec_{}", B64.encode(STANDARD_KEY));
    let v = verifier(Scheme::Standard, &[&secret]);
    let body = br#"{"type":"invoice.paid"}"#;
    let svix = standard_signed("svix", STANDARD_KEY, "msg_1", NOW, body);
    let webhook = standard_signed("webhook", STANDARD_KEY, "msg_1", NOW, body);
    // Both sets, the same id and time (a sender that sends both): the
    // webhook-* set is the one verified.
    let mut both = webhook.clone();
    both.extend(svix.clone());
    assert_eq!(v.verify(&both, body, NOW).unwrap().delivery_id, "msg_1");
    let mut forged_sig = both.clone();
    forged_sig.insert("webhook-signature", HeaderValue::from_static("v1,AAAA"));
    assert_eq!(
        v.verify(&forged_sig, body, NOW),
        Err(VerifyError::NoMatch),
        "a good svix-signature does not stand in for a bad webhook-signature"
    );
    // A webhook-id beside a complete svix-* set: the webhook-* set, incomplete.
    let mut stray = svix.clone();
    stray.insert("webhook-id", HeaderValue::from_static("msg_1"));
    assert_eq!(
        v.verify(&stray, body, NOW),
        Err(VerifyError::MissingHeader("webhook-timestamp"))
    );
    stray.insert("webhook-id", HeaderValue::from_static("msg_other"));
    assert_eq!(
        v.verify(&stray, body, NOW),
        Err(VerifyError::Malformed("svix-id"))
    );
    // The id or time of one set beside a different one of the other.
    let mut two_ids = webhook.clone();
    two_ids.insert("svix-id", HeaderValue::from_static("msg_2"));
    assert_eq!(
        v.verify(&two_ids, body, NOW),
        Err(VerifyError::Malformed("svix-id"))
    );
    let mut two_times = webhook.clone();
    two_times.insert("svix-timestamp", HeaderValue::from_static("1700000001"));
    assert_eq!(
        v.verify(&two_times, body, NOW),
        Err(VerifyError::Malformed("svix-timestamp"))
    );
    // An id signed under one set and presented under the other's signature.
    let other = standard_signed("svix", STANDARD_KEY, "msg_9", NOW, body);
    let mut mixed = HeaderMap::new();
    mixed.insert("webhook-id", HeaderValue::from_static("msg_1"));
    mixed.insert(
        "webhook-timestamp",
        HeaderValue::from_str(&NOW.to_string()).unwrap(),
    );
    mixed.insert("svix-signature", other["svix-signature"].clone());
    assert_eq!(
        v.verify(&mixed, body, NOW),
        Err(VerifyError::MissingHeader("webhook-signature"))
    );
}

#[test]
fn standard_secrets_with_or_without_padding() {
    // 32 bytes: 44 base64 characters, the last one `=`.
    let padded = B64.encode(STANDARD_KEY);
    assert!(padded.ends_with('='));
    let unpadded = padded.trim_end_matches('=');
    let body = br#"{"type":"x"}"#;
    let h = standard_signed("webhook", STANDARD_KEY, "msg_1", NOW, body);
    for secret in [format!("whsec_{padded}"), format!("whsec_{unpadded}")] {
        assert!(
            verifier(Scheme::Standard, &[&secret])
                .verify(&h, body, NOW)
                .is_ok(),
            "{secret}"
        );
    }
    let signing = SigningKey::from_bytes(&[7; 32]);
    let public = B64.encode(signing.verifying_key().to_bytes());
    assert!(public.ends_with('='));
    let message = [b"msg_1.", NOW.to_string().as_bytes(), b".", body].concat();
    let mut ed = h.clone();
    let v1a = B64.encode(signing.sign(&message).to_bytes());
    ed.insert(
        "webhook-signature",
        HeaderValue::from_str(&format!("v1a,{v1a}")).unwrap(),
    );
    let whpk = format!("whpk_{}", public.trim_end_matches('='));
    assert!(
        verifier(Scheme::Standard, &[&whpk])
            .verify(&ed, body, NOW)
            .is_ok()
    );
    // Padding is optional, not free-form.
    for bad in [
        format!("whsec_{unpadded}=="),
        format!("whsec_{unpadded}=x"),
        format!("whsec_={unpadded}"),
        format!("whsec_{}", &unpadded[1..]),
        "whsec_=".to_owned(),
        "whsec_====".to_owned(),
    ] {
        assert_eq!(
            Verifier::new(
                Scheme::Standard,
                &[Secret::new(bad.clone())],
                Duration::from_secs(1)
            )
            .unwrap_err(),
            SecretError::Standard { index: 0 },
            "{bad}"
        );
    }
}

#[test]
fn slack_url_verification_is_a_handshake() {
    // Slack's documented example.
    let handshake = br#"{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    assert_eq!(
        slack_body(handshake),
        SlackBody::Challenge("3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P".into())
    );
    for delivery in [
        &br#"{"type":"event_callback","event_id":"Ev1","challenge":"x"}"#[..],
        br#"{"challenge":"x"}"#,
        br#"["url_verification"]"#,
        b"type=url_verification&challenge=x",
        b"",
    ] {
        assert_eq!(
            slack_body(delivery),
            SlackBody::Delivery,
            "{}",
            String::from_utf8_lossy(delivery)
        );
    }
    let long = format!(
        r#"{{"type":"url_verification","challenge":"{}"}}"#,
        "c".repeat(256)
    );
    for bad in [
        r#"{"type":"url_verification"}"#,
        r#"{"type":"url_verification","challenge":""}"#,
        r#"{"type":"url_verification","challenge":42}"#,
        r#"{"type":"url_verification","challenge":"a\u0000b"}"#,
        r#"{"type":"url_verification","challenge":"a\nb"}"#,
        &long,
    ] {
        assert_eq!(slack_body(bad.as_bytes()), SlackBody::BadChallenge, "{bad}");
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
