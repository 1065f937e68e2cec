//! The idempotent write patterns ([`PatternExec`]) on a real table.

use idem_core::steps::RunStore;
use idem_sql::patterns::PatternExec;

/// The idempotent write patterns on a real table: an absolute upsert
/// repeated changes nothing; a versioned update applies once per version
/// read; a transition tells moved, already there, illegal and missing apart,
/// and of concurrent identical transitions exactly one moves.
pub async fn patterns_hold_on_a_real_table<S>(store: S)
where
    S: RunStore<Tx: PatternExec>,
{
    use idem_sql::patterns::{StateMachine, Transition, Upsert, Value, Versioned, VersionedUpdate};
    let mut tx = store.begin().await.unwrap();
    tx.execute(
        "CREATE TABLE pat (tenant_id TEXT NOT NULL, id TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending', \
         n BIGINT NOT NULL, version BIGINT NOT NULL DEFAULT 1, PRIMARY KEY (tenant_id, id))",
        &[],
    )
    .await
    .unwrap();
    store.commit(tx).await.unwrap();
    let key = [Value::Text("t1"), Value::Text("a")];
    let upsert = Upsert::new("pat", &["tenant_id", "id"], &["n"])
        .unwrap()
        .bumping("version")
        .unwrap();
    let versioned = Versioned::new("pat", &["tenant_id", "id"], "version").unwrap();
    let read = |sql: &'static str| {
        let store = store.clone();
        async move {
            let mut tx = store.begin().await.unwrap();
            let v = tx
                .fetch_int(sql, &[Value::Text("t1"), Value::Text("a")])
                .await
                .unwrap();
            store.rollback(tx).await.unwrap();
            v
        }
    };
    for _ in 0..2 {
        let mut tx = store.begin().await.unwrap();
        upsert.write(&mut tx, &key, &[Value::Int(5)]).await.unwrap();
        store.commit(tx).await.unwrap();
    }
    assert_eq!(
        read("SELECT n FROM pat WHERE tenant_id = $1 AND id = $2").await,
        Some(5),
        "absolute: 5, not 10"
    );
    assert_eq!(
        read("SELECT version FROM pat WHERE tenant_id = $1 AND id = $2").await,
        Some(2),
        "the overwrite bumped it"
    );

    let mut tx = store.begin().await.unwrap();
    let first = versioned
        .update(&mut tx, &key, 2, &[("n", Value::Int(9))])
        .await
        .unwrap();
    let again = versioned
        .update(&mut tx, &key, 2, &[("n", Value::Int(11))])
        .await
        .unwrap();
    let missing = versioned
        .update(
            &mut tx,
            &[Value::Text("t1"), Value::Text("zz")],
            1,
            &[("n", Value::Int(1))],
        )
        .await
        .unwrap();
    store.commit(tx).await.unwrap();
    assert_eq!(first, VersionedUpdate::Updated { version: 3 });
    assert_eq!(
        again,
        VersionedUpdate::Stale { current: 3 },
        "a repeat from the old read changes nothing"
    );
    assert_eq!(missing, VersionedUpdate::Missing);
    assert_eq!(
        read("SELECT n FROM pat WHERE tenant_id = $1 AND id = $2").await,
        Some(9)
    );

    let machine = StateMachine::new("pat", &["tenant_id", "id"], "status")
        .unwrap()
        .allow("pending", &["confirmed", "failed"]);
    let moved = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let (store, machine, moved) = (store.clone(), machine.clone(), moved.clone());
        tasks.push(tokio::spawn(async move {
            let mut tx = store.begin().await.unwrap();
            let t = machine
                .transition(
                    &mut tx,
                    &[Value::Text("t1"), Value::Text("a")],
                    "confirmed",
                    &[("n", Value::Int(42))],
                )
                .await
                .unwrap();
            store.commit(tx).await.unwrap();
            match t {
                Transition::Moved => {
                    moved.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                Transition::AlreadyThere => {}
                other => panic!("a concurrent identical transition: {other:?}"),
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        moved.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "exactly one moved"
    );
    let mut tx = store.begin().await.unwrap();
    let illegal = machine
        .transition(&mut tx, &key, "failed", &[])
        .await
        .unwrap();
    let gone = machine
        .transition(
            &mut tx,
            &[Value::Text("t1"), Value::Text("zz")],
            "confirmed",
            &[],
        )
        .await
        .unwrap();
    store.commit(tx).await.unwrap();
    assert_eq!(
        illegal,
        Transition::Illegal {
            current: "confirmed".into()
        }
    );
    assert_eq!(gone, Transition::Missing);
    assert_eq!(
        read("SELECT n FROM pat WHERE tenant_id = $1 AND id = $2").await,
        Some(42),
        "set with the move"
    );
}

/// A pattern's read that asks a column for the wrong type is the caller's
/// SQL refused ([`StoreError::Database`](idem_core::StoreError::Database)),
/// never reported as a corrupt record of Idem's.
pub async fn a_pattern_read_of_the_wrong_type_is_a_database_error<S>(store: S)
where
    S: RunStore<Tx: PatternExec>,
{
    use idem_core::StoreError;
    use idem_sql::patterns::Value;
    let mut tx = store.begin().await.unwrap();
    let as_int = tx
        .fetch_int("SELECT $1", &[Value::Text("not a number")])
        .await;
    store.rollback(tx).await.unwrap();
    assert!(
        matches!(as_int, Err(StoreError::Database { .. })),
        "text read as an integer: {as_int:?}"
    );
    let mut tx = store.begin().await.unwrap();
    let as_text = tx.fetch_text("SELECT 1 + $1", &[Value::Int(1)]).await;
    store.rollback(tx).await.unwrap();
    assert!(
        matches!(as_text, Err(StoreError::Database { .. })),
        "an integer read as text: {as_text:?}"
    );
}
