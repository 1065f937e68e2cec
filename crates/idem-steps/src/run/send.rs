//! Sends to sinks without keys: verify-then-send and at most once.

use std::future::{Future, IntoFuture};
use std::marker::PhantomData;

use idem_core::BoxFuture;
use idem_core::failpoint;
use idem_core::steps::{
    Fence, MessageClaim, MessageState, RunChange, RunStore, StepKey, StepKind, StepState,
};
use serde::{Deserialize, Serialize};

use super::{Mode, Run};
use crate::error::{StepError, Stop};

/// What a send's closures get.
#[derive(Debug, Clone)]
pub struct SendCtx {
    /// The message id the sink sees, and the send-once ledger records.
    pub message_id: String,
    /// The fence of the lease this attempt runs under.
    pub fence: Fence,
    /// The attempt.
    pub attempt: u32,
}

/// The verification of an at-most-once send: there is none.
pub type NoVerify = fn(SendCtx) -> std::future::Ready<Result<bool, StepError>>;

/// How a send's effect is known to have happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sent {
    /// Sent by this attempt.
    Now,
    /// The sink said it had the message already (verify-then-send).
    Verified,
    /// The send-once ledger had it as sent (by this run or another).
    Before,
    /// An operator said it was sent.
    Operator,
}

impl<S: RunStore> Run<S> {
    /// A message to a sink that does not deduplicate (an SMTP relay): before
    /// a send whose earlier attempt's outcome is unknown, `verify` asks the
    /// sink whether it has the message id (`Ok(true)`: it does, nothing is
    /// sent). The id is claimed in the send-once ledger, so no other run
    /// sends it either. The message id is the step's derived key unless
    /// [`SendStep::message_id`] names one.
    pub fn send<V, VFut, F, Fut>(&mut self, name: &str, verify: V, send: F) -> SendStep<'_, S, V, F>
    where
        V: Fn(SendCtx) -> VFut,
        VFut: Future<Output = Result<bool, StepError>>,
        F: Fn(SendCtx) -> Fut,
        Fut: Future<Output = Result<(), StepError>>,
    {
        SendStep {
            run: self,
            name: name.to_owned(),
            message_id: None,
            verify: Some(verify),
            send,
            no_return: false,
            _s: PhantomData,
        }
    }

    /// An effect that is never repeated automatically: the attempt is
    /// recorded before the call; if its outcome is then unknown (a crash,
    /// a timeout, [`StepError::Unknown`]), the run waits in
    /// `needs_attention` for an operator (`idem steps resolve RUN --as
    /// sent|not-sent`). Only a [`StepError::Retry`] — certainly not sent —
    /// is tried again.
    pub fn send_at_most_once<F, Fut>(&mut self, name: &str, send: F) -> SendStep<'_, S, NoVerify, F>
    where
        F: Fn(SendCtx) -> Fut,
        Fut: Future<Output = Result<(), StepError>>,
    {
        SendStep {
            run: self,
            name: name.to_owned(),
            message_id: None,
            verify: None,
            send,
            no_return: false,
            _s: PhantomData,
        }
    }

