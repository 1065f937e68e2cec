//! Slack (`X-Slack-Signature`, the URL handshake): published examples, independent computations, the negative space.

use super::*;

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
