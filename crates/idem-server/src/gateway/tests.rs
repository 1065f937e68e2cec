//! The `[gateway]` table and `--upstream`, read as `idem serve` reads them.

use super::*;
use axum::http::Method;
use idem_core::Policy;
use idem_core::leased::OnUnknown;
use idem_gateway::config::DEFAULT_LEASE;
use idem_http::TenantSource;
use std::time::Duration;

fn parse(text: &str) -> anyhow::Result<Option<GatewayConfig>> {
    load(
        None,
        Some((std::path::Path::new("idem.toml"), text)),
        1 << 20,
    )
}

#[test]
fn the_documented_file_works_as_written() {
    let text = r#"
[gateway]
upstream = "http://127.0.0.1:9000"

[[gateway.routes]]
method = "POST"
path = "/v1/payments"          # exact, or with {param} segments
operation = "payments.create"
key = "required"               # or "optional"
ttl = "24h"
lease = "2s"                   # how long a forward may be silent before it counts as abandoned
on_unknown = "verify"          # or "reject" (the default), or "reforward"
verify = "GET /v1/payments?reference={/reference}"  # the lookup: {key}, {/body/field}, {param}
verify_found = "/data/0"       # where in its answer the found payment is
verify_status = 201            # the status a found payment is stored with
landing = "30s"                # how long a request sent may still land upstream
not_processed = [429, 503]     # statuses that say the upstream did nothing: key released
ignore_fields = ["/client_ts"] # JSON pointers left out of the fingerprint
tenant_header = "X-Tenant-Id"  # set by a trusted component in front; default: one static tenant
"#;
    let g = parse(text).unwrap().unwrap();
    assert_eq!(g.upstream.authority, "127.0.0.1:9000");
    let r = &g.routes[0];
    assert_eq!(
        (r.method.as_str(), r.lease),
        ("POST", Duration::from_secs(2))
    );
    assert!(r.matches(&Method::POST, "/v1/payments"));
    assert!(!r.matches(&Method::POST, "/v1/payments/x"));
    assert!(r.config.key_required);
    assert_eq!(r.on_unknown, OnUnknown::Verify);
    let v = r.verify.as_ref().unwrap();
    assert_eq!(
        (v.status.as_u16(), v.landing),
        (201, Duration::from_secs(30))
    );
    assert_eq!(
        r.not_processed.iter().copied().collect::<Vec<_>>(),
        [429, 503]
    );
    assert!(matches!(
        r.config.tenant,
        TenantSource::TrustedHeader { .. }
    ));
}

#[test]
fn only_method_path_and_operation_are_required() {
    let text = "[gateway]\nupstream = \"http://localhost:9000/api/\"\n\n[[gateway.routes]]\nmethod = \"put\"\npath = \"/v1/things/{id}\"\noperation = \"things.put\"\n";
    let g = parse(text).unwrap().unwrap();
    assert_eq!(g.upstream.prefix, "/api");
    let r = &g.routes[0];
    assert!(r.matches(&Method::PUT, "/v1/things/42"));
    assert!(!r.matches(&Method::PUT, "/v1/things/"));
    assert!(!r.matches(&Method::POST, "/v1/things/42"));
    assert!(r.config.key_required, "required by default");
    assert_eq!(
        r.on_unknown,
        OnUnknown::Reject,
        "unknown outcomes held by default"
    );
    assert_eq!(r.key_header, "idempotency-key");
    assert_eq!(r.lease, DEFAULT_LEASE);
    assert_eq!(r.config.policy.ttl, Policy::DEFAULT_TTL);
}

#[test]
fn upstream_alone_keys_every_post_and_patch_optionally() {
    let g = load(Some("http://127.0.0.1:9000"), None, 1 << 20)
        .unwrap()
        .unwrap();
    assert_eq!(g.routes.len(), 2);
    for r in &g.routes {
        assert!(!r.config.key_required);
        assert_eq!(
            r.on_unknown,
            OnUnknown::Reject,
            "--upstream alone never forwards an unknown outcome again"
        );
        assert!(r.matches(&r.method, "/anything/at/all"));
    }
    assert!(!g.routes.iter().any(|r| r.method == Method::PUT));
    assert!(
        load(None, None, 1).unwrap().is_none(),
        "no upstream, no gateway"
    );
}

