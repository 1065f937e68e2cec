//! Test support for Idem's integration suites: every SQLite test gets its own
//! directory and file, every PostgreSQL test its own database on the server
//! that `cargo xtask test` starts (`IDEM_TEST_POSTGRES_URL`). Both are removed
//! when the handle is dropped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use sqlx::Connection;

static SEQ: AtomicU32 = AtomicU32::new(0);

fn unique(tag: &str) -> String {
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    )
}

/// A fresh directory under the system temp dir, deleted on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `idem-<tag>-<pid>-<n>`.
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("idem-{}", unique(tag)));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `sqlite://<dir>/idem.db` (the file does not exist yet).
    pub fn sqlite_url(&self) -> String {
        format!("sqlite://{}", self.0.join("idem.db").display())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The suite's PostgreSQL server, as an admin URL ending in `/postgres`.
pub fn postgres_admin_url() -> String {
    std::env::var("IDEM_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!("IDEM_TEST_POSTGRES_URL is not set: run the suite with `cargo xtask test`")
    })
}

/// A fresh, empty database on the suite's server, dropped (with its
/// connections) when this is dropped.
#[derive(Debug)]
pub struct PgDatabase {
    /// The database name.
    pub name: String,
    /// `postgres://…/<name>`.
    pub url: String,
}

impl PgDatabase {
    /// Creates `<tag>_<pid>_<n>`.
    pub async fn create(tag: &str) -> Self {
        let admin = postgres_admin_url();
        let name = unique(tag);
        let mut conn = sqlx::PgConnection::connect(&admin).await.unwrap();
        sqlx::raw_sql(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .unwrap();
        let (base, _) = admin
            .rsplit_once('/')
            .expect("IDEM_TEST_POSTGRES_URL must end in /<database>");
        Self {
            url: format!("{base}/{name}"),
            name,
        }
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Best effort, on a thread of its own: drop may run inside a runtime.
        // The throwaway server is deleted at the end of the run anyway.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(mut conn) = sqlx::PgConnection::connect(&postgres_admin_url()).await {
                    let _ = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&mut conn)
                        .await;
                }
            });
        })
        .join();
    }
}
