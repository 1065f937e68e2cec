//! Who was told to perform an action. An action's ledger entry names, as
//! its holder, the claim (task and fence) *and* the ask that was answered
//! `go`, so that the only other `go` under that fence is the exact replay of
//! that ask: the same `Idempotency-Key`, the same body. Any other ask — another
//! key, no key, a restarted process holding a replayed claim — learns that
//! the outcome is unknown.

use sha2::{Digest, Sha256};

use super::records::{ActionDecision, ActionMode};
use crate::steps::MessageState;

/// The ledger holder an ask records when it is answered `go`:
/// `<task>@<fence>#k<digest>.<mode>` for an ask with a key (the digest: the
/// first 128 bits of the key's SHA-256, in hex; the mode: the rest of the
/// ask's body, the fence being in the holder), `<task>@<fence>#n<nonce>` for
/// one without (a fresh random nonce: a keyless ask is never a replay).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AskHolder(String);

impl AskHolder {
    /// The holder of an ask about an action of `task` by the holder of
    /// `fence`, under the key `ask` (`None`: none) in `mode`.
    pub fn new(task: &str, fence: i64, ask: Option<&str>, mode: ActionMode) -> Self {
        Self(match ask {
            Some(key) => {
                let digest = Sha256::digest(key.as_bytes());
                let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
                format!("{task}@{fence}#k{hex}.{}", mode.as_str())
            }
            None => format!("{task}@{fence}#n{}", uuid::Uuid::new_v4().simple()),
        })
    }

    /// As the ledger's `run_id` column keeps it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The part naming the key (`<task>@<fence>#k<digest>`), if it has one.
    fn keyed(holder: &str) -> Option<&str> {
        let (claim, ask) = holder.split_once('#')?;
        let digest = ask.strip_prefix('k')?.split_once('.')?.0;
        Some(&holder[..claim.len() + 2 + digest.len()])
    }
}

/// Whether ledger holder `holder` is claim `fence` of `task`: one of its
/// asks, or the claim itself (an entry written before asks were told
/// apart).
pub fn held_by_claim(holder: &str, task: &str, fence: i64) -> bool {
    let claim = holder.split_once('#').map_or(holder, |(claim, _)| claim);
    claim
        .strip_prefix(task)
        .and_then(|rest| rest.strip_prefix('@'))
        .is_some_and(|f| f == fence.to_string())
}

/// Whether a `not-sent` report by `reporter` (the report's own key, the
/// ask's it reports for) may give back the attempt recorded for ledger
/// holder `holder` by a worker holding `fence` of `task`. An attempt told
/// `go` under this very fence is given back only by the ask told `go` (its
/// key): while that ask's claim lasts it may still be performing the
/// action, so another ask's look at the other system proves nothing. An
/// earlier claim's attempt is another matter (its lease is over): see the
/// ledger's own check.
pub fn may_give_back(holder: &str, task: &str, fence: i64, reporter: Option<&str>) -> bool {
    if !held_by_claim(holder, task, fence) {
        return true;
    }
    let Some(told) = AskHolder::keyed(holder) else {
        // Told go without a key (or before asks were told apart): no
        // report can show it is that ask's.
        return false;
    };
    reporter.is_some_and(|key| {
        let asker = AskHolder::new(task, fence, Some(key), ActionMode::Verify);
        AskHolder::keyed(asker.as_str()) == Some(told)
    })
}

/// What an ask is answered, from its action's ledger entry as the ledger's
/// claim statement left it (`state`, `holder`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AskAnswer {
    /// The decision.
    Decided(ActionDecision),
    /// The ask's key was told `go` under this fence with another body:
    /// refused, nothing written.
    KeyReused,
}

/// Decides ask `ask` from its action's ledger entry: `go` when the entry is
/// this very ask's (its first asking, a not-sent entry it took, or its exact
/// replay), `done` when it was sent, else `unknown` — whoever else was told
/// `go`, under this fence or an earlier one. The same key with another body
/// under the fence that told it `go` is [`AskAnswer::KeyReused`].
pub fn decide_ask(state: MessageState, holder: &str, ask: &AskHolder) -> AskAnswer {
    match state {
        MessageState::Sent => AskAnswer::Decided(ActionDecision::Done),
        MessageState::NotSent => AskAnswer::Decided(ActionDecision::Go),
        MessageState::Sending if holder == ask.as_str() => AskAnswer::Decided(ActionDecision::Go),
        MessageState::Sending
            if AskHolder::keyed(holder).is_some()
                && AskHolder::keyed(holder) == AskHolder::keyed(ask.as_str()) =>
        {
            AskAnswer::KeyReused
        }
        MessageState::Sending => AskAnswer::Decided(ActionDecision::Unknown),
    }
}
