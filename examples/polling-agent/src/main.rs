//! A polling agent on idemkit's task API, in one process with its database.
//!
//! It watches a feed of changes — a JSON-lines file, one change per line:
//! `{"seq": 1, "item": "issue-7", "version": 3}` (`seq` grows) — and
//! notifies once per change, by appending a line to a log that does **not**
//! deduplicate. Several copies may run on one database: each change becomes
//! one task whichever copy sees it first, a copy that dies holding a task
//! loses it when its lease ends, and the notification is never written
//! twice — its line carries the action's key, so an attempt whose outcome is
//! unknown is verified by looking for the key before writing again. Its
//! asks carry a key of their own with a nonce drawn at start, so a copy
//! restarted under the same `IDEM_WORKER` is never taken for the one it
//! replaces; it writes only while the lease the ask's answer left lasts.
//!
//! Each round: observe (the feed after the cursor → tasks, and the cursor
//! moved, in one transaction), claim one task, act, complete.
//!
//! # Run it
//!
//! ```sh
//! printf '{"seq":1,"item":"issue-7","version":1}\n{"seq":2,"item":"issue-8","version":1}\n' > changes.jsonl
//! cargo build -p example-polling-agent
//! export IDEM_EXIT_WHEN_IDLE=1 IDEM_LEASE=2000   # stop after a lease without work
//! target/debug/example-polling-agent & target/debug/example-polling-agent   # two copies
//! wait; cat notifications.log            # one line per change
//! ```
//!
//! `IDEM_DB` (default `agent.db`), `IDEM_FEED` (`changes.jsonl`),
//! `IDEM_NOTIFY_LOG` (`notifications.log`), `IDEM_WORKER` (`agent-<pid>`),
//! `IDEM_LEASE` in ms (`30000`). With `IDEM_EXIT_WHEN_IDLE=1` it stops
//! once it found nothing to do for longer than a lease (so a dead copy's
//! task is taken over first); otherwise it polls until Ctrl-C. `IDEM_CRASH_AFTER=N` aborts the process right after its N-th
//! notification, before reporting it (what a `kill -9` at the worst moment
//! does; its test uses it).

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use idemkit::sqlite::{SqliteConfig, SqliteStore};
use idemkit::tasks::{
    ActionDecision, ActionMode, ActionName, ActionOutcome, Observation, PollerName, QueueName,
    TaskId, TaskSpec, Tasks, TasksConfig, TasksError, WorkerName,
};
use idemkit::{IdempotencyKey, StoreError, Tenant};
use serde_json::{Value, json};

type Error = Box<dyn std::error::Error>;

struct Agent {
    tasks: Tasks<SqliteStore>,
    tenant: Tenant,
    queue: QueueName,
    poller: PollerName,
    worker: WorkerName,
    notify: ActionName,
    feed: PathBuf,
    log: PathBuf,
    lease: Duration,
    crash_after: Option<u32>,
    sent: u32,
    /// Drawn at start: this process's asks are its own.
    nonce: String,
    asks: u32,
}

/// The lease a notification needs left to be written.
const SEND_MARGIN: Duration = Duration::from_millis(200);

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.into())
}

