//! `cargo run -p example-drill-in-cargo-test`: the payments service on
//! 127.0.0.1:3000, its data in ./payments.db.
//!
//! Run it: no environment variables (the address and the file are fixed);
//! it prints `listening on http://127.0.0.1:3000` and Ctrl-C stops it. From
//! another shell:
//!
//! ```text
//! curl -s -w '\n' -X POST localhost:3000/v1/payments -H 'Idempotency-Key: p-1' \
//!   -H 'Content-Type: application/json' -d '{"amount":100,"currency":"EUR","customer":"cus_1"}'
//! curl -s -w '\n' 'localhost:3000/v1/payments?customer=cus_1'   # one payment, however often the POST is sent
//! ```
//!
//! Or drill it: `idem drill http://127.0.0.1:3000 --request 'POST /v1/payments'
//! --body '{"amount":100,"currency":"EUR","customer":"{unique}"}'
//! --effects 'GET /v1/payments?customer={unique}' --count /data`. Its test,
//! `tests/drill.rs`, runs the drills from `cargo test`.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = example_drill_in_cargo_test::open("sqlite://payments.db?mode=rwc").await?;
    let app = example_drill_in_cargo_test::app(store)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
