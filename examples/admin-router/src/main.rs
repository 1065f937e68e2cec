//! A user's axum app with the Idem admin API (`/admin/v1`) and console
//! (`/console`) mounted next to its own routes, on SQLite.
//!
//! ## Run it
//!
//! `IDEM_ADMIN_TOKEN` (required, 24+ characters, hard to guess; a weak one
//! is refused at start) is the admin token, `IDEM_DB` (default `./app.db`)
//! the database, `IDEM_LISTEN` (default `127.0.0.1:3000`) the address. It
//! prints `listening on 127.0.0.1:3000`; Ctrl-C stops it.
//!
//! ```text
//! export IDEM_ADMIN_TOKEN=$(openssl rand -hex 32)
//! cargo run -p example-admin-router
//! # in another shell, with the same IDEM_ADMIN_TOKEN:
//! curl -s localhost:3000/hello                                   # the app's own route
//! curl -s -w '\n' localhost:3000/admin/v1/keys -H "Authorization: Bearer $IDEM_ADMIN_TOKEN"
//! ```
//!
//! The console is at <http://127.0.0.1:3000/console/> (an operator name and
//! the token).

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
    let db = std::env::var("IDEM_DB").unwrap_or_else(|_| "app.db".into());
    let store = SqliteStore::connect(&format!("sqlite://{db}"), SqliteConfig::default())
        .await
        .map_err(|e| e.to_string())?;
    store.migrate().await.map_err(|e| e.to_string())?;

    // The app's own routes, then the admin router beside them.
    let app = Router::new()
        .route("/hello", get(|| async { "hello from the app\n" }))
        .merge(idem_admin::router(store, AdminConfig::new(Some(token))));

    let addr = std::env::var("IDEM_LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".into());
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
