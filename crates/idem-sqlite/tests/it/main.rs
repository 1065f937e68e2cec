//! Integration tests on real SQLite files, one fresh file per test.
#![allow(clippy::unwrap_used, missing_docs)]

use idem_conformance as c;
use idem_core::{BoxError, BoxFuture};
use idem_sqlite::{SqliteConfig, SqliteStore, SqliteTx};
use idem_testkit::TempDir;

mod writer;

struct TestDb {
    _dir: TempDir,
    store: SqliteStore,
}

async fn db() -> TestDb {
    let dir = TempDir::new("sqlite-it");
    let store = SqliteStore::connect(&dir.sqlite_url(), SqliteConfig::default())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap(); // migrations are idempotent
    sqlx::raw_sql("CREATE TABLE payments (id TEXT PRIMARY KEY, amount INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    TestDb { _dir: dir, store }
}

fn insert<'t>(tx: &'t mut SqliteTx, id: &'static str) -> BoxFuture<'t, Result<(), BoxError>> {
    Box::pin(async move {
        sqlx::query("INSERT INTO payments (id, amount) VALUES ($1, 5)")
            .bind(id)
            .execute(&mut **tx)
            .await?;
        Ok(())
    })
}

/// Removes the key record `key` under the claim (the record is no longer
/// pending when Idem stores the outcome).
fn forget<'t>(tx: &'t mut SqliteTx, key: &'static str) -> BoxFuture<'t, Result<(), BoxError>> {
    Box::pin(async move {
        sqlx::query("DELETE FROM idem_keys WHERE idempotency_key = $1")
            .bind(key)
            .execute(&mut **tx)
            .await?;
        Ok(())
    })
}

fn enqueue<'t>(
    tx: &'t mut SqliteTx,
    message: &'t idem_core::outbox::OutboxMessage,
    now_ms: i64,
) -> BoxFuture<'t, Result<i64, idem_core::StoreError>> {
    Box::pin(idem_sqlite::outbox::enqueue(tx, message, now_ms))
}

fn count(store: &SqliteStore) -> BoxFuture<'_, i64> {
    Box::pin(async move {
        sqlx::query_scalar("SELECT count(*) FROM payments")
            .fetch_one(store.pool())
            .await
            .unwrap()
    })
}

macro_rules! conformance {
    ($($name:ident $(, $arg:expr)*;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let db = db().await;
            c::$name(db.store.clone() $(, $arg)*).await;
        }
    )*};
}

conformance! {
    replay_and_mismatch;
    failed_outcome_is_replayed;
    rollback_leaves_no_record;
    tenants_are_isolated;
    concurrent_claims_execute_once, 50;
    wait_is_bounded;
    expiry_and_gc;
    concurrent_takeover_of_expired_record_executes_once, 20;
    business_write_commits_with_the_key, insert, count;
    values_in_the_key_messages_round_trip_exactly;
    a_dropped_key_transaction_rolls_back, insert, count;
    a_record_no_longer_pending_commits_nothing, insert, forget, count;
    large_answers_are_stored_exactly, insert, forget, count;
    optimistic_race_commits_one_outcome, insert, count, 16;
    optimistic_losers_failing_on_the_winners_effect_replay_it, insert, count, 8;
    optimistic_claims_replay_mismatch_and_expire, insert, count;
    replays_are_answered_without_a_transaction;
    outbox_commits_with_the_transaction, enqueue;
    outbox_keeps_order_per_key, enqueue;
    outbox_leases_expire_and_release, enqueue;
    outbox_failures_back_off_then_die, enqueue;
    outbox_delays_and_purges, enqueue;
    inbox_records_once_per_subscriber;
    inbox_concurrent_duplicate_waits_then_skips;
    inbox_gc_deletes_expired_records;
    positions_commit_with_the_transaction_and_never_move_back;
    webhook_receipts_are_stored_once;
    webhook_claims_keep_entity_order;
    webhook_failures_replay_and_gc;
    webhook_content_dedupe;
    cancelled_calls_leave_connections_clean;
    the_namespace_is_drawn_once;
    leased_claims_commit_and_only_the_holder_writes;
    a_released_lease_frees_the_key;
    a_holder_ends_its_lease_when_the_outcome_is_unknown;
    an_abandoned_lease_is_taken_over_by_one, 20;
    operators_resolve_only_abandoned_leases;
    leased_and_transactional_claims_share_keys;
    an_expired_leased_record_is_claimed_afresh;
    a_pending_unknown_is_held_from_its_claim;
    runs_are_created_with_their_key;
    fenced_writes_land_only_with_the_current_fence;
    takeover_needs_an_expired_lease;
    claims_of_due_runs_are_never_shared, 40;
    final_runs_expire_with_their_key;
    send_once_ledger_holds_one_sender;
    tasks_are_created_once_per_key;
    cursors_move_only_from_where_they_are;
    claims_are_fenced_and_taken_over_after_the_lease;
    only_the_live_holder_settles;
    actions_happen_once;
    an_action_goes_once_per_fence_whoever_asks;
    operators_steer_what_workers_cannot;
    concurrent_claims_never_share_a_task, 8;
    runs_are_listed_by_state;
    runs_are_counted_by_state;
    webhook_receipts_are_counted_by_endpoint_and_state;
    admin_key_pages_and_literal_prefixes;
    admin_release_only_stuck_leased_records;
    admin_outbox_pages_and_requeue, enqueue;
    admin_audit_rows_commit_with_their_transaction;
    admin_runs_receipts_and_inbox;
    patterns_hold_on_a_real_table;
    a_pattern_read_of_the_wrong_type_is_a_database_error;
}

#[tokio::test]
async fn in_memory_databases_are_refused() {
    for url in ["sqlite::memory:", "sqlite://file?mode=memory"] {
        let err = SqliteStore::connect(url, SqliteConfig::default())
            .await
            .unwrap_err();
        let source = std::error::Error::source(&err).unwrap().to_string();
        assert!(source.contains("not durable"), "{url}: {source}");
    }
}