    async fn run_send<V, VFut, F, Fut>(
        &mut self,
        name: &str,
        message_id: Option<String>,
        verify: Option<V>,
        send: F,
        no_return: bool,
    ) -> Result<Sent, Stop>
    where
        V: Fn(SendCtx) -> VFut,
        VFut: Future<Output = Result<bool, StepError>>,
        F: Fn(SendCtx) -> Fut,
        Fut: Future<Output = Result<(), StepError>>,
    {
        let step = self.begin_step(name)?;
        let kind = if verify.is_some() {
            StepKind::Send
        } else {
            StepKind::AtMostOnce
        };
        let previous = self.existing(&step);
        match &previous {
            Some(rec) if rec.state == StepState::Done => return Self::decode(rec),
            Some(rec) if rec.state == StepState::Failed => return Err(Self::failed_step(rec)),
            _ => {}
        }
        if self.mode != Mode::Forward {
            return Err(Stop::Compensating);
        }
        let message_id = match message_id {
            Some(id)
                if (1..=255).contains(&id.len())
                    && id.bytes().all(|b| (0x21..=0x7e).contains(&b)) =>
            {
                id
            }
            Some(_) => {
                return Err(Stop::Attention {
                    step: step.as_str().to_owned(),
                    reason: "its message id is not 1 to 255 visible ASCII characters".into(),
                });
            }
            None => StepKey::derive(&self.namespace, &self.record.scope, &step)
                .as_str()
                .to_owned(),
        };
        // An attempt that started and recorded no outcome may have sent.
        let mut unknown = previous
            .as_ref()
            .is_some_and(|r| r.state == StepState::Started);
        // When the attempt whose outcome is unknown was last heard of: a
        // request still travelling to the sink when we ask it would be a
        // duplicate, so we ask only once it had a call's time to land.
        let mut quiet_since = previous
            .as_ref()
            .filter(|r| r.state == StepState::Started)
            .map(|r| r.updated_at_ms);
        let mut last_error: Option<String> = previous.and_then(|r| r.error);
        if unknown && kind == StepKind::AtMostOnce {
            return Err(Stop::Attention {
                step: step.as_str().to_owned(),
                reason: format!(
                    "an earlier attempt may have been sent (outcome unknown{}); it is never \
                     sent again without an operator",
                    last_error
                        .as_deref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                ),
            });
        }
        self.resume_backoff(&step).await?;
        loop {
            self.check_deadline(&step, last_error.as_deref())?;
            self.next_attempt(
                &step,
                self.record.no_return || no_return,
                last_error.as_deref(),
            )?;
            if unknown
                && verify.is_some()
                && let Some(since) = quiet_since.take()
            {
                // Before the next attempt is recorded: a wait that gives the
                // run back leaves the step as it was, so whoever resumes it
                // waits for the same moment, not a later one.
                let landing = i64::try_from(self.exec.config.call_timeout.as_millis())
                    .unwrap_or(i64::MAX / 4);
                self.wait_until(since.saturating_add(landing)).await?;
                continue;
            }
            self.ensure_lease()?;
            // Claim the message id and record the attempt, in one transaction.
            let mut tx = self.tx().await?;
            let now = self.now();
            let retention = i64::try_from(self.exec.config.message_retention.as_millis())
                .unwrap_or(i64::MAX / 4);
            let claim = MessageClaim {
                message_id: &message_id,
                run: &self.record.id,
                step: step.as_str(),
                now_ms: now,
                expires_at_ms: now.saturating_add(retention),
            };
            let claimed = S::claim_message(&mut tx, &claim).await;
            self.open = Some(tx);
            let entry = match claimed {
                Ok(entry) => entry,
                Err(e) => {
                    self.rollback_open().await;
                    return Err(Stop::Store(e));
                }
            };
            let theirs = entry.run_id != self.record.id.as_str();
            let mut rec = self.attempt_record(&step, kind, &message_id);
            if entry.state == MessageState::Sent {
                let rec = self.done(rec, Self::encode(&step, &Sent::Before)?);
                self.write_now(
                    &RunChange {
                        recovery_point: Some(step.as_str()),
                        ..RunChange::default()
                    },
                    Some(&rec),
                )
                .await?;
                return Ok(Sent::Before);
            }
            if theirs {
                // Another run is sending this id, or did and did not say.
                unknown = true;
                if kind == StepKind::AtMostOnce {
                    self.commit_open().await?;
                    return Err(Stop::Attention {
                        step: step.as_str().to_owned(),
                        reason: format!(
                            "message {message_id} is being sent by run {} (outcome unknown)",
                            entry.run_id
                        ),
                    });
                }
            }
            self.start_attempt(&rec, no_return).await?;
            let ctx = SendCtx {
                message_id: message_id.clone(),
                fence: self.lease.fence,
                attempt: rec.attempts,
            };
            if unknown && let Some(verify) = &verify {
                match self.timed(verify(ctx.clone())).await? {
                    Ok(true) => {
                        let rec = self.done(rec, Self::encode(&step, &Sent::Verified)?);
                        let change = RunChange {
                            recovery_point: Some(step.as_str()),
                            message: (!theirs).then_some((message_id.as_str(), MessageState::Sent)),
                            ..RunChange::default()
                        };
                        self.write_now(&change, Some(&rec)).await?;
                        return Ok(Sent::Verified);
                    }
                    Ok(false) if !theirs => {}
                    Ok(false) => {
                        // Not arrived, but another run holds the id: its send
                        // may be in flight. Wait, never send beside it.
                        last_error = Some(format!(
                            "message {message_id} is held by run {}",
                            entry.run_id
                        ));
                        rec.error = last_error.clone();
                        rec.failures = rec.failures.saturating_add(1);
                        self.write_now(&RunChange::default(), Some(&rec)).await?;
                        self.pause(rec.failures).await?;
                        continue;
                    }
                    Err(e) => {
                        // The sink cannot say: never send blind.
                        last_error = Some(format!("verify: {e}"));
                        rec.error = last_error.clone();
                        rec.failures = rec.failures.saturating_add(1);
                        self.write_now(&RunChange::default(), Some(&rec)).await?;
                        self.pause(rec.failures).await?;
                        continue;
                    }
                }
            }
            failpoint::hit("steps.before_send");
            let answer = self.timed(send(ctx)).await?;
            crate::metrics::attempt(step.as_str(), &answer);
            match answer {
                Ok(()) => {
                    failpoint::hit("steps.after_send");
                    let rec = self.done(rec, Self::encode(&step, &Sent::Now)?);
                    let change = RunChange {
                        recovery_point: Some(step.as_str()),
                        message: Some((message_id.as_str(), MessageState::Sent)),
                        ..RunChange::default()
                    };
                    if kind == StepKind::Send {
                        // Lost in a crash, the sink is asked before any resend.
                        self.write_lazily(&change, Some(&rec)).await?;
                    } else {
                        // At most once: an unrecorded success would wait for
                        // an operator after a crash; durable now.
                        self.write_now(&change, Some(&rec)).await?;
                    }
                    return Ok(Sent::Now);
                }
                Err(StepError::Permanent(e)) => {
                    rec.state = StepState::Failed;
                    rec.error = Some(e);
                    rec.finished_at_ms = Some(self.now());
                    let change = RunChange {
                        message: Some((message_id.as_str(), MessageState::NotSent)),
                        ..RunChange::default()
                    };
                    self.write_now(&change, Some(&rec)).await?;
                    return Err(Self::failed_step(&rec));
                }
                Err(StepError::Retry(e)) => {
                    // Certainly not sent: the next attempt needs no check.
                    rec.state = StepState::NotSent;
                    rec.error = Some(e);
                    rec.failures = rec.failures.saturating_add(1);
                    let change = RunChange {
                        message: Some((message_id.as_str(), MessageState::NotSent)),
                        ..RunChange::default()
                    };
                    self.write_now(&change, Some(&rec)).await?;
                    unknown = false;
                    quiet_since = None;
                    last_error = rec.error;
                    self.pause(rec.failures).await?;
                }
                Err(e @ StepError::Unknown(_)) => {
                    rec.error = Some(e.to_string());
                    rec.failures = rec.failures.saturating_add(1);
                    self.write_now(&RunChange::default(), Some(&rec)).await?;
                    if kind == StepKind::AtMostOnce {
                        return Err(Stop::Attention {
                            step: step.as_str().to_owned(),
                            reason: format!("the attempt's outcome is unknown: {}", e.detail()),
                        });
                    }
                    unknown = true;
                    // Abandoned now, it may still land: give it time first.
                    quiet_since = Some(self.now());
                    last_error = rec.error;
                    self.pause(rec.failures).await?;
                }
            }
        }
    }
}