#[test]
fn bad_routes_are_refused_naming_their_line() {
    let base = "[gateway]\nupstream = \"http://127.0.0.1:9000\"\n\n[[gateway.routes]]\n";
    for (route, says) in [
        (
            "method = \"GET\"\npath = \"/a\"\noperation = \"a\"\n",
            "safe",
        ),
        (
            "method = \"POST\"\npath = \"a\"\noperation = \"a\"\n",
            "path",
        ),
        (
            "method = \"POST\"\npath = \"/a/{}\"\noperation = \"a\"\n",
            "path",
        ),
        (
            "method = \"POST\"\npath = \"/a/\"\noperation = \"a\"\n",
            "normalised",
        ),
        (
            "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\non_unknown = \"verify\"\n\
                 verify = \"GET /a?r={/reference}\"\nignore_fields = [\"/reference\"]\n",
            "covers /reference",
        ),
        (
            "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\non_unknown = \"verify\"\n\
                 verify = \"GET /a?r={/order/id}\"\nignore_fields = [\"/order\"]\n",
            "covers /order/id",
        ),
        (
            "method = \"POST\"\npath = \"/a\"\noperation = \"\"\n",
            "operation",
        ),
        (
            "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\nkey = \"maybe\"\n",
            "key",
        ),
        (
            "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\nttl = \"soon\"\n",
            "ttl",
        ),
        (
            "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\non_unknown = \"reforward\"\nttl = \"2s\"\n",
            "claimed afresh",
        ),
        (
            "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\nlease = \"1ms\"\n",
            "lease",
        ),
        (
            "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\non_unknown = \"pray\"\n",
            "on_unknown",
        ),
        (
            "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\nignore_fields = [\"x\"]\n",
            "ignore_fields",
        ),
        (
            "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\nstore_statuses = [500]\n",
            "store_statuses",
        ),
        (
            "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\non_unknown = \"verify\"\n",
            "verify: required",
        ),
        (
            "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\nverify = \"GET /a?k={key}\"\n",
            "only with on_unknown",
        ),
        (
            "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\non_unknown = \"verify\"\nverify = \"GET /a?k={id}\"\n",
            "verify",
        ),
        (
            "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\nnot_processed = [409]\n",
            "not_processed",
        ),
        (
            "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\ntransient = [200]\n",
            "transient",
        ),
        (
            "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\nreplay_headers = [\"set-cookie\"]\n",
            "replay_headers",
        ),
        (
            "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\nkey_header = \"a b\"\n",
            "key_header",
        ),
        (
            "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\nkey_header = \"Transfer-Encoding\"\n",
            "key_header",
        ),
        (
            "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\nkey_header = \"authorization\"\n",
            "key_header",
        ),
    ] {
        let err = format!("{:#}", parse(&format!("{base}{route}")).unwrap_err());
        assert!(err.contains("line 4"), "{err}");
        assert!(err.contains(says), "{says}: {err}");
    }
    let err = format!(
        "{:#}",
        parse(&format!("{base}method = \"POST\"\npath = \"/a\"\n")).unwrap_err()
    );
    assert!(err.contains("operation"), "{err}");
    let err = format!(
        "{:#}",
        parse(&format!(
            "{base}method = \"POST\"\npath = \"/a\"\noperation = \"a\"\ncolour = 1\n"
        ))
        .unwrap_err()
    );
    assert!(err.contains("line 8") && err.contains("colour"), "{err}");
}

#[test]
fn gateway_values_are_named_once() {
    let err = format!(
        "{:#}",
        parse("[gateway]\nupstream = \"http://127.0.0.1:9000\"\nmax_held_bytes = 0\n").unwrap_err()
    );
    assert!(
        err.contains("gateway.max_held_bytes") && !err.contains("gateway.gateway"),
        "{err}"
    );
}

#[test]
fn routes_without_a_gateway_header_use_the_flag() {
    let text = "[[gateway.routes]]\nmethod = \"POST\"\npath = \"/a\"\noperation = \"a\"\n";
    let g = load(
        Some("http://127.0.0.1:9000"),
        Some((std::path::Path::new("x.toml"), text)),
        1,
    )
    .unwrap()
    .unwrap();
    assert_eq!(g.routes.len(), 1);
    let err = format!("{:#}", parse(text).unwrap_err());
    assert!(err.contains("line 1") && err.contains("upstream"), "{err}");
}

#[test]
fn upstreams_other_than_plain_http_are_refused() {
    for (url, says) in [
        ("ftp://h:1", "expected http"),
        ("https://h:1", "https"),
        ("http://u:p@h:1", "credentials"),
        ("http://h:1/?a=b", "query"),
        ("not a url", "not a URL"),
    ] {
        let err = format!("{:#}", load(Some(url), None, 1).unwrap_err());
        assert!(err.contains(says), "{url}: {err}");
    }
    let err = format!(
        "{:#}",
        parse("\n[gateway]\nupstream = \"ftp://x\"\n").unwrap_err()
    );
    assert!(
        err.contains("line 2") && err.contains("gateway.upstream"),
        "{err}"
    );
    let err = format!("{:#}", parse("[gateway]\ntimeout = \"1s\"\n").unwrap_err());
    assert!(err.contains("line 1") && err.contains("upstream"), "{err}");
}