impl Agent {
    /// The feed's changes after `after`, at most `max`.
    fn changes(&self, after: i64, max: usize) -> Result<Vec<(i64, String, i64)>, Error> {
        let file = match std::fs::File::open(&self.feed) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(format!("{}: {e}", self.feed.display()).into()),
        };
        let mut out = Vec::new();
        for line in std::io::BufReader::new(file).lines() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(&line)
                .map_err(|e| format!("{}: {e}: {line}", self.feed.display()))?;
            let (Some(seq), Some(item), Some(version)) =
                (v["seq"].as_i64(), v["item"].as_str(), v["version"].as_i64())
            else {
                return Err(format!("a change needs seq, item and version: {line}").into());
            };
            if seq > after && out.len() < max {
                out.push((seq, item.to_owned(), version));
            }
        }
        Ok(out)
    }

    /// Reads the feed after the cursor and reports it; `true` when it saw
    /// something new.
    async fn observe(&self) -> Result<bool, Error> {
        // Sent back as it is stored: no number of it rounded.
        let expected = self
            .tasks
            .poller(&self.tenant, &self.poller)
            .await?
            .map(|c| c.cursor);
        let after = expected
            .as_deref()
            .map(serde_json::from_str::<Value>)
            .transpose()?
            .and_then(|c| c["after"].as_i64())
            .unwrap_or(0);
        let changes = self.changes(after, 50)?;
        let Some(last) = changes.last().map(|c| c.0) else {
            return Ok(false);
        };
        let mut tasks = Vec::new();
        for (_, item, version) in &changes {
            let key = IdempotencyKey::new(format!("feed:{item}:v{version}"))?;
            let spec = TaskSpec::new(json!({"item": item, "version": version}));
            tasks.push((self.queue.clone(), key, spec));
        }
        let observation = Observation {
            expected: expected.map(idemkit::tasks::JsonText::new),
            value: json!({ "after": last }).into(),
            tasks,
        };
        match self
            .tasks
            .observe(&self.tenant, &self.poller, &observation)
            .await
        {
            // Another copy moved the cursor first: read again next round.
            Ok(_) | Err(TasksError::CursorMoved { .. }) => Ok(true),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether the log holds a notification with `key`.
    fn notified(&self, key: &str) -> Result<bool, Error> {
        match std::fs::read_to_string(&self.log) {
            Ok(text) => Ok(text.lines().any(|l| l.starts_with(&format!("{key} ")))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// The notification itself: one line, no deduplication.
    fn send(&mut self, key: &str, payload: &str) -> Result<(), Error> {
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        writeln!(log, "{key} {payload}")?;
        log.sync_all()?;
        self.sent += 1;
        if self.crash_after == Some(self.sent) {
            // Acted, not yet reported: the worst moment to die.
            std::process::abort();
        }
        Ok(())
    }

    /// Claims one task and works it; `true` when there was one.
    async fn work(&mut self) -> Result<bool, Error> {
        let claimed = self
            .tasks
            .claim(&self.tenant, &self.queue, &self.worker, self.lease, 1)
            .await?;
        let Some(task) = claimed.into_iter().next() else {
            return Ok(false);
        };
        let id = TaskId::parse(&task.id)?;
        let fence = task.fence;
        // This ask's own key, with this process's nonce: a retry of it (its
        // answer lost) is told what it was told; any other ask under the
        // claim — a copy restarted under the same IDEM_WORKER — `unknown`.
        self.asks += 1;
        let ask = IdempotencyKey::new(format!(
            "{}:{}:ask:{}",
            self.worker.as_str(),
            self.nonce,
            self.asks
        ))?;
        let mut key = String::new();
        // Asked again only after a `not-sent` report freed the action.
        for _ in 0..3 {
            let asked = self
                .tasks
                .action(
                    &self.tenant,
                    &id,
                    fence,
                    &self.notify,
                    ActionMode::Verify,
                    Some(&ask),
                )
                .await;
            let (action_key, decision, held) = match asked {
                Ok(answer) => answer,
                // Lost the lease already (paused too long): another copy has it.
                Err(TasksError::LeaseLost { .. }) => return Ok(true),
                Err(e) => return Err(e.into()),
            };
            key = action_key.as_str().to_owned();
            let outcome = match decision {
                ActionDecision::Go => {
                    // Only while the lease lasts, on the database's clock:
                    // past it another copy may hold the task and write.
                    let left = self.tasks.lease_left(&held).unwrap_or_default();
                    if left < SEND_MARGIN {
                        return Ok(true);
                    }
                    self.send(&key, &task.payload)?;
                    ActionOutcome::Done
                }
                ActionDecision::Done => break,
                // An earlier attempt may have written it: look before acting.
                _ => match self.notified(&key)? {
                    true => ActionOutcome::Done,
                    false => ActionOutcome::NotSent,
                },
            };
            let reported = self
                .tasks
                .action_result(
                    &self.tenant,
                    &id,
                    fence,
                    &self.notify,
                    outcome,
                    Some(&ask),
                    (decision != ActionDecision::Go).then_some("verified in the log"),
                )
                .await;
            let reported = match reported {
                Ok((_, reported, _)) => reported,
                // Another ask of this claim was told go and may still
                // send: leave the task, its next claim looks again.
                Err(TasksError::AttemptInFlight | TasksError::LeaseLost { .. }) => {
                    return Ok(true);
                }
                Err(e) => return Err(e.into()),
            };
            if reported == ActionDecision::Done {
                break;
            }
        }
        match self
            .tasks
            .complete(&self.tenant, &id, fence, &json!({ "notified": key }))
            .await
        {
            Ok(_) | Err(TasksError::LeaseLost { .. }) => Ok(true),
            Err(e) => Err(e.into()),
        }
    }
}

/// A failure the next round may not meet: the store busy, unreachable, or
/// an outcome unknown (the round's writes are all safe to repeat).
fn transient(e: &(dyn std::error::Error + 'static)) -> bool {
    let store = match e.downcast_ref::<TasksError>() {
        Some(TasksError::Store(s)) => Some(s),
        _ => e.downcast_ref::<StoreError>(),
    };
    matches!(
        store,
        Some(
            StoreError::Busy { .. }
                | StoreError::Unavailable { .. }
                | StoreError::OutcomeUnknown { .. }
        )
    )
}

/// A nonce for this process: its id and the time it started, in hex.
fn nonce() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{:x}{:x}", std::process::id(), nanos & 0xffff_ffff_ffff)
}

async fn open(db: &Path) -> Result<SqliteStore, Error> {
    let url = format!("sqlite://{}?mode=rwc", db.display());
    let store = SqliteStore::connect(&url, SqliteConfig::default()).await?;
    store.migrate().await?;
    Ok(store)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    // Copies started together on a new SQLite file may find it locked while
    // another creates its tables: try again for a few seconds.
    let db = env("IDEM_DB", "agent.db");
    let mut tries = 0;
    let tasks = loop {
        let opened = async {
            let store = open(Path::new(&db)).await?;
            Ok::<_, Error>(Tasks::new(store, TasksConfig::default()).await?)
        };
        match opened.await {
            Ok(tasks) => break tasks,
            Err(e) if transient(e.as_ref()) && tries < 50 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    };
    let lease_ms: u64 = env("IDEM_LEASE", "30000")
        .parse()
        .map_err(|_| "IDEM_LEASE: milliseconds")?;
    let crash_after = match std::env::var("IDEM_CRASH_AFTER") {
        Ok(n) => Some(n.parse().map_err(|_| "IDEM_CRASH_AFTER: a number")?),
        Err(_) => None,
    };
    let mut agent = Agent {
        tasks,
        tenant: Tenant::new("default")?,
        queue: QueueName::new("notify")?,
        poller: PollerName::new("feed")?,
        worker: WorkerName::new(env("IDEM_WORKER", &format!("agent-{}", std::process::id())))?,
        notify: ActionName::new("notify")?,
        feed: env("IDEM_FEED", "changes.jsonl").into(),
        log: env("IDEM_NOTIFY_LOG", "notifications.log").into(),
        lease: Duration::from_millis(lease_ms),
        crash_after,
        sent: 0,
        nonce: nonce(),
        asks: 0,
    };
    let exit_when_idle = std::env::var("IDEM_EXIT_WHEN_IDLE").is_ok_and(|v| v == "1");
    let mut idle: u64 = 0;
    loop {
        let round = async { Ok::<_, Error>((agent.observe().await?, agent.work().await?)) };
        let (saw, worked) = match round.await {
            Ok(done) => done,
            // The database busy or unreachable a moment (another copy holds
            // SQLite's write lock): every step is safe to repeat.
            Err(e) if transient(e.as_ref()) => {
                eprintln!("retrying after: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                (false, true)
            }
            Err(e) => return Err(e),
        };
        if saw || worked {
            idle = 0;
            continue;
        }
        idle += 1;
        // Idle for a while (longer than a lease, so a dead copy's task is
        // taken over before this one leaves).
        if exit_when_idle && idle * 100 > lease_ms + 500 {
            println!(
                "idle: {} notifications sent by {}",
                agent.sent,
                agent.worker.as_str()
            );
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}
