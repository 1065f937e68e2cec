//! Paths the gateway cannot read the way every upstream does are refused,
//! never passed through: a NUL or another control byte, raw or escaped
//! (`/v1/payments%00` reaches `/v1/payments` at an upstream that stops
//! reading a path at NUL), escaped twice, an escape that is not one, an
//! escape that does not decode to UTF-8 (an overlong `%C0%80` is a NUL to
//! some decoders). Keyed or not, with a key already used or a new one:
//! `400 invalid-path` and the upstream sees nothing. A spelling that reads
//! as a keyed route only once decoded twice is that route's: keyed.

use crate::checkout::ShopDb;
use crate::exchange;
use crate::gateway::{Upstream, config_file, gateway, post};

on_both! {
    paths_with_control_bytes_are_refused_and_never_forwarded;
}

const INVALID_PATH: &str = "https://idem.dev/problems/invalid-path";

async fn paths_with_control_bytes_are_refused_and_never_forwarded(db: ShopDb) {
    let up = Upstream::start().await;
    let dir = idem_testkit::TempDir::new("gateway-control");
    let gw = gateway(&db, &config_file(&dir, &up, "reject"), None).await;
    let body = r#"{"amount":100,"currency":"EUR","customer":"c1"}"#;
    let first = post(gw.addr, "/v1/payments", Some("pk"), body).await;
    assert_eq!(
        first.status,
        201,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    let before = up.seen().len();

    let escaped = [
        "/v1/payments%00",
        "/v1/payments%00/x",
        "/v1/pay%00ments",
        "/v1%00/payments",
        "/v1/payments%0a",
        "/v1/payments%0D%0A",
        "/v1/payments%09",
        "/v1/payments%1F",
        "/v1/payments%7f",
        "/v1/payments%2500",
        "/v1/payments%252500",
        "/v1/payments%C0%80",
        "/v1/payments%25C0%2580",
        "/v1/payments%C2%85",
        "/v1/payments%",
        "/v1/payments%0",
        "/v1/payments%zz",
        "/v1/payments%u0000",
        // Unlisted paths too: an upstream may read them as a keyed one.
        "/elsewhere%00",
        "/large%0d%0aX-Injected:%201",
    ];
    for path in escaped {
        for key in [Some("pk"), Some("pk-new"), None] {
            let r = post(gw.addr, path, key, body).await;
            assert_eq!(
                (r.status, r.problem_type().as_str()),
                (400, INVALID_PATH),
                "{path} with key {key:?}: {}",
                String::from_utf8_lossy(&r.body)
            );
            assert_eq!(
                r.header("content-type").as_deref(),
                Some("application/problem+json"),
                "{path}"
            );
        }
    }
    // Raw control bytes in the request line: refused before any routing.
    for raw in ["\0", "\x01", "\x1f", "\x7f", "\t"] {
        for key in [Some("pk"), None] {
            let head = crate::request("POST", &format!("/v1/payments{raw}"), key, body);
            let r = exchange(gw.addr, &head).await;
            assert_eq!(r.status, 400, "raw {raw:?} with key {key:?}");
        }
    }
    assert_eq!(
        up.seen().len(),
        before,
        "nothing reached the upstream: {:?}",
        &up.seen()[before..]
    );
    assert_eq!(up.effects(), 1, "one payment");

    // Escapes that read as ordinary characters are still keyed, not refused.
    let reused = post(gw.addr, "/v1/%70ayments", Some("pk"), body).await;
    assert_eq!(
        reused.status,
        422,
        "{}",
        String::from_utf8_lossy(&reused.body)
    );
    let spaced = post(gw.addr, "/v1/pay%20ments", None, body).await;
    assert_eq!(spaced.status, 404, "an unlisted path passes through");
    // Spellings that reach the route at a server decoding twice are the
    // route's: keyed (no key: 400, the key used: 422), never passed
    // through; climbing above the root once decoded twice is refused.
    let seen = up.seen().len();
    for path in [
        "/v1/pay%256Dents",
        "/v1/x/%252e%252e/payments",
        "/v1%252Fpayments",
    ] {
        let unkeyed = post(gw.addr, path, None, body).await;
        assert_eq!(
            (unkeyed.status, unkeyed.problem_type().as_str()),
            (400, "https://idem.dev/problems/missing-idempotency-key"),
            "{path} without a key: {}",
            String::from_utf8_lossy(&unkeyed.body)
        );
        let keyed = post(gw.addr, path, Some("pk"), body).await;
        assert_eq!(keyed.status, 422, "{path} under the used key");
    }
    let climbing = post(gw.addr, "/%252e%252e/v1/payments", None, body).await;
    assert_eq!(
        (climbing.status, climbing.problem_type().as_str()),
        (400, INVALID_PATH)
    );
    assert_eq!(up.seen().len(), seen, "none of them reached the upstream");
    assert_eq!(up.effects(), 1, "one payment");
    println!(
        "{} escaped paths x 3 keys and 5 raw bytes x 2 refused with 400; upstream saw {} request(s)",
        escaped.len(),
        up.seen().len()
    );
}
