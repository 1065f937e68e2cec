use super::*;

fn spec() -> DrillSpec {
    DrillSpec {
        target: Some("http://127.0.0.1:8080".into()),
        request: Some("POST /v1/payments".into()),
        body: Some(r#"{"amount":100,"currency":"EUR","customer":"{unique}"}"#.into()),
        effects: Some("GET /v1/payments?customer={unique}".into()),
        count: Some("/data".into()),
        ..DrillSpec::default()
    }
}

/// A validated config changed out of bounds by a library caller is
/// refused by `run` before anything is sent (the target here listens
/// nowhere: a request would be `Unreachable`, not `Usage`).
#[test]
fn run_checks_the_bounds_again() {
    let mut c = spec().validate().unwrap();
    c.concurrency = 1_000_000;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let out = runtime.block_on(crate::run(c, &mut crate::Quiet));
    match out {
        Err(crate::Error::Usage(why)) => assert!(why.contains("--concurrency"), "{why}"),
        other => panic!("expected a usage error, got {other:?}"),
    }
}

#[test]
fn a_good_spec_validates_and_bad_ones_name_their_flag() {
    let c = spec().validate().unwrap();
    assert_eq!(c.target.authority, "127.0.0.1:8080");
    assert_eq!(c.concurrency, 50);
    let cases: Vec<(DrillSpec, &str)> = vec![
        (
            DrillSpec {
                request: Some("POST".into()),
                ..spec()
            },
            "--request",
        ),
        (
            DrillSpec {
                request: Some("P OST /x".into()),
                ..spec()
            },
            "--request",
        ),
        (
            DrillSpec {
                body: Some("{\"a\":".into()),
                ..spec()
            },
            "--body",
        ),
        (
            DrillSpec {
                count: Some("data".into()),
                ..spec()
            },
            "--count",
        ),
        (
            DrillSpec {
                effects: Some("/v1/payments".into()),
                ..spec()
            },
            "--effects",
        ),
        (
            DrillSpec {
                target: Some("https://x".into()),
                ..spec()
            },
            "TARGET",
        ),
        (
            DrillSpec {
                target: Some("ftp:/x".into()),
                ..spec()
            },
            "TARGET",
        ),
        (
            DrillSpec {
                headers: vec!["nocolon".into()],
                ..spec()
            },
            "--header",
        ),
        (
            DrillSpec {
                concurrency: Some(1),
                ..spec()
            },
            "--concurrency",
        ),
        (
            DrillSpec {
                timeout: Some("soon".into()),
                ..spec()
            },
            "--timeout",
        ),
        (
            DrillSpec {
                mutate_body: Some("{}".into()),
                ..spec()
            },
            "--mutate",
        ),
        (
            DrillSpec {
                max_requests: Some(0),
                ..spec()
            },
            "--max-requests",
        ),
        (
            DrillSpec {
                rounds: Some(0),
                ..spec()
            },
            "--rounds",
        ),
        (
            DrillSpec {
                key_format: Some("order-1".into()),
                ..spec()
            },
            "--key-format",
        ),
        (
            DrillSpec {
                key_format: Some("pay {uuid}".into()),
                ..spec()
            },
            "--key-format",
        ),
    ];
    for (s, flag) in cases {
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains(flag), "{e} should name {flag}");
    }
}

#[test]
fn fields_keep_their_order_reverse_and_change() {
    let f = Fields::of(r#"{"b":1,"a":"x","c":{"z":1,"y":2}}"#).unwrap();
    assert_eq!(f.render(), r#"{"b":1,"a":"x","c":{"y":2,"z":1}}"#);
    assert_eq!(
        f.reversed().unwrap(),
        r#"{"c":{"y":2,"z":1},"a":"x","b":1}"#
    );
    assert_eq!(f.changed("u").0, r#"{"b":2,"a":"x","c":{"y":2,"z":1}}"#);
    let s = Fields::of(r#"{"a":"u1","b":"x"}"#).unwrap();
    assert_eq!(s.changed("u1").0, r#"{"a":"u1","b":"x-other"}"#);
    assert!(Fields::of("[1]").is_none());
    assert!(Fields::of(r#"{"a":1}"#).unwrap().reversed().is_none());
}

#[test]
fn key_formats_make_stable_distinct_keys() {
    let uuid = KeyFormat::parse("uuid").unwrap();
    let a = uuid.key("run1", "baseline");
    assert_eq!(a, uuid.key("run1", "baseline"), "stable within a case");
    assert_ne!(a, uuid.key("run1", "concurrency-1"));
    assert_ne!(a, uuid.key("run2", "baseline"));
    let parsed = uuid::Uuid::parse_str(&a).unwrap();
    assert_eq!(parsed.get_version_num(), 4, "{a}");
    let t = KeyFormat::parse("pay_{uuid}").unwrap();
    assert!(t.key("r", "c").starts_with("pay_"));
    assert!(uuid::Uuid::parse_str(&t.key("r", "c")[4..]).is_ok());
    assert_eq!(
        KeyFormat::parse("x-{token}").unwrap().key("r", "c"),
        "x-idem-drill-r-c"
    );
    assert_eq!(KeyFormat::Token.key("r", "c"), "idem-drill-r-c");
    assert!(KeyFormat::parse(&format!("{}{{uuid}}", "k".repeat(250))).is_err());
    // Checked against the longest case name, not a short one.
    assert!(KeyFormat::parse(&format!("{}{{token}}", "k".repeat(220))).is_err());
}

#[test]
fn counts_are_array_lengths_or_numbers() {
    let v = serde_json::json!({"data":[1,2],"n":3,"s":"x"});
    assert_eq!(count_at(&v, "/data"), Ok(2));
    assert_eq!(count_at(&v, "/n"), Ok(3));
    assert!(count_at(&v, "/s").is_err());
    assert!(count_at(&v, "/missing").is_err());
}
