//! Asked once (issue 36): an action of a task is told `go` once per
//! claim's fence, whoever asks — again only to the exact replay of that ask.

use idem_core::tasks::{
    ActionClaim, ActionDecision, ActionMode, ActionOutcome, TaskState, TaskStore,
};

use crate::tasks::{T0, action, action_as, claim, create, decision, report, report_as};

/// Asked once (issue 36): under a fence that was told `go`, only the exact
/// replay of that ask (its key, its mode) is told `go` again; another key,
/// or none — a restarted process holding the replayed claim — is told
/// `unknown`: in verify mode its report is accepted, in at-most-once mode
/// the task needs an operator. The same key with another mode is refused,
/// nothing written. A `not-sent` report by the ask told `go` (its key)
/// frees the action: the next ask, whichever, is told `go` — and it alone;
/// from any other ask of the fence (it may have looked before the one told
/// `go` acted) it is refused, nothing written.
pub async fn an_action_goes_once_per_fence_whoever_asks<S: TaskStore>(store: S) {
    use ActionDecision::{Done, Go, Unknown};
    use ActionMode::{AtMostOnce, Verify};
    let (task, _) = create(&store, "once", "{}", 0).await;
    let f = claim(&store, "w1", 1, T0).await.remove(0).fence;
    let first = action_as(&store, &task, f, Verify, T0, "w1:a:ask:1").await;
    assert_eq!(decision(&first), Go);
    assert_eq!(
        decision(&action_as(&store, &task, f, Verify, T0 + 1, "w1:a:ask:1").await),
        Go,
        "the exact replay of the ask told go (its answer was lost)"
    );
    assert_eq!(
        decision(&action_as(&store, &task, f, Verify, T0 + 2, "w1:b:ask:1").await),
        Unknown,
        "another key under the fence that was told go: a restarted process"
    );
    assert_eq!(
        decision(&action(&store, &task, f, Verify, T0 + 3).await),
        Unknown,
        "no key: never a replay"
    );
    let reused = action_as(&store, &task, f, AtMostOnce, T0 + 4, "w1:a:ask:1").await;
    assert!(
        matches!(&reused, ActionClaim::KeyReused(t) if t.state == TaskState::Claimed),
        "the same key with another body is refused: {reused:?}"
    );
    assert_eq!(
        decision(&action_as(&store, &task, f, Verify, T0 + 5, "w1:a:ask:1").await),
        Go,
        "the refusal changed nothing"
    );
    // The restarted process checked the other system: its report counts.
    assert_eq!(
        decision(&report(&store, &task, f, ActionOutcome::Done, T0 + 6).await),
        Done
    );
    assert_eq!(
        decision(&action_as(&store, &task, f, Verify, T0 + 7, "w1:a:ask:1").await),
        Done,
        "done is done, for the ask told go too"
    );

    // At-most-once: another ask under the fence parks the task.
    let (amo, _) = create(&store, "once-amo", "{}", 0).await;
    let g = claim(&store, "w1", 1, T0).await.remove(0);
    assert_eq!(g.id, amo.id);
    assert_eq!(
        decision(&action(&store, &amo, g.fence, AtMostOnce, T0).await),
        Go
    );
    let parked = action(&store, &amo, g.fence, AtMostOnce, T0 + 1).await;
    let ActionClaim::Decided(Unknown, parked) = parked else {
        panic!("a second keyless ask under the fence: {parked:?}")
    };
    assert_eq!(
        (parked.state, parked.holder),
        (TaskState::NeedsAttention, None)
    );

    // A not-sent report frees the action for the next ask, and it alone.
    let (freed, _) = create(&store, "once-freed", "{}", 0).await;
    let h = claim(&store, "w1", 1, T0).await.remove(0);
    assert_eq!(h.id, freed.id);
    let ask_a = |now| action_as(&store, &freed, h.fence, Verify, now, "w1:a:ask:9");
    let ask_b = |now| action_as(&store, &freed, h.fence, Verify, now, "w1:b:ask:9");
    assert_eq!(decision(&ask_a(T0).await), Go);
    assert_eq!(decision(&ask_b(T0 + 1).await), Unknown);
    let report_by =
        |by: &'static str, outcome, now| report_as(&store, &freed, h.fence, outcome, now, by);
    for refused in [
        report_by("w1:b:ask:9", ActionOutcome::NotSent, T0 + 2).await,
        report(&store, &freed, h.fence, ActionOutcome::NotSent, T0 + 2).await,
    ] {
        assert!(
            matches!(refused, ActionClaim::InFlight(ref t) if t.state == TaskState::Claimed),
            "not-sent from an ask not told go, while the one told go may send: {refused:?}"
        );
    }
    assert_eq!(
        decision(&ask_a(T0 + 2).await),
        Go,
        "refused reports changed nothing"
    );
    let not_sent = report_by("w1:a:ask:9", ActionOutcome::NotSent, T0 + 2).await;
    assert_eq!(
        decision(&not_sent),
        ActionDecision::Ask,
        "a report is no go"
    );
    let again = report(&store, &freed, h.fence, ActionOutcome::NotSent, T0 + 3).await;
    assert_eq!(decision(&again), ActionDecision::Ask, "repeated: the same");
    assert_eq!(decision(&ask_b(T0 + 4).await), Go, "the next ask");
    assert_eq!(decision(&ask_a(T0 + 5).await), Unknown, "and it alone");
    assert_eq!(decision(&ask_b(T0 + 6).await), Go, "its replay");
    assert_eq!(
        decision(&report(&store, &freed, h.fence, ActionOutcome::Done, T0 + 7).await),
        Done
    );

    // Done is recorded whatever came before: a worker that sent after its
    // not-sent report (without asking) and says so leaves nothing to send.
    let (late, _) = create(&store, "once-late", "{}", 0).await;
    let l = claim(&store, "w1", 1, T0).await.remove(0);
    assert_eq!(l.id, late.id);
    let go = action_as(&store, &late, l.fence, Verify, T0, "w1:a:ask:8").await;
    assert_eq!(decision(&go), Go);
    let free = report_as(
        &store,
        &late,
        l.fence,
        ActionOutcome::NotSent,
        T0 + 1,
        "w1:a:ask:8",
    )
    .await;
    assert_eq!(decision(&free), ActionDecision::Ask);
    let sent = report(&store, &late, l.fence, ActionOutcome::Done, T0 + 2).await;
    assert_eq!(decision(&sent), Done);
    assert_eq!(
        decision(&action_as(&store, &late, l.fence, Verify, T0 + 3, "w1:b:ask:8").await),
        Done,
        "recorded: no ask is told go"
    );
}
