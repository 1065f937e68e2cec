//! Integration tests of `idem-steps` on real SQLite files and a real
//! PostgreSQL server, one fresh database per test.
#![allow(clippy::unwrap_used, missing_docs)]

mod compensate;
mod http;
mod steps;
mod support;

use support::TestStore;

macro_rules! on_both {
    ($($module:ident :: $name:ident;)*) => {
        mod sqlite {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let db = <idem_sqlite::SqliteStore as TestStore>::db().await;
                    crate::$module::$name::<idem_sqlite::SqliteStore>(db).await;
                }
            )*
        }
        mod postgres {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let db = <idem_postgres::PgStore as TestStore>::db().await;
                    crate::$module::$name::<idem_postgres::PgStore>(db).await;
                }
            )*
        }
    };
}

on_both! {
    steps::a_run_finishes_and_replays;
    steps::recorded_steps_are_not_run_again_on_resume;
    steps::a_crash_after_the_call_resumes_with_the_same_key;
    steps::a_zombie_is_fenced_out;
    steps::compensations_run_newest_first_once;
    steps::a_crash_during_compensation_resumes_without_repeating;
    steps::past_its_deadline_a_run_compensates;
    steps::a_call_that_never_happened_is_not_compensated;
    steps::retries_are_bounded_across_executors;
    steps::a_step_that_keeps_crashing_waits_for_an_operator;
    steps::a_successor_keeps_the_backoff;
    steps::past_the_point_of_no_return_a_failure_waits_for_an_operator;
    steps::an_unknown_at_most_once_effect_waits_for_an_operator;
    steps::verify_then_send_asks_before_sending_again;
    steps::the_send_once_ledger_spans_runs;
    steps::concurrent_executors_never_run_one_run_at_once;
    compensate::a_lookup_that_finds_the_effect_undoes_it;
    compensate::not_found_after_the_landing_window_is_nothing_to_undo;
    compensate::not_found_before_the_landing_window_is_not_trusted;
    compensate::a_failing_lookup_waits_for_an_operator;
    compensate::without_a_lookup_an_unknown_outcome_waits_for_an_operator;
    compensate::a_crash_between_the_lookup_and_the_undo_does_not_look_again;
    http::the_key_contract_holds_for_runs;
    http::a_slow_run_is_accepted_then_replayed;
    http::a_blocked_run_answers_needs_attention;
    http::no_slot_no_run;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_database_stops_the_run_until_it_returns_on_postgres() {
    let db = <idem_postgres::PgStore as TestStore>::db().await;
    steps::a_lost_database_stops_the_run_until_it_returns(db).await;
}
