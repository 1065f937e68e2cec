//! Two consumers of one group, the second joining and the first leaving in
//! the middle: each rebalance positions the partitions from the database;
//! no record is applied twice, none is skipped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use idem_core::position::PositionStore;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_of_one_group_with_rebalances_apply_each_record_once() {
    let (store, _dir) = sqlite().await;
    let topics = Arc::new(Topics::create(4).await);
    write(&store, &payments(&topics, 6, 60)).await;
    assert_eq!(relay(&store, &topics.kafka).await, 60);

    let run = |stop: Arc<AtomicBool>| {
        let (topics, store) = (topics.clone(), store.clone());
        tokio::spawn(async move {
            let mut consumer = topics.consumer(&store).await;
            let mut most_assigned = 0;
            while !stop.load(Ordering::SeqCst) {
                consumer.run_once().await.unwrap();
                most_assigned = most_assigned.max(consumer.source_mut().assigned().len());
            }
            let applied = consumer.stats().applied.load(Ordering::SeqCst);
            (applied, most_assigned)
        })
    };
    let wait = |n: usize| {
        let store = store.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(40);
            while ledger(&store).await.len() < n {
                assert!(Instant::now() < deadline, "{n} not applied in time");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let (stop_a, stop_b) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let a = run(stop_a.clone());
    wait(10).await;
    let b = run(stop_b.clone());
    wait(35).await;
    stop_a.store(true, Ordering::SeqCst);
    let (applied_a, assigned_a) = a.await.unwrap();
    wait(60).await;
    stop_b.store(true, Ordering::SeqCst);
    let (applied_b, assigned_b) = b.await.unwrap();

    let entries = ledger(&store).await;
    assert_once_in_order(&entries, 60);
    let positions = store.positions(&topics.group, &topics.topic).await.unwrap();
    assert_eq!(positions.iter().map(|(_, o)| o + 1).sum::<i64>(), 60);
    assert_eq!(applied_a + applied_b, 60);
    assert!(applied_b > 0, "the second consumer applied nothing");
    assert!(assigned_a > 0 && assigned_b > 0);
    println!(
        "rebalance: A applied {applied_a} (up to {assigned_a} partitions), B {applied_b} \
         (up to {assigned_b}); positions {positions:?}"
    );
}
