//! The `Collector` on real databases: a fresh SQLite file and a fresh
//! PostgreSQL database per test (`cargo xtask test` starts the server).
#![allow(clippy::unwrap_used, missing_docs)]

use std::time::Duration;

use idem_core::inbox::{InboxStore, MessageId, Subscriber};
use idem_core::outbox::{OutboxMessage, OutboxStore, OutboxWriter, Topic};
use idem_core::steps::{
    Lease, MessageClaim, MessageState, NewRun, RunChange, RunId, RunState, RunStore,
};
use idem_core::tasks::{ClaimRequest, Fenced, NewTask, Settle, TaskStore};
use idem_core::webhooks::{NewReceipt, WebhookStore};
use idemkit::{
    Collected, Collector, CollectorConfig, Completion, Engine, FingerprintSpec, IdempotencyKey,
    ManualClock, Operation, Policy, RequestParts, Scope, StoredResponse, Tenant,
};

const HOUR: Duration = Duration::from_secs(3600);

/// A task created, claimed and completed now.
async fn finished_task<S: TaskStore>(store: &S, now: i64, tag: &str) {
    let id = format!("tsk_{tag}");
    let task = NewTask {
        id: &id,
        tenant: "acme",
        queue: "gc",
        key: tag,
        payload: "{}",
        payload_hash: "h",
        priority: 0,
        run_at_ms: now,
        max_attempts: 1,
        now_ms: now,
    };
    let mut tx = store.begin().await.unwrap();
    S::create_task(&mut tx, &task).await.unwrap();
    let claim = ClaimRequest {
        tenant: "acme",
        queue: "gc",
        worker: "w",
        lease_ms: 60_000,
        max: 10,
        now_ms: now,
    };
    let claimed = S::claim_tasks(&mut tx, &claim).await.unwrap();
    let done = Settle::Complete {
        result: "{}",
        result_hash: "r",
    };
    for t in claimed {
        let out = S::settle(&mut tx, "acme", &t.id, t.fence, &done, now)
            .await
            .unwrap();
        assert!(matches!(out, Fenced::Written(_)), "{out:?}");
    }
    store.commit(tx).await.unwrap();
}

/// One expired row of each kind, one live row of each kind.
async fn seed<S>(store: &S, clock: &ManualClock, tag: &str)
where
    S: InboxStore + OutboxStore + OutboxWriter + WebhookStore + RunStore + TaskStore,
{
    let now = idemkit::Clock::now_ms(clock);
    finished_task(store, now, tag).await;
    let hour_ms = 3_600_000;
    // A key record with a one-hour TTL.
    let engine = Engine::with_clock(store.clone(), clock.clone());
    let op = Operation::new("orders.create").unwrap();
    let scope = Scope::new(
        Tenant::new("acme").unwrap(),
        op.clone(),
        IdempotencyKey::new(format!("k-{tag}")).unwrap(),
    );
    let fp = FingerprintSpec::default().fingerprint(&RequestParts {
        method: "POST",
        operation: &op,
        target: "/orders",
        json: false,
        body: b"",
    });
    let policy = Policy {
        ttl: HOUR,
        ..Policy::default()
    };
    let idemkit::Begun::Fresh(claimed) = engine.begin(&scope, &fp, &policy).await.unwrap() else {
        panic!("a new key is claimed");
    };
    let response = StoredResponse {
        status: 201,
        headers: vec![],
        body: b"{}".to_vec(),
    };
    let finished = engine
        .finish(claimed, &Completion::completed(response))
        .await
        .unwrap();
    assert!(
        matches!(finished, idemkit::Finished::Committed),
        "{finished:?}"
    );
    // An inbox record kept one hour.
    let mut tx = store.begin().await.unwrap();
    let sub = Subscriber::new("mailer").unwrap();
    let mid = MessageId::new(format!("m-{tag}")).unwrap();
    assert!(
        InboxStore::record(store, &mut tx, &sub, &mid, now, now + hour_ms)
            .await
            .unwrap()
    );
    // A message, sent now.
    let msg =
        OutboxMessage::new(Topic::new("orders.created").unwrap(), tag, b"{}".to_vec()).unwrap();
    let id = store.enqueue(&mut tx, &msg, now).await.unwrap();
    store.commit(tx).await.unwrap();
    let claimed = store.claim_batch(now, HOUR, 100).await.unwrap();
    assert!(claimed.iter().any(|r| r.id == id));
    store.mark_sent(&[id], now).await.unwrap();
    // A webhook receipt (and its inbox record) kept two hours.
    let receipt = NewReceipt {
        endpoint: "github".into(),
        delivery_id: format!("d-{tag}"),
        event_type: None,
        headers: vec![],
        body: b"{}".to_vec(),
        entity_id: None,
        entity_version: None,
        content_sha256: None,
    };
    store
        .accept(&receipt, now, now + 2 * hour_ms)
        .await
        .unwrap();
}

