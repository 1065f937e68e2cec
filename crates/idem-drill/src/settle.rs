//! Counting again after the run: a target that answers at once and makes
//! its duplicate later (a job queued by a replay, a webhook fired twice)
//! looks right when the effects are counted just after the last answer.
//! After `--settle`, every case counted during the run is counted again;
//! one that grew turns its drill (and round) into a FAIL.

use super::error::SendError;
use super::report::{DrillResult, Outcome};
use super::{Evidence, Runner, Stop, effects_text};

/// One case counted during the run: the last count of its `{unique}`.
pub(super) struct Counted {
    drill: usize,
    unique: String,
    effects: u64,
}

impl Runner {
    /// Keeps the last count of `unique`, for the drill running.
    pub(super) fn record(&self, unique: &str, effects: u64) {
        let drill = self.current.load(std::sync::atomic::Ordering::SeqCst);
        let Ok(mut counted) = self.counted.lock() else {
            return;
        };
        match counted.iter_mut().find(|c| c.unique == unique) {
            Some(c) => c.effects = effects,
            None => counted.push(Counted {
                drill,
                unique: unique.to_owned(),
                effects,
            }),
        }
    }

    /// Waits `--settle`, counts every case again and fails the drills
    /// whose count grew. What it did, in one line (`None` when off).
    pub(super) async fn settle(&self, drills: &mut [DrillResult]) -> Option<String> {
        let wait = self.config.settle;
        let counted = std::mem::take(&mut *self.counted.lock().ok()?);
        if wait.is_zero() || counted.is_empty() {
            return None;
        }
        tokio::time::sleep(wait).await;
        let (mut again, mut grew) = (0, 0);
        for c in &counted {
            let mut ev = Evidence::default();
            let n = match self.effects(&c.unique, &mut ev).await {
                Ok(n) => n,
                Err(Stop::Send(SendError::Budget)) => {
                    return Some(format!(
                        "after {}: {again} of {} cases counted again before the request budget ran out, {grew} grew",
                        idem_core::duration_text(wait),
                        counted.len()
                    ));
                }
                Err(_) => continue,
            };
            again += 1;
            if n > c.effects
                && let Some(d) = drills.get_mut(c.drill)
            {
                grew += 1;
                late(d, c, n);
            }
        }
        Some(format!(
            "after {} (--settle): {again} of {} cases counted again, {grew} grew{}",
            idem_core::duration_text(wait),
            counted.len(),
            if grew > 0 {
                " — effects made after the answers"
            } else {
                ""
            }
        ))
    }
}

/// Drill `d` fails: case `c` had `n` effects once the target settled.
fn late(d: &mut DrillResult, c: &Counted, n: u64) {
    let what = format!(
        "{} → {} for {} after the answers: a duplicate made late",
        effects_text(c.effects),
        effects_text(n),
        c.unique
    );
    d.evidence.push(format!("counted again: {what}"));
    if d.outcome != Outcome::Fail {
        d.summary = format!("{what} (was: {} {})", d.outcome.label(), d.summary);
        d.outcome = Outcome::Fail;
    }
    d.effects = Some(d.effects.unwrap_or(0).max(n));
    if let Some(rounds) = &mut d.rounds
        && let Some(r) = rounds.each.iter_mut().find(|r| r.unique == c.unique)
    {
        if r.outcome == Outcome::Warn {
            rounds.warned -= 1;
        }
        if r.outcome != Outcome::Fail {
            rounds.failed += 1;
        }
        r.outcome = Outcome::Fail;
        r.effects = Some(n);
        r.summary = what;
    }
}
