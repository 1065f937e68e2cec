//! The messages each key path sends to SQLite, pinned: each is one command
//! to a connection's worker thread (a round trip between the async task and
//! that thread), whatever the number of statements in its text.
//!
//! Its own test binary: it installs a process-wide tracing subscriber that
//! records sqlx's statement events (target `sqlx::query`, one per message,
//! emitted on the worker threads), which other tests would add to.
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::{Arc, Mutex};

use idem_conformance as c;
use idem_core::{Completion, Engine, Outcome, Policy};
use idem_sqlite::{SqliteConfig, SqliteStore};
use idem_testkit::TempDir;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// Every message's text, as sqlx logs it.
#[derive(Default)]
struct Messages(Mutex<Vec<String>>);

struct Text {
    summary: String,
    statement: String,
}

impl Visit for Text {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "summary" => self.summary = value.to_owned(),
            "db.statement" => self.statement = value.trim().to_owned(),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "summary" && self.summary.is_empty() {
            self.summary = format!("{value:?}");
        }
    }
}

struct Recorder(Arc<Messages>);

impl Subscriber for Recorder {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.target() == "sqlx::query"
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut text = Text {
            summary: String::new(),
            statement: String::new(),
        };
        event.record(&mut text);
        // sqlx leaves the full text out when the summary is all of it.
        let sql = if text.statement.is_empty() {
            text.summary
        } else {
            text.statement
        };
        self.0.0.lock().unwrap().push(sql);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// What a message is, by its text.
fn kind(sql: &str) -> String {
    let sql = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    let commits = sql.ends_with("; COMMIT");
    let kind = if sql.starts_with("SELECT request_hash") {
        "read"
    } else if sql.starts_with("BEGIN IMMEDIATE; INSERT INTO idem_keys") {
        "BEGIN IMMEDIATE + claim"
    } else if sql == "BEGIN IMMEDIATE" {
        "BEGIN IMMEDIATE"
    } else if sql.starts_with("INSERT INTO payments") {
        "business INSERT"
    } else if sql.starts_with("UPDATE idem_keys") && commits {
        "record UPDATE + guard + COMMIT"
    } else if sql.starts_with("INSERT INTO idem_keys") && commits {
        "record INSERT + guard + COMMIT"
    } else {
        return sql;
    };
    kind.to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_per_key_path_are_pinned() {
    let messages = Arc::new(Messages::default());
    tracing::subscriber::set_global_default(Recorder(messages.clone())).unwrap();
    let dir = TempDir::new("sqlite-statements");
    let store = SqliteStore::connect(&dir.sqlite_url(), SqliteConfig::default())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    sqlx::raw_sql("CREATE TABLE payments (id TEXT PRIMARY KEY, amount INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let engine = Engine::new(store);
    let fp = c::fingerprint("{}");
    let run = |key: &'static str, policy: Policy| {
        let engine = engine.clone();
        async move {
            let out = engine
                .execute(&c::scope("t1", key), &fp, &policy, |tx| {
                    Box::pin(async move {
                        sqlx::query("INSERT INTO payments (id, amount) VALUES ($1, 1)")
                            .bind(key)
                            .execute(&mut **tx)
                            .await?;
                        Ok::<_, sqlx::Error>(Completion::completed(c::response(201, "{}")))
                    })
                })
                .await
                .unwrap();
            matches!(out, Outcome::Executed(_))
        }
    };
    let pessimistic = Policy::default();
    let optimistic = Policy::default().optimistic();
    // Warm up: the reader and the writer are open.
    assert!(run("warm-p", pessimistic).await);
    assert!(!run("warm-p", pessimistic).await);
    assert!(run("warm-o", optimistic).await);
    assert!(!run("warm-o", optimistic).await);
    let cases: [(&str, Policy, bool, &[&str]); 4] = [
        (
            "k-p",
            pessimistic,
            true,
            &[
                "read",
                "BEGIN IMMEDIATE + claim",
                "business INSERT",
                "record UPDATE + guard + COMMIT",
            ],
        ),
        ("k-p", pessimistic, false, &["read"]),
        (
            "k-o",
            optimistic,
            true,
            &[
                "read",
                "BEGIN IMMEDIATE",
                "business INSERT",
                "record INSERT + guard + COMMIT",
            ],
        ),
        ("k-o", optimistic, false, &["read"]),
    ];
    for (key, policy, fresh, expected) in cases {
        messages.0.lock().unwrap().clear();
        assert_eq!(run(key, policy).await, fresh, "{key} {:?}", policy.mode);
        let sent: Vec<String> = messages.0.lock().unwrap().iter().map(|m| kind(m)).collect();
        assert_eq!(
            sent, expected,
            "messages of {key} ({:?}, fresh: {fresh}); sqlx's BEGIN/COMMIT commands and \
             pool pings are absent by construction (the writer and the readers never go \
             back to the pool)",
            policy.mode
        );
    }
}