async fn purges_each_kind_in_bounded_batches<S>(store: S)
where
    S: InboxStore + OutboxStore + OutboxWriter + WebhookStore + RunStore + TaskStore,
{
    let clock = ManualClock::new(1_000_000_000_000);
    seed(&store, &clock, "a").await;
    seed(&store, &clock, "b").await;
    clock.advance(HOUR);
    // Live rows: one of each kind seeded later must survive.
    seed(&store, &clock, "live").await;

    let config = CollectorConfig {
        batch_size: 1,
        max_batches: 1,
        sent_retention: HOUR / 2,
        task_retention: HOUR / 2,
    };
    let collector = Collector::with_clock(store.clone(), config, clock.clone()).unwrap();
    assert_eq!(
        collector.collect_once().await.unwrap(),
        Collected {
            keys: 1,
            inbox: 1,
            receipts: 0,
            sent: 1,
            runs: 0,
            messages: 0,
            tasks: 1,
        },
        "one batch of one row per kind; the receipts are not expired yet"
    );
    assert_eq!(
        collector.collect_once().await.unwrap(),
        Collected {
            keys: 1,
            inbox: 1,
            receipts: 0,
            sent: 1,
            runs: 0,
            messages: 0,
            tasks: 1,
        },
        "the rest comes at the next run"
    );
    assert_eq!(
        collector.collect_once().await.unwrap(),
        Collected::default()
    );

    // Past the receipts' retention (and the rest's: the live rows expire too).
    clock.advance(2 * HOUR + Duration::from_millis(1));
    let wide = CollectorConfig {
        sent_retention: HOUR / 2,
        task_retention: HOUR / 2,
        ..CollectorConfig::default()
    };
    let wide = Collector::with_clock(store.clone(), wide, clock.clone()).unwrap();
    let collected = wide.collect_once().await.unwrap();
    assert_eq!((collected.keys, collected.sent, collected.tasks), (1, 1, 1));
    assert_eq!(collected.receipts, 3, "both old receipts and the live one");
    // The inbox records: the live message's, and the old receipts' records
    // (which expired with them) when the inbox pass reached them first.
    assert!(collected.inbox >= 1);
    assert_eq!(wide.collect_once().await.unwrap(), Collected::default());
    let github = Subscriber::new("webhook:github").unwrap();
    let d = MessageId::new("d-a").unwrap();
    assert!(
        !store.seen(&github, &d).await.unwrap(),
        "gone with its receipt"
    );
}

/// Starts the run of key `key`, and finishes it (expiring one hour later)
/// unless `live`, in which case it stays running.
async fn run_of<S: RunStore>(store: &S, clock: &ManualClock, key: &str, live: bool) -> RunId {
    let now = idemkit::Clock::now_ms(clock);
    let namespace = store.namespace().await.unwrap();
    let engine = Engine::with_clock(store.clone(), clock.clone());
    let op = Operation::new("orders.create").unwrap();
    let scope = Scope::new(
        Tenant::new("acme").unwrap(),
        op.clone(),
        IdempotencyKey::new(key).unwrap(),
    );
    let fp = FingerprintSpec::default().fingerprint(&RequestParts {
        method: "POST",
        operation: &op,
        target: "/orders",
        json: false,
        body: b"",
    });
    let idemkit::Begun::Fresh(mut claimed) =
        engine.begin(&scope, &fp, &Policy::default()).await.unwrap()
    else {
        panic!("a new key is claimed");
    };
    let id = RunId::of(&namespace, &scope);
    let fence = S::create_run(
        &mut claimed.tx,
        &NewRun {
            id: &id,
            scope: &scope,
            input: b"",
            holder: "exec",
            locked_until_ms: now + 1000,
            deadline_ms: now + 1000,
            ttl_ms: 3_600_000,
            now_ms: now,
        },
    )
    .await
    .unwrap();
    let lease = Lease {
        run: id.clone(),
        holder: "exec".into(),
        fence,
    };
    let message = format!("m-{key}");
    S::claim_message(
        &mut claimed.tx,
        &MessageClaim {
            message_id: &message,
            run: &id,
            step: "mail",
            now_ms: now,
            expires_at_ms: now + 3_600_000,
        },
    )
    .await
    .unwrap();
    if live {
        store.commit(claimed.tx).await.unwrap();
        return id;
    }
    let end = RunChange {
        state: Some(RunState::Completed),
        expires_at_ms: Some(now + 3_600_000),
        message: Some((&message, MessageState::Sent)),
        ..RunChange::default()
    };
    assert!(
        S::record_run_in(&mut claimed.tx, &lease, &end, None, now)
            .await
            .unwrap()
    );
    let response = StoredResponse {
        status: 201,
        headers: vec![],
        body: b"{}".to_vec(),
    };
    let finished = engine
        .finish(claimed, &Completion::completed(response))
        .await
        .unwrap();
    assert!(
        matches!(finished, idemkit::Finished::Committed),
        "{finished:?}"
    );
    id
}

