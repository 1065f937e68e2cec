//! GitHub (`X-Hub-Signature-256`): published examples, independent computations, the negative space.

use super::*;

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
