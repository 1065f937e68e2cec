//! Put the drill in your CI: start the service on a free port and run
//! `idem_drill::run` against it, as any `cargo test`.

use axum::Router;
use idem_drill::{DrillSpec, Outcome, Quiet, Report};

/// Serves `app` on 127.0.0.1:0 and drills it.
async fn drill(app: Router) -> Report {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let config = DrillSpec {
        target: Some(format!("http://{addr}")),
        request: Some("POST /v1/payments".into()),
        body: Some(r#"{"amount":100,"currency":"EUR","customer":"{unique}"}"#.into()),
        // How many payments one drill case made: the length of `data`.
        effects: Some("GET /v1/payments?customer={unique}".into()),
        count: Some("/data".into()),
        concurrency: Some(10),
        rounds: Some(2),
        ..DrillSpec::default()
    }
    .validate()
    .unwrap();
    idem_drill::run(config, &mut Quiet).await.unwrap()
}

/// A fresh database file for one test.
async fn store(name: &str) -> idemkit::sqlite::SqliteStore {
    let dir = std::env::temp_dir().join(format!("drill-example-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.join("payments.db").display());
    example_drill_in_cargo_test::open(&url).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_with_the_layer_passes_the_drill() {
    let app = example_drill_in_cargo_test::app(store("layer").await).unwrap();
    let report = drill(app).await;
    assert!(!report.failed(), "{}", report.table());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_layer_the_drill_fails_on_the_duplicate_charge() {
    let app = example_drill_in_cargo_test::app_without_idempotency(store("bare").await);
    let report = drill(app).await;
    assert!(report.failed(), "{}", report.table());
    let lost = report.drill("lost-response").unwrap();
    assert_eq!(lost.outcome, Outcome::Fail, "{}", report.table());
    assert!(lost.effects.unwrap() > 1, "{lost:?}");
}