/// Final runs go with their key records (their steps with them); live runs
/// stay whatever their age, and so do their keys; ledger entries go after
/// their retention.
async fn purges_final_runs_and_the_ledger<S>(store: S)
where
    S: InboxStore + OutboxStore + OutboxWriter + WebhookStore + RunStore + TaskStore,
{
    let clock = ManualClock::new(1_000_000_000_000);
    let done = run_of(&store, &clock, "r-done", false).await;
    let live = run_of(&store, &clock, "r-live", true).await;
    clock.advance(2 * HOUR);
    let collector =
        Collector::with_clock(store.clone(), CollectorConfig::default(), clock.clone()).unwrap();
    let c = collector.collect_once().await.unwrap();
    assert_eq!(
        (c.keys, c.runs, c.messages),
        (1, 1, 2),
        "the final run and its key; both ledger entries"
    );
    assert!(store.load_run(&done).await.unwrap().is_none());
    assert!(
        store.load_run(&live).await.unwrap().is_some(),
        "a live run stays"
    );
    clock.advance(400 * 24 * HOUR);
    let c = collector.collect_once().await.unwrap();
    assert_eq!(
        (c.keys, c.runs),
        (0, 0),
        "nor does its key record ever expire"
    );
}

/// `run` collects at once and stops promptly at shutdown.
async fn runs_until_shutdown<S>(store: S)
where
    S: InboxStore + OutboxStore + OutboxWriter + WebhookStore + RunStore + TaskStore,
{
    let clock = ManualClock::new(1_000_000_000_000);
    seed(&store, &clock, "a").await;
    clock.advance(3 * HOUR);
    let collector =
        Collector::with_clock(store.clone(), CollectorConfig::default(), clock.clone()).unwrap();
    let started = std::time::Instant::now();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(async move {
        collector
            .run(HOUR, async {
                let _ = stopped.await;
            })
            .await;
    });
    // The first run happens at once: wait for it to have deleted the key.
    let engine = Engine::with_clock(store.clone(), clock.clone());
    let scope = Scope::new(
        Tenant::new("acme").unwrap(),
        Operation::new("orders.create").unwrap(),
        IdempotencyKey::new("k-a").unwrap(),
    );
    while engine.store().fetch(&scope).await.unwrap().is_some() {
        assert!(started.elapsed() < Duration::from_secs(10), "no first run");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("prompt shutdown")
        .unwrap();
}

#[test]
fn a_bad_config_is_refused() {
    let e = CollectorConfig {
        batch_size: 0,
        ..CollectorConfig::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "CollectorConfig.batch_size must be between 1 and 100000, got 0"
    );
}

mod sqlite {
    use idem_testkit::TempDir;
    use idemkit::sqlite::{SqliteConfig, SqliteStore};

    async fn store(dir: &TempDir) -> SqliteStore {
        let store = SqliteStore::connect(&dir.sqlite_url(), SqliteConfig::default())
            .await
            .unwrap();
        store.migrate().await.unwrap();
        store
    }

    #[tokio::test]
    async fn purges_each_kind_in_bounded_batches() {
        let dir = TempDir::new("collector-it");
        super::purges_each_kind_in_bounded_batches(store(&dir).await).await;
    }

    #[tokio::test]
    async fn runs_until_shutdown() {
        let dir = TempDir::new("collector-it");
        super::runs_until_shutdown(store(&dir).await).await;
    }

    #[tokio::test]
    async fn purges_final_runs_and_the_ledger() {
        let dir = TempDir::new("collector-it");
        super::purges_final_runs_and_the_ledger(store(&dir).await).await;
    }
}

mod postgres {
    use idem_postgres::{PgConfig, PgStore};
    use idem_testkit::PgDatabase;

    async fn store(db: &PgDatabase) -> PgStore {
        let store = PgStore::connect(&db.url, PgConfig::default())
            .await
            .unwrap();
        store.migrate().await.unwrap();
        store
    }

    #[tokio::test]
    async fn purges_each_kind_in_bounded_batches() {
        let db = PgDatabase::create("idem_collector_it").await;
        super::purges_each_kind_in_bounded_batches(store(&db).await).await;
    }

    #[tokio::test]
    async fn runs_until_shutdown() {
        let db = PgDatabase::create("idem_collector_it").await;
        super::runs_until_shutdown(store(&db).await).await;
    }

    #[tokio::test]
    async fn purges_final_runs_and_the_ledger() {
        let db = PgDatabase::create("idem_collector_it").await;
        super::purges_final_runs_and_the_ledger(store(&db).await).await;
    }
}
