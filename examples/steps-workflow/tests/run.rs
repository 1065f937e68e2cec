//! Runs the example binary three times on one database: an order whose
//! card is declined after its stock was reserved is compensated (stock back,
//! released once) and answered 402; its retry replays the 402 without
//! running anything again; an order with a good card keeps its reservation.

use tokio::process::Command;

/// One run of the example: its output lines.
async fn place(db: &std::path::Path, key: &str, card: &str) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_example-steps-workflow"))
        .env("IDEM_DB", db)
        .env("IDEM_KEY", key)
        .env("CARD", card)
        .output()
        .await
        .expect("run the example");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn a_declined_charge_releases_the_reservation_exactly_once() {
    let dir = std::env::temp_dir().join(format!("example-steps-workflow-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let db = dir.join("steps.db");
    let failed = r#"402 {"failed":"step_failed","step":"charge"}"#;

    let first = place(&db, "order-1", "declined").await;
    assert_eq!(
        first,
        [
            format!("answer {failed}"),
            "book: 10 of 10 available; reservations made 1, released 1 (all runs so far)".into()
        ],
        "reserved, charge declined, released once"
    );

    let retry = place(&db, "order-1", "declined").await;
    assert_eq!(
        retry,
        [
            format!("replayed {failed}"),
            "book: 10 of 10 available; reservations made 1, released 1 (all runs so far)".into()
        ],
        "the retry replays the answer: no second reservation, no second release"
    );

    let good = place(&db, "order-2", "ok").await;
    assert_eq!(good.len(), 2, "{good:?}");
    assert!(
        good[0].starts_with(r#"answer 201 {"sku":"book","payment":"pay_"#),
        "{good:?}"
    );
    assert_eq!(
        good[1], "book: 9 of 10 available; reservations made 2, released 1 (all runs so far)",
        "nothing to compensate"
    );

    let _ = std::fs::remove_dir_all(&dir);
}
