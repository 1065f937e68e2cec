//! A user's axum app with the Idem admin API (`/admin/v1`) and console
//! (`/console`) mounted next to its own routes, on SQLite.
//!
//! ```text
//! IDEM_ADMIN_TOKEN=$(openssl rand -base64 32) cargo run -p example-admin-router
//! ```

use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use idem_admin::{AdminConfig, AdminToken};
use idem_sqlite::{SqliteConfig, SqliteStore};

#[tokio::main]
async fn main() -> Result<(), String> {
    // The token comes from the environment; a weak one is refused here,
    // before anything listens.
    let token = std::env::var("IDEM_ADMIN_TOKEN").map_err(|_| "set IDEM_ADMIN_TOKEN")?;
    let token = AdminToken::new(&token)?;

    // The store the admin API reads: the same database as the app's keys.
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "sqlite://app.db".into());
    let store = SqliteStore::connect(&url, SqliteConfig::default())
        .await
        .map_err(|e| e.to_string())?;
    store.migrate().await.map_err(|e| e.to_string())?;

    // The app's own routes, then the admin router beside them.
    let app = Router::new()
        .route("/hello", get(|| async { "hello from the app\n" }))
        .merge(idem_admin::router(store, AdminConfig::new(Some(token))));

    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| e.to_string())?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    println!("listening on {local}");
    // With the peer address, so the guard locks out a source guessing tokens.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
    .map_err(|e| e.to_string())
}
