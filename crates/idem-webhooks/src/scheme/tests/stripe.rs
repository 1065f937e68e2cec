//! Stripe (`Stripe-Signature`): published examples, independent computations, the negative space.

use super::*;

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
