//! Three copies of the agent on one database and one feed of 40 changes;
//! the first dies (`abort`) right after writing its third notification and
//! before reporting it. The other two take its task over after the lease,
//! find the notification by its key, and finish: every change notified
//! exactly once, every task done.

use std::collections::HashMap;
use std::process::Stdio;

use idemkit::sqlite::{SqliteConfig, SqliteStore};
use idemkit::tasks::{TaskFilter, TaskState, TaskStore};
use tokio::process::Command;

fn agent(dir: &std::path::Path, worker: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_example-polling-agent"));
    cmd.env("IDEM_DB", dir.join("agent.db"))
        .env("IDEM_FEED", dir.join("changes.jsonl"))
        .env("IDEM_NOTIFY_LOG", dir.join("notifications.log"))
        .env("IDEM_WORKER", worker)
        .env("IDEM_LEASE", "1000")
        .env("IDEM_EXIT_WHEN_IDLE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

#[tokio::test]
async fn every_change_is_notified_once_though_a_copy_dies_after_acting() {
    let dir = std::env::temp_dir().join(format!("example-polling-agent-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut feed = String::new();
    for seq in 1..=40 {
        let (item, version) = ((seq - 1) % 20, (seq - 1) / 20 + 1);
        feed.push_str(&format!(
            "{{\"seq\":{seq},\"item\":\"issue-{item}\",\"version\":{version}}}\n"
        ));
    }
    std::fs::write(dir.join("changes.jsonl"), feed).expect("feed");

    let dying = agent(&dir, "agent-1")
        .env("IDEM_CRASH_AFTER", "3")
        .output()
        .await
        .expect("run the first copy");
    assert!(
        !dying.status.success(),
        "it aborts after its third notification"
    );

    let (b, c) = tokio::join!(
        agent(&dir, "agent-2").output(),
        agent(&dir, "agent-3").output()
    );
    for out in [b.expect("agent-2"), c.expect("agent-3")] {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let log = std::fs::read_to_string(dir.join("notifications.log")).expect("the log");
    let mut per_key: HashMap<&str, usize> = HashMap::new();
    for line in log.lines() {
        let key = line.split(' ').next().expect("a key");
        assert!(key.starts_with("idem:notify:"), "{line}");
        *per_key.entry(key).or_default() += 1;
    }
    assert_eq!(per_key.len(), 40, "one notification per change:\n{log}");
    assert!(
        per_key.values().all(|n| *n == 1),
        "none twice, the dead copy's included:\n{log}"
    );

    let url = format!("sqlite://{}", dir.join("agent.db").display());
    let store = SqliteStore::connect(&url, SqliteConfig::default())
        .await
        .expect("the agents' database");
    let done = store
        .list_tasks(&TaskFilter {
            state: Some(TaskState::Done),
            limit: 100,
            ..TaskFilter::default()
        })
        .await
        .expect("tasks");
    assert_eq!(done.len(), 40, "every task done");
    let _ = std::fs::remove_dir_all(&dir);
}