/// A send being set up: `.message_id(…)`, `.point_of_no_return()`;
/// `.await` runs it.
#[must_use = "a send does nothing until it is awaited"]
pub struct SendStep<'r, S: RunStore, V, F> {
    run: &'r mut Run<S>,
    name: String,
    message_id: Option<String>,
    verify: Option<V>,
    send: F,
    no_return: bool,
    _s: PhantomData<fn() -> S>,
}

impl<'r, S: RunStore, V, F> SendStep<'r, S, V, F> {
    /// Sends under this message id (derived from a business id, such as
    /// `confirm-<order id>`) instead of the step's derived key. It must be
    /// deterministic: 1 to 255 visible ASCII characters.
    pub fn message_id(mut self, id: impl Into<String>) -> Self {
        self.message_id = Some(id.into());
        self
    }

    /// From this send's first attempt on, the run is past its point of no
    /// return (see [`Call::point_of_no_return`](crate::Call::point_of_no_return)).
    pub fn point_of_no_return(mut self) -> Self {
        self.no_return = true;
        self
    }
}

impl<'r, S, V, VFut, F, Fut> IntoFuture for SendStep<'r, S, V, F>
where
    S: RunStore,
    V: Fn(SendCtx) -> VFut + Send + Sync + 'r,
    VFut: Future<Output = Result<bool, StepError>> + Send + 'r,
    F: Fn(SendCtx) -> Fut + Send + Sync + 'r,
    Fut: Future<Output = Result<(), StepError>> + Send + 'r,
{
    type Output = Result<Sent, Stop>;
    type IntoFuture = BoxFuture<'r, Result<Sent, Stop>>;

    fn into_future(self) -> Self::IntoFuture {
        let SendStep {
            run,
            name,
            message_id,
            verify,
            send,
            no_return,
            ..
        } = self;
        Box::pin(async move {
            run.run_send(&name, message_id, verify, send, no_return)
                .await
        })
    }
}
