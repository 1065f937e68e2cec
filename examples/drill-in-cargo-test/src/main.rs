//! `cargo run -p example-drill-in-cargo-test`: the payments service on
//! 127.0.0.1:3000, its data in ./payments.db.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = example_drill_in_cargo_test::open("sqlite://payments.db?mode=rwc").await?;
    let app = example_drill_in_cargo_test::app(store)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
