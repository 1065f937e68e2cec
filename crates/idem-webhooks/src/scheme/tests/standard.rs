//! Standard Webhooks (and Svix's header names): published examples, independent computations, the negative space.

use super::*;

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
