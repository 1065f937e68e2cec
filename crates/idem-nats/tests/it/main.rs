//! Outbox, dispatcher, inbox and consumer against real SQLite files, a real
//! PostgreSQL server and a real NATS JetStream server.
#![allow(clippy::unwrap_used, missing_docs)]

mod backends;
mod quorum;
mod support;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::Context;
use idem_core::inbox::Subscriber;
use idem_core::outbox::{MessageId, OutboxMessage, OutboxStore};
use idem_core::{Backoff, KeyStore};
use idem_inbox::{Consumer, Inbox, InboxMode};
use idem_nats::NatsPublisher;
use idem_outbox::{Dispatcher, DispatcherConfig, Publisher};

use support::*;

/// The tests of both backends, written once.
macro_rules! messaging_suite {
    ($modname:ident, $backend:ident) => {
        mod $modname {
            use super::support::$backend as b;
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn dispatcher_publishes_what_committed_once_with_stable_ids() {
                let db = b::setup().await;
                let s = Streams::create(&js().await).await;
                let kept = [s.message("k1", "a"), s.message("k2", "b")];
                let ids = b::write(&db.store, &kept).await;
                let mut tx = db.store.begin().await.unwrap();
                b::enqueue(&mut tx, &s.message("k3", "rolled back")).await;
                db.store.rollback(tx).await.unwrap();
                let d = dispatcher(db.store.clone(), s.js.clone(), fast());
                let round = d.run_once().await.unwrap();
                assert_eq!((round.claimed, round.sent), (2, 2));
                assert_eq!(d.run_once().await.unwrap().claimed, 0, "nothing left");
                let published = s.read().await;
                assert_eq!(
                    published.len(),
                    2,
                    "the rolled-back message was never published"
                );
                for (m, sent) in kept.iter().zip(&published) {
                    assert_eq!(sent.header("Nats-Msg-Id"), Some(m.message_id.to_string()));
                    assert_eq!(
                        sent.header("Idem-Message-Id"),
                        Some(m.message_id.to_string())
                    );
                    assert_eq!(sent.header("Idem-Message-Key"), Some(m.key.clone()));
                }
                // A dispatcher that crashed after the ack publishes again: the
                // broker drops it by id and says so.
                let again = NatsPublisher::new(s.js.clone())
                    .publish(&record(&kept[0], ids[0]))
                    .await
                    .unwrap();
                assert!(again.duplicate);
                assert_eq!(s.read().await.len(), 2);
                let stats = d.stats().await.unwrap();
                assert_eq!(
                    (stats.pending, stats.dead, stats.published_total),
                    (0, 0, 2)
                );
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn consumer_applies_each_message_once_despite_duplicates() {
                let db = b::setup().await;
                let s = Streams::create(&js().await).await;
                let messages: Vec<_> = (0..5).map(|i| s.message(&format!("k{i}"), "ok")).collect();
                b::write(&db.store, &messages).await;
                dispatcher(db.store.clone(), s.js.clone(), fast())
                    .run_once()
                    .await
                    .unwrap();
                // Duplicates the broker cannot drop: the same messages published
                // again under new broker ids (a replay by an operator).
                s.republish(&[1, 3]).await;
                let mut consumer = s
                    .consumer(&db.store, b::Ledger, InboxMode::Pessimistic)
                    .await;
                drain(&mut consumer, 7).await;
                assert_eq!(
                    b::ledger(&db.store).await.len(),
                    5,
                    "one effect per message"
                );
                assert_eq!(consumer.stats().duplicates.load(ORD), 2);
                assert_eq!(consumer.stats().applied.load(ORD), 5);
                let ids: HashSet<String> = b::ledger(&db.store).await.into_iter().collect();
                let expected: HashSet<String> =
                    messages.iter().map(|m| m.message_id.to_string()).collect();
                assert_eq!(ids, expected);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn undecodable_and_rejected_messages_are_dead_lettered_with_a_reason() {
                let db = b::setup().await;
                let s = Streams::create(&js().await).await;
                b::write(&db.store, &[s.message("k", "reject")]).await;
                dispatcher(db.store.clone(), s.js.clone(), fast())
                    .run_once()
                    .await
                    .unwrap();
                s.publish_raw("no ids at all").await;
                let mut consumer = s
                    .consumer(&db.store, b::Ledger, InboxMode::Pessimistic)
                    .await;
                drain(&mut consumer, 2).await;
                let dead = s.read_dead().await;
                assert_eq!(dead.len(), 2);
                let reasons: Vec<String> = dead
                    .iter()
                    .map(|m| m.header("Idem-Dead-Reason").unwrap())
                    .collect();
                assert!(
                    reasons
                        .iter()
                        .any(|r| r.contains("rejected by the handler")),
                    "{reasons:?}"
                );
                assert!(
                    reasons
                        .iter()
                        .any(|r| r.contains("undecodable") && r.contains("header")),
                    "{reasons:?}"
                );
                assert_eq!(
                    dead[0].header("Idem-Original-Subject"),
                    Some(s.topic.to_string())
                );
                assert!(b::ledger(&db.store).await.is_empty());
                // Terminated: not delivered again after the ack wait.
                tokio::time::sleep(Duration::from_millis(1200)).await;
                assert_eq!(consumer.run_once().await.unwrap(), 0);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn retryable_failures_are_redelivered_then_dead_lettered() {
                let db = b::setup().await;
                let s = Streams::create(&js().await).await;
                b::write(&db.store, &[s.message("k", "fail")]).await;
                dispatcher(db.store.clone(), s.js.clone(), fast())
                    .run_once()
                    .await
                    .unwrap();
                let mut consumer = s
                    .consumer(&db.store, b::Ledger, InboxMode::Pessimistic)
                    .await;
                for _ in 0..100 {
                    consumer.run_once().await.unwrap();
                    if consumer.stats().dead_lettered.load(ORD) == 1 {
                        break;
                    }
                }
                assert_eq!(consumer.stats().retried.load(ORD), 2, "naked twice");
                let dead = s.read_dead().await;
                assert_eq!(dead.len(), 1);
                assert!(
                    dead[0]
                        .header("Idem-Dead-Reason")
                        .unwrap()
                        .contains("gave up after 3 deliveries")
                );
                assert!(
                    b::ledger(&db.store).await.is_empty(),
                    "every failed attempt rolled back"
                );
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_handler_past_its_timeout_is_rolled_back_and_redelivered() {
                let db = b::setup().await;
                let s = Streams::create(&js().await).await;
                b::write(&db.store, &[s.message("k", "slow")]).await;
                dispatcher(db.store.clone(), s.js.clone(), fast())
                    .run_once()
                    .await
                    .unwrap();
                let mut consumer = s
                    .consumer(&db.store, b::Ledger, InboxMode::Pessimistic)
                    .await;
                for _ in 0..100 {
                    consumer.run_once().await.unwrap();
                    if consumer.stats().applied.load(ORD) == 1 {
                        break;
                    }
                }
                assert_eq!(consumer.stats().applied.load(ORD), 1);
                assert_eq!(
                    consumer.stats().retried.load(ORD),
                    1,
                    "the hung attempt was given up"
                );
                assert_eq!(
                    b::ledger(&db.store).await.len(),
                    1,
                    "the hung attempt's write was rolled back; the redelivery wrote once"
                );
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_crash_looping_consumer_loses_nothing() {
                let db = b::setup().await;
                let s = Streams::create(&js().await).await;
                let messages: Vec<_> = (0..3).map(|i| s.message(&format!("k{i}"), "ok")).collect();
                b::write(&db.store, &messages).await;
                dispatcher(db.store.clone(), s.js.clone(), fast())
                    .run_once()
                    .await
                    .unwrap();
                // Six crashes in a row: each fetches the batch (a delivery for
                // every message in it) and dies before settling any of them.
                let mut crashing = s
                    .consumer(&db.store, b::Ledger, InboxMode::Pessimistic)
                    .await;
                for _ in 0..6 {
                    use idem_inbox::MessageSource;
                    let fetched = crashing
                        .source_mut()
                        .fetch(10, Duration::from_millis(500))
                        .await
                        .unwrap();
                    assert_eq!(fetched.len(), 3, "redelivered after the ack wait");
                    drop(fetched);
                    tokio::time::sleep(Duration::from_millis(1100)).await;
                }
                let mut healthy = s
                    .consumer(&db.store, b::Ledger, InboxMode::Pessimistic)
                    .await;
                drain(&mut healthy, 3).await;
                assert_eq!(
                    b::ledger(&db.store).await.len(),
                    3,
                    "every message applied once, none given up"
                );
                assert!(s.read_dead().await.is_empty(), "and none dead-lettered");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_duplicates_apply_once_in_both_modes() {
                for mode in [InboxMode::Pessimistic, InboxMode::Optimistic] {
                    let db = b::setup().await;
                    let inbox = Arc::new(Inbox::new(db.store.clone()).mode(mode));
                    let sub = Subscriber::new("ledger").unwrap();
                    let id = MessageId::new("dup-1").unwrap();
                    let mut tasks = Vec::new();
                    for _ in 0..8 {
                        let (inbox, sub, id) = (inbox.clone(), sub.clone(), id.clone());
                        tasks.push(tokio::spawn(async move {
                            b::apply_once(&inbox, &sub, &id).await
                        }));
                    }
                    let mut applied = 0;
                    for t in tasks {
                        applied += usize::from(t.await.unwrap());
                    }
                    assert_eq!(applied, 1, "{mode:?}: exactly one delivery applied");
                    assert_eq!(b::ledger(&db.store).await.len(), 1, "{mode:?}: one effect");
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn refused_publishes_back_off_then_die_and_free_their_key() {
                let db = b::setup().await;
                let s = Streams::create_with_max_msg_size(&js().await, 256).await;
                let big = s.message("k", &"x".repeat(1024));
                let after = s.message("k", "small");
                b::write(&db.store, &[big, after.clone()]).await;
                let config = DispatcherConfig {
                    max_attempts: 3,
                    ..fast()
                };
                let d = dispatcher(db.store.clone(), s.js.clone(), config);
                let mut rounds = Vec::new();
                for _ in 0..50 {
                    let r = d.run_once().await.unwrap();
                    rounds.push(r);
                    if r.sent == 1 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let failed: usize = rounds.iter().map(|r| r.failed).sum();
                let dead: usize = rounds.iter().map(|r| r.dead).sum();
                assert_eq!((failed, dead), (3, 1), "three refusals, then dead");
                let published = s.read().await;
                assert_eq!(published.len(), 1, "the refused message was never sent");
                assert_eq!(
                    published[0].header("Idem-Message-Id"),
                    Some(after.message_id.to_string())
                );
                let stats = d.stats().await.unwrap();
                assert_eq!((stats.pending, stats.dead), (0, 1));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sent_messages_are_deleted_after_the_retention() {
                let db = b::setup().await;
                let s = Streams::create(&js().await).await;
                b::write(&db.store, &[s.message("k1", "a"), s.message("k2", "b")]).await;
                let clock = idem_core::ManualClock::starting_now();
                let config = DispatcherConfig {
                    retention: Duration::from_secs(3600),
                    ..fast()
                };
                let d = Dispatcher::with_clock(
                    db.store.clone(),
                    NatsPublisher::new(s.js.clone()),
                    config,
                    clock.clone(),
                )
                .unwrap();
                assert_eq!(d.run_once().await.unwrap().sent, 2);
                b::write(&db.store, &[s.message("k3", "still pending")]).await;
                assert_eq!(d.cleanup().await.unwrap(), 0, "within the retention");
                clock.advance(Duration::from_secs(3601));
                assert_eq!(d.cleanup().await.unwrap(), 2, "sent and past the retention");
                assert_eq!(
                    d.stats().await.unwrap().pending,
                    1,
                    "pending messages are never cleaned"
                );
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn broker_down_messages_wait_then_go_out_by_themselves() {
                let db = b::setup().await;
                let mut nats = idem_testkit::NatsServer::start();
                let js = idem_nats::connect(&nats.url(), "test", true).await.unwrap();
                let s = Streams::create(&js).await;
                let d = Arc::new(dispatcher(db.store.clone(), js.clone(), fast()));
                let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
                let runner = {
                    let d = d.clone();
                    tokio::spawn(async move {
                        d.run(idem_outbox::Polling, async {
                            let _ = stopped.await;
                        })
                        .await
                    })
                };
                nats.kill();
                let messages: Vec<_> = (0..20)
                    .map(|i| s.message(&format!("k{}", i % 4), "m"))
                    .collect();
                b::write(&db.store, &messages).await;
                tokio::time::sleep(Duration::from_millis(1500)).await;
                let waiting = d.stats().await.unwrap();
                assert_eq!(
                    (waiting.pending, waiting.dead),
                    (20, 0),
                    "all wait, none dead"
                );
                nats.restart();
                let mut pending = u64::MAX;
                for _ in 0..300 {
                    pending = d.stats().await.unwrap().pending;
                    if pending == 0 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                assert_eq!(pending, 0, "the dispatcher recovered by itself");
                let _ = stop.send(());
                runner.await.unwrap();
                let published = s.read().await;
                assert_eq!(published.len(), 20, "nothing lost, nothing doubled");
                assert_in_key_order(&published, &messages);
            }
        }
    };
}

messaging_suite!(sqlite, sqlite_backend);
messaging_suite!(postgres, postgres_backend);

/// Two dispatchers on one PostgreSQL outbox, with a publisher that delays,
/// refuses and loses acknowledgements at random: every message is in the
/// stream once, and each key's messages are in write order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dispatchers_on_postgres_never_reorder_a_key() {
    let seed = seed();
    let db = postgres_backend::setup().await;
    let s = Streams::create(&js().await).await;
    let messages: Vec<_> = (0..240)
        .map(|i| s.message(&format!("key-{}", i % 12), &format!("{i}")))
        .collect();
    postgres_backend::write(&db.store, &messages).await;
    let config = DispatcherConfig {
        batch_size: 8,
        max_attempts: 1000,
        backoff: Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(40),
        },
        lease: Duration::from_secs(5),
        ..fast()
    };
    let mut runners = Vec::new();
    let (stop, _) = tokio::sync::broadcast::channel::<()>(1);
    for n in 0..2u64 {
        // Each dispatcher has a pool of its own, like a separate process.
        let store = postgres_backend::connect(&db).await;
        let publisher = Flaky::new(NatsPublisher::new(s.js.clone()), seed.wrapping_add(n));
        let d = Arc::new(Dispatcher::new(store, publisher, config.clone()).unwrap());
        let mut stopped = stop.subscribe();
        runners.push(tokio::spawn(async move {
            d.run(idem_outbox::Polling, async move {
                let _ = stopped.recv().await;
            })
            .await
        }));
    }
    let mut pending = u64::MAX;
    for _ in 0..600 {
        pending = db.store.stats().await.unwrap().pending;
        if pending == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(());
    for r in runners {
        r.await.unwrap();
    }
    assert_eq!(pending, 0, "seed {seed}: everything published");
    let published = s.read().await;
    assert_eq!(published.len(), 240, "seed {seed}: once each");
    assert_in_key_order(&published, &messages);
}

/// `NOTIFY` at commit wakes a dispatcher that would otherwise sleep for a
/// minute between polls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_wakes_the_dispatcher_before_its_poll_interval() {
    let db = postgres_backend::setup().await;
    let s = Streams::create(&js().await).await;
    let config = DispatcherConfig {
        poll_interval: Duration::from_secs(60),
        ..fast()
    };
    let d = Arc::new(dispatcher(db.store.clone(), s.js.clone(), config));
    let wake = db.store.dialect().outbox_listener().await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let runner = {
        let d = d.clone();
        tokio::spawn(async move {
            d.run(wake, async {
                let _ = stopped.await;
            })
            .await
        })
    };
    // Let the first, empty round pass: the dispatcher is now asleep.
    tokio::time::sleep(Duration::from_millis(300)).await;
    postgres_backend::write(&db.store, &[s.message("k", "wake up")]).await;
    let mut published = 0;
    for _ in 0..100 {
        published = s.read().await.len();
        if published == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(());
    runner.await.unwrap();
    assert_eq!(
        published, 1,
        "published within 5 s of the commit, not after the 60 s poll"
    );
}

/// The dispatcher's database goes away and comes back: it keeps running and
/// publishes what was written meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatcher_outlives_its_database_going_away() {
    let db = postgres_backend::setup().await;
    let s = Streams::create(&js().await).await;
    let proxy = idem_testkit::Proxy::start(idem_testkit::url_addr(&db.db.url)).await;
    let via = idem_postgres::PgStore::connect(
        &idem_testkit::url_via(&db.db.url, proxy.addr),
        idem_postgres::PgConfig {
            acquire_timeout: Duration::from_secs(1),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let d = Arc::new(dispatcher(via, s.js.clone(), fast()));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let runner = {
        let d = d.clone();
        tokio::spawn(async move {
            d.run(idem_outbox::Polling, async {
                let _ = stopped.await;
            })
            .await
        })
    };
    proxy.cut().await;
    let messages: Vec<_> = (0..10).map(|i| s.message(&format!("k{i}"), "m")).collect();
    postgres_backend::write(&db.store, &messages).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        s.read().await.is_empty(),
        "nothing can be claimed while the database is away"
    );
    proxy.restore();
    let mut published = 0;
    for _ in 0..200 {
        published = s.read().await.len();
        if published == 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(());
    runner.await.unwrap();
    assert_eq!(published, 10, "the dispatcher recovered by itself");
}

/// The consumer's database goes away: the message is not acknowledged; once
/// the database is back, the redelivery is applied, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_down_means_no_ack_and_a_redelivery() {
    let db = postgres_backend::setup().await;
    let s = Streams::create(&js().await).await;
    postgres_backend::write(&db.store, &[s.message("k", "ok")]).await;
    dispatcher(db.store.clone(), s.js.clone(), fast())
        .run_once()
        .await
        .unwrap();
    let proxy = idem_testkit::Proxy::start(idem_testkit::url_addr(&db.db.url)).await;
    let via = idem_postgres::PgStore::connect(
        &idem_testkit::url_via(&db.db.url, proxy.addr),
        idem_postgres::PgConfig {
            acquire_timeout: Duration::from_secs(1),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let mut consumer = s
        .consumer(&via, postgres_backend::Ledger, InboxMode::Pessimistic)
        .await;
    proxy.cut().await;
    assert_eq!(consumer.run_once().await.unwrap(), 1);
    assert_eq!(
        consumer.stats().retried.load(ORD),
        1,
        "not acked: naked for later"
    );
    assert_eq!(consumer.stats().applied.load(ORD), 0);
    proxy.restore();
    drain(&mut consumer, 1).await;
    assert_eq!(consumer.stats().applied.load(ORD), 1);
    assert_eq!(postgres_backend::ledger(&db.store).await.len(), 1);
}

fn fast() -> DispatcherConfig {
    DispatcherConfig {
        poll_interval: Duration::from_millis(50),
        backoff: Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(50),
        },
        broker_backoff: Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(200),
        },
        ..DispatcherConfig::default()
    }
}

fn dispatcher<S: OutboxStore>(
    store: S,
    js: Context,
    config: DispatcherConfig,
) -> Dispatcher<S, NatsPublisher> {
    Dispatcher::new(store, NatsPublisher::new(js), config).unwrap()
}

fn record(m: &OutboxMessage, id: i64) -> idem_core::outbox::OutboxRecord {
    idem_core::outbox::OutboxRecord {
        id,
        message_id: m.message_id.clone(),
        topic: m.topic.clone(),
        key: m.key.clone(),
        payload: m.payload.clone(),
        headers: m.headers.clone(),
        attempts: 0,
        created_at_ms: 0,
    }
}

/// Runs the consumer until it has settled `n` deliveries (or 10 s).
async fn drain<Src, S, H>(consumer: &mut Consumer<Src, S, H>, n: u64)
where
    Src: idem_inbox::MessageSource,
    S: idem_core::inbox::InboxStore,
    H: idem_inbox::Handler<S::Tx>,
{
    let settled = |c: &Consumer<Src, S, H>| {
        let s = c.stats();
        s.applied.load(ORD) + s.duplicates.load(ORD) + s.dead_lettered.load(ORD)
    };
    for _ in 0..50 {
        if settled(consumer) >= n {
            return;
        }
        consumer.run_once().await.unwrap();
    }
    panic!("only {} of {n} deliveries settled", settled(consumer));
}

/// Each key's messages appear in the stream in the order they were written.
fn assert_in_key_order(published: &[Sent], written: &[OutboxMessage]) {
    let position: BTreeMap<String, usize> = written
        .iter()
        .enumerate()
        .map(|(i, m)| (m.message_id.to_string(), i))
        .collect();
    let mut last: BTreeMap<String, usize> = BTreeMap::new();
    for m in published {
        let key = m.header("Idem-Message-Key").unwrap();
        let at = position[&m.header("Idem-Message-Id").unwrap()];
        if let Some(prev) = last.insert(key.clone(), at) {
            assert!(prev < at, "key {key}: message {at} published after {prev}");
        }
    }
}

/// An inbox retention outside 1 s to 400 days is refused, not clamped.
#[tokio::test]
async fn inbox_retention_out_of_range_is_refused() {
    let (store, _dir) = support::sqlite_open::open().await;
    store.migrate().await.unwrap();
    let inbox = || Inbox::new(store.clone());
    assert!(inbox().retention(Duration::from_secs(3600)).is_ok());
    let err = inbox().retention(Duration::ZERO).unwrap_err().to_string();
    assert_eq!(err, "Inbox.retention must be between 1s and 400d, got 0s");
    let err = inbox()
        .retention(Duration::from_secs(401 * 24 * 3600))
        .unwrap_err();
    assert_eq!(err.field, "retention");
}

/// `ensure_stream_with` creates a stream with its settings; on a stream
/// that exists it brings the subjects and the duplicate window to them and
/// keeps the rest (an operator's limits, its storage): the earlier version
/// replaced the whole configuration with defaults. A replica count the
/// broker cannot place is the broker's clear refusal, and 0 or 6 are
/// refused before asking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensure_stream_creates_with_settings_and_keeps_an_operators_configuration() {
    use idem_nats::{StreamSettings, ensure_stream_with};
    let js = support::js().await;
    let name = idem_testkit::unique_name("KEEP");
    let subject = format!("{name}.>");
    let settings = StreamSettings::new(Duration::from_secs(120));
    let made = ensure_stream_with(&js, &name, &[&subject], &settings)
        .await
        .unwrap();
    assert_eq!((made.created, made.replicas), (true, 1));
    assert!(
        idem_nats::stream_has_quorum(&js, &name).await.unwrap(),
        "a stream on a single server is its own majority"
    );
    // An operator sets a limit on it.
    let mut stream = js.get_stream(&name).await.unwrap();
    let mut config = stream.info().await.unwrap().config.clone();
    config.max_messages = 1000;
    js.update_stream(config).await.unwrap();
    // Idem starts again, with a longer window and another subject.
    let again = StreamSettings::new(Duration::from_secs(300));
    let other = format!("{name}_more.>");
    let found = ensure_stream_with(&js, &name, &[&subject, &other], &again)
        .await
        .unwrap();
    assert_eq!((found.created, found.replicas), (false, 1));
    let config = stream.info().await.unwrap().config.clone();
    assert_eq!(config.max_messages, 1000, "the operator's limit is kept");
    assert_eq!(config.duplicate_window, Duration::from_secs(300));
    assert_eq!(config.subjects, vec![subject.clone(), other]);
    // A single server cannot hold three copies: the broker says so.
    let three = StreamSettings {
        replicas: 3,
        ..StreamSettings::new(Duration::from_secs(120))
    };
    let fresh = idem_testkit::unique_name("R3");
    let err = ensure_stream_with(&js, &fresh, &[&format!("{fresh}.>")], &three)
        .await
        .unwrap_err();
    let unsupported = err.0.downcast_ref::<idem_nats::ReplicasUnsupported>();
    assert_eq!(
        unsupported.map(|u| u.replicas),
        Some(3),
        "a setting to change, told apart: {err}"
    );
    for replicas in [0, 6] {
        let bad = StreamSettings {
            replicas,
            ..StreamSettings::new(Duration::from_secs(120))
        };
        let err = ensure_stream_with(&js, &fresh, &[&format!("{fresh}.>")], &bad)
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("nats: stream replicas must be 1 to 5, not {replicas}")
        );
    }
    js.delete_stream(&name).await.unwrap();
}

/// A cluster's servers, comma-separated, are one URL: the client connects to
/// one that answers (here the second; nothing listens on the first). An
/// empty entry is refused with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_comma_separated_server_list_connects_to_one_that_answers() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let list = format!("nats://127.0.0.1:{dead},{}", idem_testkit::nats_url());
    let js = idem_nats::connect(&list, "idem-test-list", false)
        .await
        .unwrap();
    js.client().flush().await.unwrap();
    assert!(idem_nats::is_connected(&js));
    let err = idem_nats::connect("nats://127.0.0.1:4222,,nats://127.0.0.1:4223", "x", false)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "nats: an empty server in the NATS URL list (two commas, or one at an end)"
    );
}

/// A broker that is out of storage answers a publish with JetStream's
/// `insufficient resources` (status 503, error code 10023). That is the
/// broker's state, not the message's fault: the publish must be reported
/// as unavailable (retried without counting an attempt), or every message
/// the relay tries meanwhile is marked dead after `max_attempts` refusals
/// (about three minutes with the default backoff) while a disk is full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_out_of_storage_is_unavailable_not_a_rejection() {
    let dir = idem_testkit::TempDir::new("nats-small");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = dir.path().join("nats.conf");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:{port}\njetstream {{ store_dir: {:?}, max_file_store: 65536, max_memory_store: 1048576 }}\n",
            dir.path().join("js").display().to_string()
        ),
    )
    .unwrap();
    let binary = std::env::var("IDEM_TEST_NATS_SERVER").unwrap_or_else(|_| "nats-server".into());
    let mut child = std::process::Command::new(&binary)
        .arg("-c")
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("nats://127.0.0.1:{port}");
    let mut js = None;
    for _ in 0..300 {
        if let Ok(c) = idem_nats::connect(&url, "idem-test-small", false).await {
            js = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let js = js.expect("the small nats-server answers");
    let s = Streams::create(&js).await;
    let publisher = NatsPublisher::new(js.clone());
    let payload = "x".repeat(2000);
    let mut refused = None;
    for i in 0..200 {
        let m = s.message(&format!("k{i}"), &payload);
        match publisher.publish(&record(&m, i)).await {
            Ok(_) => {}
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let e = refused.expect("a 64 KiB store is full after 200 messages of 2 KB");
    assert!(
        e.retryable(),
        "a full broker store must cost no attempt, got: {e}"
    );
}
