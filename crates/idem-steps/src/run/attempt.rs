//! Attempts and their budgets: the lease checked before a call, the run's
//! deadline, `max_attempts`, backoff (a long wait gives the run back), and
//! the call timeout.

use std::future::Future;
use std::sync::atomic::Ordering;

use idem_core::steps::{Failure, RunChange, RunStore, StepName, StepRecord, StepState};

use super::lease::guarded;
use super::{Mode, Run};
use crate::error::{StepError, Stop};

/// Where retries are bounded by attempts, how many times `max_attempts`
/// attempts may be cut short (a crash, a lost lease) before the run waits for
/// an operator: a step that keeps killing its process does not loop forever.
pub const CUT_SHORT_FACTOR: u32 = 3;
fn jitter() -> f64 {
    (uuid::Uuid::new_v4().as_u128() >> 64) as f64 / u64::MAX as f64
}

impl<S: RunStore> Run<S> {
    /// Refuses to start an external call under a lease that may be gone.
    pub(super) fn ensure_lease(&self) -> Result<(), Stop> {
        // A margin for the call's first bytes: a lease about to end is as
        // good as ended.
        let margin = (self.exec.lease_ms() / 10).min(1_000);
        if *self.lost.borrow()
            || self.now() + margin >= self.beat.locked_until_ms.load(Ordering::SeqCst)
        {
            return Err(Stop::LeaseLost);
        }
        Ok(())
    }

    /// Records an attempt's start and makes it durable before the call.
    pub(super) async fn start_attempt(
        &mut self,
        rec: &StepRecord,
        no_return: bool,
    ) -> Result<(), Stop> {
        self.ensure_lease()?;
        let change = RunChange {
            no_return,
            ..RunChange::default()
        };
        self.write_now(&change, Some(rec)).await
    }

    /// Past the deadline, before the point of no return: the run fails.
    pub(super) fn check_deadline(
        &self,
        step: &StepName,
        last_error: Option<&str>,
    ) -> Result<(), Stop> {
        if self.mode == Mode::Forward
            && !self.record.no_return
            && self.now() >= self.record.deadline_ms
        {
            return Err(Stop::Fail(Failure {
                reason: "deadline".into(),
                step: Some(step.as_str().to_owned()),
                detail: last_error.map(str::to_owned),
            }));
        }
        Ok(())
    }

    /// The number of the attempt about to be made (the step's recorded
    /// attempts, over every executor, plus one), once the budget allows it:
    /// where retries are not bounded by the deadline (after the point of no
    /// return, and in compensation), after
    /// [`RunsConfig::max_attempts`](crate::RunsConfig::max_attempts) failed
    /// attempts the run waits for an operator instead. Failures are counted
    /// over every executor; attempts cut short by a crash are not failures,
    /// but a step that keeps taking its process down (more than
    /// [`CUT_SHORT_FACTOR`] times `max_attempts` attempts cut short) waits
    /// for an operator too.
    pub(super) fn next_attempt(
        &self,
        step: &StepName,
        bounded: bool,
        last_error: Option<&str>,
    ) -> Result<u32, Stop> {
        let rec = self.existing(step);
        let failures = rec.as_ref().map_or(0, |r| r.failures);
        if bounded && failures >= self.exec.config.max_attempts {
            return Err(Stop::Attention {
                step: step.as_str().to_owned(),
                reason: format!(
                    "{failures} attempts failed{}",
                    last_error
                        .or(rec.as_ref().and_then(|r| r.error.as_deref()))
                        .map(|e| format!(", the last: {e}"))
                        .unwrap_or_default()
                ),
            });
        }
        let attempts = rec.as_ref().map_or(0, |r| r.attempts);
        let cut_short = attempts.saturating_sub(failures);
        if bounded
            && cut_short
                >= self
                    .exec
                    .config
                    .max_attempts
                    .saturating_mul(CUT_SHORT_FACTOR)
        {
            return Err(Stop::Attention {
                step: step.as_str().to_owned(),
                reason: format!(
                    "{cut_short} attempts were cut short (their process died or lost the run)"
                ),
            });
        }
        Ok(attempts.saturating_add(1))
    }

