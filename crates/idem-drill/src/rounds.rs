//! Rounds: every contract drill runs `--rounds` times, each round with a
//! fresh key and a fresh `{unique}`, and every request of a round on a new
//! connection ([`Client::send`](super::client::Client::send) opens one per
//! request), as a client retrying after a failure sends it. One sample
//! passes by luck: a GET-then-SET race won once, or a retry that happened
//! to meet the worker process holding the key when each worker keeps its
//! own store (the kernel or a balancer hands each new connection to one of
//! them). The worst round decides; the report says how many rounds the
//! verdict rests on, how many failed, and shows the worst in detail.

use super::error::SendError;
use super::races::GIVE_UP;
use super::report::{Outcome, Round, Rounds};
use super::{Evidence, Runner, Stop, Verdict, effects_text};

/// The drills run in rounds: every one whose verdict can be a contract
/// FAIL, but `baseline` (the settings' check, once).
pub(super) const IN_ROUNDS: &[&str] = &[
    "lost-response",
    "abandoned-request",
    "concurrency",
    "key-reuse",
    "reordered-fields",
    "missing-key",
    "empty-key",
    "long-key",
    "control-key",
    "duplicate-key",
    "replay-after-mutation",
];

impl Runner {
    /// One round of drill `name`, case `case`.
    async fn round(&self, name: &'static str, case: &str, ev: &mut Evidence) -> Verdict {
        match name {
            "lost-response" => self.lost_response(case, None, ev).await,
            "abandoned-request" => self.lost_response(case, Some(GIVE_UP), ev).await,
            "concurrency" => self.concurrency(case, ev).await,
            "key-reuse" => self.key_reuse(case, ev).await,
            "reordered-fields" => self.reordered(case, ev).await,
            "replay-after-mutation" => self.after_mutation(case, ev).await,
            "missing-key" => self.missing_key(case, ev).await,
            _ => self.bad_key(name, case, ev).await,
        }
    }

    /// Why drill `name` cannot run at all with these settings, if so.
    fn cannot_run(&self, name: &str) -> Option<&'static str> {
        let fields = self.fields(&self.unique(name));
        match name {
            "key-reuse" if fields.is_none() => Some("needs a --body that is a JSON object"),
            "reordered-fields" if fields.and_then(|f| f.reversed()).is_none() => {
                Some("needs a --body that is a JSON object with two fields or more")
            }
            "replay-after-mutation" if self.config.mutate.is_none() => Some("needs --mutate"),
            _ => None,
        }
    }

    /// Runs drill `name` `--rounds` times; the worst round decides, its
    /// evidence is kept.
    pub(super) async fn rounds(&self, name: &'static str, ev: &mut Evidence) -> Verdict {
        if let Some(why) = self.cannot_run(name) {
            return Ok((Outcome::Skip, why.into()));
        }
        let total = self.config.rounds;
        let mut each = Vec::new();
        let mut worst: Option<(usize, Outcome, String, Evidence)> = None;
        let mut budget_out = false;
        for i in 1..=total {
            let case = format!("{name}-{i}");
            let mut round = Evidence::default();
            let (outcome, summary) = match self.round(name, &case, &mut round).await {
                Ok(v) => v,
                // The rounds already run still count: a failed one is not
                // hidden by the budget running out after it.
                Err(Stop::Send(SendError::Budget)) if !each.is_empty() => {
                    budget_out = true;
                    break;
                }
                Err(e) => return Err(e),
            };
            each.push(Round {
                unique: self.unique(&case),
                outcome,
                summary: summary.clone(),
                effects: round.effects,
            });
            if worst
                .as_ref()
                .is_none_or(|(_, o, _, _)| outcome.severity() > o.severity())
            {
                worst = Some((each.len(), outcome, summary, round));
            }
        }
        let run = each.len() as u32;
        if budget_out {
            self.budget_out
                .store(true, std::sync::atomic::Ordering::SeqCst);
            ev.note(format!(
                "the request budget (--max-requests) ran out after {run} of {total} rounds"
            ));
        }
        let count = |o: Outcome| each.iter().filter(|r| r.outcome == o).count() as u32;
        let (failed, warned, passed) = (
            count(Outcome::Fail),
            count(Outcome::Warn),
            count(Outcome::Pass),
        );
        for (i, r) in each.iter().enumerate() {
            ev.note(format!(
                "round {}: {} — {}{}",
                i + 1,
                r.outcome.label(),
                r.summary,
                r.effects
                    .filter(|_| !r.summary.contains("effect"))
                    .map(|n| format!(" ({})", effects_text(n)))
                    .unwrap_or_default()
            ));
        }
        let Some((at, outcome, summary, round)) = worst else {
            return Ok((Outcome::Skip, "no round was run".into()));
        };
        ev.note(format!("round {at} in detail:"));
        for line in round.lines {
            ev.note(format!("  {line}"));
        }
        ev.effects = round.effects;
        let tally = match outcome {
            Outcome::Fail => format!("{failed} of {run} rounds failed"),
            Outcome::Warn => format!("{warned} of {run} rounds warned, none failed"),
            Outcome::Pass if passed == 1 && run == 1 => "the 1 round held".to_owned(),
            Outcome::Pass if passed == run => format!("all {run} rounds held"),
            Outcome::Pass => format!(
                "{passed} of {run} rounds held, {} could not run or were informational",
                run - passed
            ),
            _ if run == 1 => "1 round".to_owned(),
            _ => format!("{run} rounds"),
        };
        let tally = if budget_out {
            format!("{tally}; only {run} of {total} rounds: the budget ran out")
        } else {
            tally
        };
        // Fewer rounds than asked is no PASS: the verdict rests on too few.
        let outcome = match outcome {
            Outcome::Pass if budget_out => Outcome::Skip,
            o => o,
        };
        ev.rounds = Some(Rounds {
            run,
            failed,
            warned,
            each,
        });
        Ok((outcome, format!("{summary} ({tally})")))
    }
}
