use super::*;

fn route(p: &str) -> PathPattern {
    PathPattern::parse(p).unwrap_or_else(|e| panic!("{e}"))
}

fn verify(lookup: &str, found: Option<&str>) -> Verify {
    Verify::parse(
        VerifySettings {
            lookup,
            found,
            landing: Some("2s"),
            ..VerifySettings::default()
        },
        &route("/v1/orders/{order}/payments"),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn lookups_name_the_key_a_body_field_or_a_path_segment_encoded() {
    let v = verify(
        "GET /v1/payments?reference={/reference}&key={key}&order={order}",
        Some("/data/0"),
    );
    let body = "{\"reference\":\"ord 1/ü&x\",\"amount\":5}".as_bytes();
    let target = v
        .target(
            "idem:forward:ab",
            JSON,
            body,
            "/v1/orders/o%201/payments",
            &route("/v1/orders/{order}/payments"),
        )
        .unwrap();
    assert_eq!(
        target,
        "/v1/payments?reference=ord%201%2F%C3%BC%26x&key=idem%3Aforward%3Aab&order=o%201"
    );
    assert_eq!(v.landing, Duration::from_secs(2));
    assert_eq!(v.status, StatusCode::OK);
    // A form body, as Stripe's clients send it: /metadata/ref is metadata[ref].
    let form = b"amount=5&metadata%5Bref%5D=r-1&reference=r-2";
    let v = verify("GET /v1/payments?ref={/metadata/ref}&r={/reference}", None);
    let t = v
        .target("k", FORM, form, "/x", &route("/v1/orders/{order}/payments"))
        .unwrap();
    assert_eq!(t, "/v1/payments?ref=r-1&r=r-2");
}

#[test]
fn a_request_without_the_looked_up_value_is_refused_before_anything_is_sent() {
    let v = verify("GET /v1/payments?reference={/reference}", Some("/data/0"));
    let r = route("/v1/orders/{order}/payments");
    for body in [
        &br#"{"amount":5}"#[..],
        br#"{"reference":""}"#,
        br#"{"reference":{"a":1}}"#,
        br#"{"reference":42}"#,
    ] {
        let e = v
            .check(JSON, body, "/v1/orders/1/payments", &r)
            .unwrap_err();
        assert!(e.contains("/reference"), "{e}");
    }
    let e = (v.check(
        FORM,
        b"reference=a&reference=b",
        "/v1/orders/1/payments",
        &r,
    ))
    .unwrap_err();
    assert!(e.contains("/reference"), "sent twice: {e}");
    assert!(
        v.check(JSON, br#"{"reference":"42"}"#, "/v1/orders/1/payments", &r)
            .is_ok()
    );
}

/// The body is read as its Content-Type says, as the upstream reads it,
/// never another way: a JSON-looking form, a JSON body serde refuses
/// (too deep, a lone surrogate) or a body without a type is refused.
#[test]
fn a_body_is_read_only_as_its_content_type_says() {
    let v = verify("GET /v1/payments?reference={/reference}", Some("/data/0"));
    let r = route("/v1/orders/{order}/payments");
    let p = "/v1/orders/1/payments";
    let as_form = br#"{"reference":"decoy","x":"&reference=real&"}"#;
    let t = v.target("", FORM, as_form, p, &r).unwrap();
    assert_eq!(t, "/v1/payments?reference=real", "read as the form it is");
    let deep = format!(
        r#"{{"reference":"real","pad":{}{}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    let surrogate = br#"{"reference":"real","n":"\ud83d","x":"&reference=decoy&"}"#;
    for (ct, body) in [
        (JSON, deep.as_bytes()),
        (JSON, &surrogate[..]),
        (None, br#"{"reference":"real"}"#),
        (Some("text/plain"), b"reference=real"),
        (FORM, b"\xff\xfe"),
    ] {
        let e = v.check(ct, body, p, &r).unwrap_err();
        assert!(e.contains("neither JSON"), "{ct:?}: {e}");
    }
    let typed = Some("application/merge-patch+json; charset=utf-8");
    assert!(v.check(typed, br#"{"reference":"real"}"#, p, &r).is_ok());
}

/// A candidate whose value differs only as an upstream normalises it
/// (trimmed, case folded) is unclear: never another's, never a second
/// forward.
#[test]
fn a_normalised_value_is_not_another_intents() {
    let v = verify("GET /v1/payments?reference={/reference}", Some("/data/0"));
    let sent = br#"{"reference":"Order-7 ","amount":5}"#;
    let found = br#"{"data":[{"id":"pay_1","reference":"order-7"}]}"#;
    assert!(matches!(
        v.read(StatusCode::OK, None, found, JSON, sent),
        Lookup::Failed(_)
    ));
    let other = br#"{"data":[{"id":"pay_2","reference":"order-8"}]}"#;
    assert_eq!(
        v.read(StatusCode::OK, None, other, JSON, sent),
        Lookup::NotFound
    );
}

const MINE: &[u8] = br#"{"reference":"r-1","amount":5}"#;
const JSON: Option<&str> = Some("application/json");
const FORM: Option<&str> = Some("application/x-www-form-urlencoded");

#[test]
fn not_found_is_read_only_from_an_answer_of_the_expected_shape() {
    let search = verify("GET /v1/payments?reference={/reference}", Some("/data/0"));
    let ok = StatusCode::OK;
    assert_eq!(
        search.read(
            ok,
            Some("application/json"),
            br#"{"data":[{"id":"pay_1","reference":"r-1"}]}"#,
            JSON,
            MINE
        ),
        Lookup::Found {
            content_type: "application/json".into(),
            body: br#"{"id":"pay_1","reference":"r-1"}"#.to_vec()
        }
    );
    assert_eq!(
        search.read(ok, None, br#"{"data":[]}"#, JSON, MINE),
        Lookup::NotFound
    );
    for (wrong, why) in [
        (&br#"{}"#[..], "no /data at all"),
        (br#"{"data":null}"#, "null, not a list"),
        (br#"{"error":"database unavailable"}"#, "an error in a 200"),
        (br#"{"data":"oops"}"#, "a string"),
        (br#"{"data":[null]}"#, "a null candidate"),
        (br#"{"data":{"0":null}}"#, "an object where a list is named"),
        (br#"[]"#, "the root is a list"),
        (
            br#"{"data":[{"reference":"r-1"},{"reference":"r-1"}]}"#,
            "two candidates",
        ),
        (b"<html>", "not JSON"),
    ] {
        assert!(
            matches!(search.read(ok, None, wrong, JSON, MINE), Lookup::Failed(_)),
            "{why}"
        );
    }
    for status in [
        StatusCode::NOT_FOUND,
        StatusCode::BAD_GATEWAY,
        StatusCode::FOUND,
    ] {
        assert!(matches!(
            search.read(status, None, b"", JSON, MINE),
            Lookup::Failed(_)
        ));
    }
    let one = verify("GET /v1/payments/by-key/{key}", None);
    assert_eq!(
        one.read(StatusCode::NOT_FOUND, None, b"", JSON, MINE),
        Lookup::NotFound
    );
    assert!(matches!(
        one.read(ok, Some("application/json"), b"{}", JSON, MINE),
        Lookup::Found { .. }
    ));
    let by_field = verify("GET /v1/payment?reference={/reference}", Some("/payment"));
    assert_eq!(
        by_field.read(ok, None, br#"{"payment":null}"#, JSON, MINE),
        Lookup::NotFound
    );
}

#[test]
fn a_candidate_of_another_intent_is_not_this_one() {
    let r = route("/v1/payments");
    let scoped = Verify::parse(
        VerifySettings {
            lookup: "GET /v1/payments?reference={/reference}",
            found: Some("/data/0"),
            matching: Some(&["/reference".to_owned(), "/customer".to_owned()]),
            ..VerifySettings::default()
        },
        &r,
    )
    .unwrap();
    let bob = br#"{"reference":"order-1","customer":"bob"}"#;
    let alices = br#"{"data":[{"id":"pay_1","reference":"order-1","customer":"alice"}]}"#;
    assert_eq!(
        scoped.read(StatusCode::OK, None, alices, JSON, bob),
        Lookup::NotFound,
        "a reused reference of another customer's"
    );
    let bobs = br#"{"data":[{"id":"pay_2","reference":"order-1","customer":"bob"}]}"#;
    assert!(matches!(
        scoped.read(StatusCode::OK, None, bobs, JSON, bob),
        Lookup::Found { .. }
    ));
    // Only a different string is another's: a candidate without the
    // value (or with a number there) says nothing: still unknown.
    for unclear in [
        &br#"{"data":[{"id":"pay_4","reference":"order-1"}]}"#[..],
        br#"{"data":[{"id":"pay_5","reference":"order-1","customer":7}]}"#,
    ] {
        assert!(
            matches!(
                scoped.read(StatusCode::OK, None, unclear, JSON, bob),
                Lookup::Failed(_)
            ),
            "{}",
            String::from_utf8_lossy(unclear)
        );
    }
    // A request without a value to compare is refused before it is sent.
    for body in [
        &br#"{"reference":"order-1"}"#[..],
        br#"{"reference":"order-1","customer":7}"#,
        br#"{"reference":"order-1","customer":""}"#,
    ] {
        let e = scoped.check(JSON, body, "/v1/payments", &r).unwrap_err();
        assert!(e.contains("/customer") && e.contains("verify_match"), "{e}");
    }
    assert!(scoped.check(JSON, bob, "/v1/payments", &r).is_ok());
    // By default the lookup's own fields must match: a lookup that
    // ignores its filter finds nothing of this request's.
    let plain = verify("GET /v1/payments?reference={/reference}", Some("/data/0"));
    let other = br#"{"data":[{"id":"pay_3","reference":"r-9"}]}"#;
    assert_eq!(
        plain.read(StatusCode::OK, None, other, JSON, MINE),
        Lookup::NotFound
    );
}

#[test]
fn bad_lookups_are_refused() {
    let r = route("/v1/payments");
    let bad = |settings: VerifySettings<'_>| Verify::parse(settings, &r).unwrap_err();
    for (lookup, says) in [
        ("POST /v1/x?k={key}", "GET"),
        ("GET v1/x?k={key}", "starting with one /"),
        ("GET //evil.example/x?k={key}", "starting with one /"),
        ("GET /v1/ü/{key}", "visible ASCII"),
        ("GET /v1/x", "names nothing"),
        ("GET /v1/x?k={nope}", "neither"),
        ("GET /v1/x?k={key", "unclosed"),
        ("GET /v1/x?k={key}}", "stray"),
        ("GET /v1/x?k={/a~2}", "pointer"),
    ] {
        let e = bad(VerifySettings {
            lookup,
            ..VerifySettings::default()
        });
        assert!(e.contains(says), "{lookup}: {e}");
    }
    let lookup = "GET /v1/x?k={key}";
    for (settings, says) in [
        (
            VerifySettings {
                lookup,
                found: Some("data"),
                ..VerifySettings::default()
            },
            "verify_found",
        ),
        (
            VerifySettings {
                lookup,
                status: Some(404),
                ..VerifySettings::default()
            },
            "verify_status",
        ),
        (
            VerifySettings {
                lookup,
                status: Some(204),
                ..VerifySettings::default()
            },
            "verify_status",
        ),
        (
            VerifySettings {
                lookup,
                landing: Some("2days"),
                ..VerifySettings::default()
            },
            "landing",
        ),
        (
            VerifySettings {
                lookup,
                landing: Some("0s"),
                ..VerifySettings::default()
            },
            "landing",
        ),
        (
            VerifySettings {
                lookup,
                matching: Some(&["x".to_owned()]),
                ..VerifySettings::default()
            },
            "verify_match",
        ),
    ] {
        let e = bad(settings);
        assert!(e.contains(says), "{says}: {e}");
    }
}
