//! The broker itself killed with `kill -9` while the relay publishes and
//! the consumer applies, and started again on its data: every payment is
//! applied once, in order per key.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use idem_core::position::PositionStore;
use idem_kafka::KafkaPublisher;
use idem_outbox::{Dispatcher, DispatcherConfig};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_killed_and_restarted_on_its_data_loses_and_duplicates_nothing() {
    let mut broker = idem_testkit::TansuServer::start();
    let kafka = idem_kafka::connect(&broker.url()).unwrap();
    let topics = Topics::create_on(kafka, 2).await;
    let (store, _dir) = sqlite().await;
    write(&store, &payments(&topics, 4, 40)).await;

    let stop = Arc::new(AtomicBool::new(false));
    let relay = {
        let (store, kafka, stop) = (store.clone(), topics.kafka.clone(), stop.clone());
        tokio::spawn(async move {
            let config = DispatcherConfig {
                batch_size: 4,
                ..DispatcherConfig::default()
            };
            let relay =
                Dispatcher::new(store, KafkaPublisher::new(&kafka).unwrap(), config).unwrap();
            while !stop.load(Ordering::SeqCst) {
                let _ = relay.run_once().await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let consumer = {
        let (store, topics, stop) = (store.clone(), topics.clone_topics(), stop.clone());
        tokio::spawn(async move {
            let mut consumer = topics.consumer(&store).await;
            while !stop.load(Ordering::SeqCst) {
                if consumer.run_once().await.is_err() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        })
    };
    let wait = |n: usize, secs: u64| {
        let store = store.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(secs);
            while ledger(&store).await.len() < n {
                assert!(
                    Instant::now() < deadline,
                    "{} of {n} applied after {secs} s",
                    ledger(&store).await.len()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    wait(8, 30).await;
    broker.kill();
    let at_kill = ledger(&store).await.len();
    tokio::time::sleep(Duration::from_secs(1)).await;
    broker.restart();
    wait(40, 50).await;
    stop.store(true, Ordering::SeqCst);
    relay.await.unwrap();
    consumer.await.unwrap();
    let entries = ledger(&store).await;
    assert_once_in_order(&entries, 40);
    let positions = store.positions(&topics.group, &topics.topic).await.unwrap();
    let settled: i64 = positions.iter().map(|(_, o)| o + 1).sum();
    assert!(settled >= 40, "positions {positions:?}");
    println!("broker kill: {at_kill} applied at the kill, then 40; positions {positions:?}");
}
