//! The send-once ledger of a [`RunStore`]: one sender per message id,
//! sent stays sent, retention.

use idem_core::steps::{MessageClaim, MessageState, RunChange, RunId, RunStore, SentMessage};

use crate::runs::{T0, start};
use crate::support::scope;

/// The send-once ledger: a message id is claimed by one run at a time; its
/// own run may attempt it again; a sent message stays sent for everyone; a
/// not-sent one is anyone's; entries are purged after their retention.
pub async fn send_once_ledger_holds_one_sender<S: RunStore>(store: S) {
    let a = start(&store, &scope("t1", "ledger-a"), "exec-a", T0).await;
    let b = start(&store, &scope("t1", "ledger-b"), "exec-b", T0).await;
    let first = claim(&store, "confirm-ord_1", &a.run, T0).await;
    assert_eq!((first.state, first.attempts), (MessageState::Sending, 1));
    assert_eq!(first.run_id, a.run.as_str());

    let theirs = claim(&store, "confirm-ord_1", &b.run, T0 + 1).await;
    assert_eq!(
        (theirs.run_id.as_str(), theirs.state, theirs.attempts),
        (a.run.as_str(), MessageState::Sending, 1),
        "another run's claim finds the first run's attempt and changes nothing"
    );
    let again = claim(&store, "confirm-ord_1", &a.run, T0 + 2).await;
    assert_eq!(
        (again.state, again.attempts),
        (MessageState::Sending, 2),
        "its own run again"
    );

    // Marked sent with a fenced write of its run; then it is sent for all.
    let sent = RunChange {
        message: Some(("confirm-ord_1", MessageState::Sent)),
        ..RunChange::default()
    };
    assert!(store.record_run(&a, &sent, None, T0 + 3).await.unwrap());
    let row = store.message("confirm-ord_1").await.unwrap().unwrap();
    assert_eq!(
        (row.state, row.sent_at_ms),
        (MessageState::Sent, Some(T0 + 3))
    );
    let after = claim(&store, "confirm-ord_1", &b.run, T0 + 4).await;
    assert_eq!(after.state, MessageState::Sent);

    // Another run cannot mark it; a not-sent entry is anyone's.
    let steal = RunChange {
        message: Some(("confirm-ord_1", MessageState::NotSent)),
        ..RunChange::default()
    };
    assert!(store.record_run(&b, &steal, None, T0 + 5).await.unwrap());
    assert_eq!(
        store.message("confirm-ord_1").await.unwrap().unwrap().state,
        MessageState::Sent,
        "only the holding run marks its message"
    );
    claim(&store, "sms-1", &a.run, T0).await;
    let not_sent = RunChange {
        message: Some(("sms-1", MessageState::NotSent)),
        ..RunChange::default()
    };
    assert!(store.record_run(&a, &not_sent, None, T0 + 6).await.unwrap());
    let taken = claim(&store, "sms-1", &b.run, T0 + 7).await;
    assert_eq!(
        (taken.run_id.as_str(), taken.state, taken.attempts),
        (b.run.as_str(), MessageState::Sending, 2)
    );

    assert_eq!(store.purge_messages(T0, 100).await.unwrap(), 0);
    assert_eq!(store.purge_messages(T0 + 10_000, 100).await.unwrap(), 2);
    assert!(store.message("confirm-ord_1").await.unwrap().is_none());
}

/// Claims `message_id` for `run` in a transaction of its own.
async fn claim<S: RunStore>(store: &S, message_id: &str, run: &RunId, now: i64) -> SentMessage {
    let mut tx = store.begin().await.unwrap();
    let entry = S::claim_message(
        &mut tx,
        &MessageClaim {
            message_id,
            run,
            step: "mail",
            now_ms: now,
            expires_at_ms: now + 1_000,
        },
    )
    .await
    .unwrap();
    store.commit(tx).await.unwrap();
    entry
}
