//! Shopify (`X-Shopify-Hmac-Sha256`): published examples, independent computations, the negative space.

use super::*;

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
