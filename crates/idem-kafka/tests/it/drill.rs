//! Offsets live in the database: a consumer process killed right after a
//! commit (a failpoint's abort) or at any moment (`kill -9`) resumes at the
//! stored offset, with no record applied twice and none skipped.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use idem_core::position::PositionStore;
use idem_sql::{Dialect, SqlStore};

use crate::support::*;

/// The drill consumer (`examples/drill_consumer.rs`), built beside the tests.
fn drill_consumer() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let target = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let binary = target.join("examples/kafka-drill-consumer");
    assert!(
        binary.exists(),
        "{} is missing: cargo build -p idem-kafka --examples",
        binary.display()
    );
    binary
}

fn spawn(topics: &Topics, db: &str, failpoints: Option<&str>) -> Child {
    spawn_as("consumer", topics, db, failpoints)
}

fn spawn_as(role: &str, topics: &Topics, db: &str, failpoints: Option<&str>) -> Child {
    let mut cmd = Command::new(drill_consumer());
    cmd.env("IDEM_DRILL_ROLE", role);
    cmd.env("IDEM_KAFKA_URL", idem_testkit::kafka_url())
        .env("IDEM_DRILL_DB", db)
        .env("IDEM_DRILL_TOPIC", &topics.topic)
        .env("IDEM_DRILL_GROUP", &topics.group)
        .env("IDEM_DRILL_DEAD", &topics.dead)
        .env_remove(idem_core::failpoint::ENV);
    if let Some(f) = failpoints {
        cmd.env(idem_core::failpoint::ENV, f);
    }
    cmd.spawn().unwrap()
}

/// Waits for the child to die by itself (its failpoint) within `secs`.
fn wait_abort(child: &mut Child, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(!status.success(), "the consumer exited instead of aborting");
            return;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the consumer did not reach its failpoint in {secs} s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Records settled according to the stored positions.
async fn settled<D: Dialect>(store: &SqlStore<D>, topics: &Topics) -> i64 {
    let positions = store.positions(&topics.group, &topics.topic).await.unwrap();
    positions.iter().map(|(_, o)| o + 1).sum()
}

async fn wait_ledger<D: Dialect>(store: &SqlStore<D>, n: usize, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while ledger(store).await.len() < n {
        assert!(
            Instant::now() < deadline,
            "{} of {n} applied after {secs} s",
            ledger(store).await.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn killed_consumers_resume<D: Dialect>(store: SqlStore<D>, db: &str) {
    let topics = Topics::create(2).await;
    write(&store, &payments(&topics, 4, 24)).await;
    assert_eq!(relay(&store, &topics.kafka).await, 24);
    let mut counts = Vec::new();
    // Killed right after its 5th commit, then right after 6 more.
    for (after, total) in [(5, 5), (6, 11)] {
        let mut child = spawn(&topics, db, Some(&format!("consume.after_commit={after}")));
        wait_abort(&mut child, 40);
        let entries = ledger(&store).await;
        assert_eq!(entries.len(), total, "applied before the abort");
        assert_eq!(settled(&store, &topics).await, total as i64);
        counts.push(entries.len());
    }
    // Killed with SIGKILL at a moment of the test's choosing.
    let mut child = spawn(&topics, db, None);
    wait_ledger(&store, 16, 40).await;
    child.kill().unwrap();
    child.wait().unwrap();
    let at_kill = ledger(&store).await.len();
    assert_eq!(settled(&store, &topics).await, at_kill as i64);
    counts.push(at_kill);
    // And the rest.
    let mut child = spawn(&topics, db, None);
    wait_ledger(&store, 24, 40).await;
    child.kill().unwrap();
    child.wait().unwrap();
    let entries = ledger(&store).await;
    assert_once_in_order(&entries, 24);
    assert_eq!(settled(&store, &topics).await, 24);
    println!(
        "drill: ledger after each kill {counts:?}, then {}",
        entries.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_consumer_resumes_at_the_stored_offset_on_sqlite() {
    let (store, dir) = sqlite().await;
    killed_consumers_resume(store, &dir.sqlite_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_consumer_resumes_at_the_stored_offset_on_postgres() {
    let (store, db) = postgres().await;
    killed_consumers_resume(store, &db.url).await;
}

/// The relay killed between its delivery reports and marking the messages
/// sent: restarted, it publishes them again after the lease; the consumer
/// applies each payment once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_before_marking_sent_republishes_and_nothing_is_applied_twice() {
    use std::sync::atomic::Ordering;
    let (store, dir) = sqlite().await;
    let db = dir.sqlite_url();
    let topics = Topics::create(2).await;
    write(&store, &payments(&topics, 4, 16)).await;
    // Aborts after its second batch's delivery reports: up to 8 messages in
    // Kafka that the outbox still holds unsent.
    let mut relay = spawn_as("relay", &topics, &db, Some("relay.after_publish=2"));
    wait_abort(&mut relay, 40);
    let mut relay = spawn_as("relay", &topics, &db, None);
    let mut consumer = topics.consumer(&store).await;
    drain(&mut consumer, &store, 16, 45).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while consumer.stats().duplicates.load(Ordering::SeqCst) < 1 {
        assert!(Instant::now() < deadline, "no republished duplicate seen");
        consumer.run_once().await.unwrap();
    }
    relay.kill().unwrap();
    relay.wait().unwrap();
    let entries = ledger(&store).await;
    assert_once_in_order(&entries, 16);
    println!(
        "relay drill: 16 payments, {} duplicates skipped, {} ledger rows",
        consumer.stats().duplicates.load(Ordering::SeqCst),
        entries.len()
    );
}