    /// Waits until `at_ms`; a long wait gives the run back, due then.
    pub(super) async fn wait_until(&mut self, at_ms: i64) -> Result<(), Stop> {
        let left = at_ms - self.now();
        if left <= 0 {
            return Ok(());
        }
        let left = std::time::Duration::from_millis(u64::try_from(left).unwrap_or(0));
        if left > self.exec.config.release_after {
            self.release_until(at_ms).await?;
        }
        let mut lost = self.lost.clone();
        guarded(&mut lost, tokio::time::sleep(left)).await
    }

    /// Gives the run back, due at `until_ms` for any executor.
    pub(super) async fn release_until(&mut self, until_ms: i64) -> Result<(), Stop> {
        self.beat.active.store(false, Ordering::SeqCst);
        let change = RunChange {
            release: true,
            locked_until_ms: Some(until_ms),
            ..RunChange::default()
        };
        self.write_now(&change, None).await?;
        Err(Stop::Released { until_ms })
    }

    /// A step resumed after failures waits out the backoff its last failure
    /// started (from when it was recorded), so a run that keeps changing
    /// hands is not retried faster than one that does not.
    pub(super) async fn resume_backoff(&mut self, step: &StepName) -> Result<(), Stop> {
        let Some(rec) = self.existing(step) else {
            return Ok(());
        };
        if rec.failures == 0 || matches!(rec.state, StepState::Done | StepState::Failed) {
            return Ok(());
        }
        let delay = self.exec.config.backoff.delay(rec.failures, 0.0);
        let due = rec
            .updated_at_ms
            .saturating_add(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX / 2));
        self.wait_until(due).await
    }

    /// Waits before the next attempt, after `failures` failures; a long
    /// wait gives the run back.
    pub(super) async fn pause(&mut self, failures: u32) -> Result<(), Stop> {
        let delay = self.exec.config.backoff.delay(failures, jitter());
        let until_ms = self.now() + i64::try_from(delay.as_millis()).unwrap_or(i64::MAX / 2);
        if delay > self.exec.config.release_after {
            return self.release_until(until_ms).await;
        }
        let mut lost = self.lost.clone();
        guarded(&mut lost, tokio::time::sleep(delay)).await
    }

    /// Bounds a call by the call timeout (past it the outcome is unknown)
    /// and by the lease. Built before it is awaited, so the future borrows
    /// nothing of the run.
    pub(super) fn timed<T>(
        &self,
        call: impl Future<Output = Result<T, StepError>>,
    ) -> impl Future<Output = Result<Result<T, StepError>, Stop>> {
        self.timed_from(tokio::time::Instant::now(), call)
    }

    /// [`Run::timed`], its timeout counted from `began` (taken before the
    /// attempt's start was recorded). The deadline is checked before the
    /// call is polled, every time: a call is never polled past `began` +
    /// `call_timeout` — not even once by an executor resumed after a pause
    /// — so none of its requests is handed to the network later than that.
    /// A compensation's landing window counts on it.
    pub(super) fn timed_from<T>(
        &self,
        began: tokio::time::Instant,
        call: impl Future<Output = Result<T, StepError>>,
    ) -> impl Future<Output = Result<Result<T, StepError>, Stop>> {
        let timeout = self.exec.config.call_timeout;
        let mut lost = self.lost.clone();
        async move {
            guarded(&mut lost, async {
                let deadline = tokio::time::sleep_until(began + timeout);
                tokio::pin!(deadline, call);
                tokio::select! {
                    biased;
                    () = &mut deadline => {
                        Err(StepError::Unknown(format!("no answer within {timeout:?}")))
                    }
                    r = &mut call => r,
                }
            })
            .await
        }
    }
}
