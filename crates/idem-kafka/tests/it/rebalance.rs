//! Two consumers of one group, the second joining and the first leaving in
//! the middle: each rebalance positions the partitions from the database;
//! no record is applied twice, none is skipped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idem_core::position::PositionStore;
use idem_inbox::ConsumerConfig;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_of_one_group_with_rebalances_apply_each_record_once() {
    let (store, _dir) = sqlite().await;
    let topics = Arc::new(Topics::create(4).await);
    write(&store, &payments(&topics, 8, 120)).await;
    assert_eq!(relay(&store, &topics.kafka).await, 120);

    let run = |stop: Arc<AtomicBool>, holds: Arc<AtomicUsize>| {
        let (topics, store) = (topics.clone(), store.clone());
        tokio::spawn(async move {
            // Two records a round, a pause between rounds: the joins and
            // leaves happen while most records are still to be applied.
            let config = ConsumerConfig {
                batch_size: 2,
                ..consumer_config()
            };
            let mut consumer = topics.consumer_with(&store, config).await;
            // How many partitions it held, each time that changed.
            let mut held: Vec<usize> = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                consumer.run_once().await.unwrap();
                let now = consumer.source_mut().assigned().len();
                holds.store(now, Ordering::SeqCst);
                if held.last() != Some(&now) {
                    held.push(now);
                }
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            let stats = consumer.stats();
            (
                stats.applied.load(Ordering::SeqCst),
                stats.duplicates.load(Ordering::SeqCst),
                held,
            )
        })
    };
    let wait = |n: usize| {
        let store = store.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(40);
            while ledger(&store).await.len() < n {
                assert!(
                    Instant::now() < deadline,
                    "{n} not applied in time: {}",
                    ledger(&store).await.len()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let (stop_a, stop_b) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let (holds_a, holds_b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let a = run(stop_a.clone(), holds_a.clone());
    wait(8).await;
    let b = run(stop_b.clone(), holds_b.clone());
    // B joins: the group takes partitions from A and gives them to B.
    let deadline = Instant::now() + Duration::from_secs(30);
    while holds_b.load(Ordering::SeqCst) == 0 || holds_a.load(Ordering::SeqCst) == 4 {
        assert!(
            Instant::now() < deadline,
            "no rebalance within 30 s of B's join"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let at_join = ledger(&store).await.len();
    assert!(at_join < 90, "the rebalance came after {at_join} of 120");
    // A leaves while its partitions still have records: B takes them over.
    wait(at_join + 2).await;
    stop_a.store(true, Ordering::SeqCst);
    let (applied_a, duplicates_a, held_a) = a.await.unwrap();
    wait(120).await;
    stop_b.store(true, Ordering::SeqCst);
    let (applied_b, duplicates_b, held_b) = b.await.unwrap();

    let positions = store.positions(&topics.group, &topics.topic).await.unwrap();
    println!(
        "rebalance: B joined at {at_join} applied; A applied {applied_a} ({duplicates_a} duplicates, partitions held \
         {held_a:?}), B {applied_b} ({duplicates_b} duplicates, held {held_b:?}); \
         positions {positions:?}"
    );
    let entries = ledger(&store).await;
    assert_once_in_order(&entries, 120);
    assert_eq!(positions.iter().map(|(_, o)| o + 1).sum::<i64>(), 120);
    assert_eq!(applied_a + applied_b, 120);
    assert!(
        applied_a >= 10 && applied_b >= 10,
        "both applied a share: A {applied_a}, B {applied_b}"
    );
    // A held all four, then shared them with B; B ended with all four.
    assert!(
        held_a
            .windows(2)
            .any(|w| w[0] == 4 && (1..4).contains(&w[1])),
        "A's partitions over time: {held_a:?}"
    );
    assert!(
        held_b.iter().any(|n| (1..4).contains(n)) && held_b.last() == Some(&4),
        "B's partitions over time: {held_b:?}"
    );
    // Each assignment starts at the stored offset + 1: the new owner sees
    // at most the records its old owner had in hand, not the partition
    // from its beginning.
    assert!(
        duplicates_a + duplicates_b <= 8,
        "duplicates: A {duplicates_a}, B {duplicates_b}"
    );
}

/// A retry is pending (record 0 nak'd, its partition paused) when another
/// member joins the group on another topic: the eager rebalance revokes the
/// partition and gives it straight back. librdkafka keeps a partition's
/// pause across a revoke and re-assign; the source forgets the retry with
/// the lane, so nothing resumes it, and the records should still be applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_paused_for_a_retry_and_reassigned_by_a_rebalance_is_consumed() {
    let (store, _dir) = sqlite().await;
    let topics = Topics::create(1).await;
    let mut messages = vec![topics.message("k", "fail-once-0")];
    messages.extend((1..5).map(|i| topics.message("k", &format!("n{i}"))));
    write(&store, &messages).await;
    assert_eq!(relay(&store, &topics.kafka).await, 5);
    let config = ConsumerConfig {
        nak_backoff: idem_core::Backoff {
            initial: Duration::from_secs(8),
            max: Duration::from_secs(8),
        },
        ..consumer_config()
    };
    let mut a = topics.consumer_with(&store, config).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while a.stats().retried.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "no retry");
        a.run_once().await.unwrap();
    }
    // Another member of the group, on a topic of its own.
    let other = Topics::create(1).await;
    let mut config_b = idem_kafka::SourceConfig::new(&topics.group, &other.topic, &other.dead);
    config_b.session_timeout = Duration::from_secs(6);
    let b = idem_kafka::KafkaSource::new(&topics.kafka, store.clone(), config_b)
        .await
        .unwrap();
    let mut b = idem_inbox::Consumer::new(
        b,
        idem_inbox::Inbox::new(store.clone()),
        idem_core::inbox::Subscriber::new("other").unwrap(),
        Ledger::<idem_sqlite::SqliteDialect>::default(),
        consumer_config(),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(40);
    while ledger(&store).await.len() < 5 && Instant::now() < deadline {
        a.run_once().await.unwrap();
        let _ = b.run_once().await;
    }
    let entries = ledger(&store).await;
    assert_eq!(
        entries.len(),
        5,
        "A holds {:?}, B {:?}; applied {entries:?}",
        a.source_mut().assigned(),
        b.source_mut().assigned()
    );
}
