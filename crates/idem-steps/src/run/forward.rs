//! The forward steps: phases (local work, committed with their record) and
//! calls (external, with a derived key).

use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::sync::Arc;

use idem_core::failpoint;
use idem_core::steps::{RunChange, RunStore, StepKey, StepKind, StepName, StepState};
use idem_core::{BoxError, BoxFuture, StoreError};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::undo::{
    LookupCtx, LookupFn, UndoAction, UndoCallFn, UndoCtx, UndoPhaseFn, undo_phase_fn,
};
use super::{Mode, Run, StepCtx};
use crate::error::{StepError, Stop};

/// The store's own error inside a phase's boxed one, if that is what it is.
fn store_stop(e: BoxError) -> Result<StoreError, BoxError> {
    e.downcast::<StoreError>().map(|e| *e)
}

impl<S: RunStore> Run<S> {
    /// Local database work named `name`: `work` runs in a transaction that
    /// commits together with the step's record, so it happens once — and,
    /// for the run's first phase, in the transaction that claims the key
    /// and creates the run. Its result (JSON) is recorded and returned on
    /// resume without running `work` again. Several phases in a row share a
    /// transaction, committed before the next external call.
    pub fn phase<T, F>(&mut self, name: &str, work: F) -> Phase<'_, S, T, F>
    where
        F: for<'t> FnOnce(&'t mut S::Tx) -> BoxFuture<'t, Result<T, BoxError>>,
    {
        Phase {
            run: self,
            name: name.to_owned(),
            work,
            undo: None,
            _t: PhantomData,
        }
    }

    /// An external call named `name` that accepts a key: `call` gets the
    /// derived key (the same on every attempt) and the fence. Its attempt
    /// is recorded before the call and its result after; on resume a
    /// recorded result is returned without calling again, and a call that
    /// started without a recorded result is made again with the same key.
    /// [`StepError::Unknown`] and [`StepError::Retry`] are retried with
    /// backoff until the run's deadline; [`StepError::Permanent`] fails the
    /// run.
    pub fn call<T, F, Fut>(&mut self, name: &str, call: F) -> Call<'_, S, T, F>
    where
        F: Fn(StepCtx) -> Fut,
        Fut: Future<Output = Result<T, StepError>>,
    {
        Call {
            run: self,
            name: name.to_owned(),
            call,
            undo: None,
            lookup: None,
            no_return: false,
            _t: PhantomData,
        }
    }

    // ---- the step kinds --------------------------------------------------

    async fn run_phase<T, F>(
        &mut self,
        name: &str,
        work: F,
        undo: Option<(String, UndoPhaseFn<S::Tx>)>,
    ) -> Result<T, Stop>
    where
        T: Serialize + DeserializeOwned,
        F: for<'t> FnOnce(&'t mut S::Tx) -> BoxFuture<'t, Result<T, BoxError>>,
    {
        let step = self.begin_step(name)?;
        if let Some((undo_name, f)) = undo {
            self.register(undo_name, &step, UndoAction::Phase(f))?;
        }
        if let Some(rec) = self.existing(&step)
            && rec.state == StepState::Done
        {
            return Self::decode(&rec);
        }
        if self.mode == Mode::Compensating {
            return Err(Stop::Compensating);
        }
        let mut tx = self.tx().await?;
        match work(&mut tx).await {
            Ok(value) => {
                let bytes = Self::encode(&step, &value)?;
                let key = StepKey::derive(&self.namespace, &self.record.scope, &step);
                let rec = self.attempt_record(&step, StepKind::Phase, key.as_str());
                let rec = self.done(rec, bytes);
                self.open = Some(tx);
                let change = RunChange {
                    recovery_point: Some(step.as_str()),
                    ..RunChange::default()
                };
                self.write(&change, Some(&rec)).await?;
                Ok(value)
            }
            Err(e) => {
                let _ = self.exec.store.rollback(tx).await;
                Err(self.phase_error(&step, e))
            }
        }
    }

    /// A phase's work failed: its transaction rolled back. A store that is
    /// away stops the run (resumed after its lease); anything else is for
    /// an operator.
    pub(super) fn phase_error(&mut self, step: &StepName, e: BoxError) -> Stop {
        match store_stop(e) {
            Ok(e) if e.retryable() || self.claim_open => Stop::Store(e),
            Ok(e) => Stop::Attention {
                step: step.as_str().to_owned(),
                reason: format!("its work failed: {}", idem_core::ErrorChain(&e)),
            },
            Err(e) if self.claim_open => Stop::Store(StoreError::Database { source: e }),
            Err(e) => Stop::Attention {
                step: step.as_str().to_owned(),
                reason: format!("its work failed: {}", idem_core::ErrorChain(&*e)),
            },
        }
    }

    async fn run_call<T, F, Fut>(
        &mut self,
        name: &str,
        call: F,
        undo: Option<(String, UndoCallFn)>,
        lookup: Option<LookupFn>,
        no_return: bool,
    ) -> Result<T, Stop>
    where
        T: Serialize + DeserializeOwned,
        F: Fn(StepCtx) -> Fut,
        Fut: Future<Output = Result<T, StepError>>,
    {
        let step = self.begin_step(name)?;
        if let Some((undo_name, f)) = undo {
            self.register(undo_name, &step, UndoAction::Call { undo: f, lookup })?;
        }
        match self.existing(&step) {
            Some(rec) if rec.state == StepState::Done => return Self::decode(&rec),
            Some(rec) if rec.state == StepState::Failed => return Err(Self::failed_step(&rec)),
            _ => {}
        }
        if self.mode != Mode::Forward {
            return Err(Stop::Compensating);
        }
        let key = StepKey::derive(&self.namespace, &self.record.scope, &step);
        // Whether an attempt so far may have had its effect (an unknown
        // outcome, or a crash in the middle): then a compensation must find
        // out. Attempts that certainly did nothing leave the step clean.
        let mut uncertain = self
            .existing(&step)
            .is_some_and(|r| r.state == StepState::Started);
        let mut last_error: Option<String> = None;
        self.resume_backoff(&step).await?;
        loop {
            self.check_deadline(&step, last_error.as_deref())?;
            self.next_attempt(
                &step,
                self.record.no_return || no_return,
                last_error.as_deref(),
            )?;
            let mut rec = self.attempt_record(&step, StepKind::Call, key.as_str());
            // The call's timeout counts from before its start is recorded:
            // a compensation's landing window starts from that record.
            let began = tokio::time::Instant::now();
            self.start_attempt(&rec, no_return).await?;
            failpoint::hit("steps.before_call");
            let ctx = StepCtx {
                key: key.clone(),
                fence: self.lease.fence,
                attempt: rec.attempts,
            };
            let answer = self.timed_from(began, call(ctx)).await?;
            crate::metrics::attempt(step.as_str(), &answer);
            match answer {
                Ok(value) => {
                    // Drill 7's window: the other system did it, nothing
                    // is recorded yet.
                    failpoint::hit("steps.after_call");
                    let bytes = Self::encode(&step, &value)?;
                    let rec = self.done(rec, bytes);
                    let change = RunChange {
                        recovery_point: Some(step.as_str()),
                        ..RunChange::default()
                    };
                    // Durable before the next step starts; lost in a crash
                    // before that, the call runs again with the same key.
                    self.write_lazily(&change, Some(&rec)).await?;
                    return Ok(value);
                }
                Err(StepError::Permanent(e)) => {
                    rec.state = StepState::Failed;
                    rec.error = Some(e);
                    rec.finished_at_ms = Some(self.now());
                    self.write_now(&RunChange::default(), Some(&rec)).await?;
                    return Err(Self::failed_step(&rec));
                }
                Err(e) => {
                    tracing::info!(run = %self.record.id, step = %step, attempt = rec.attempts,
                                   error = %e, "step attempt failed; retrying with the same key");
                    uncertain |= matches!(e, StepError::Unknown(_));
                    if !uncertain {
                        rec.state = StepState::NotSent;
                    }
                    rec.error = Some(e.to_string());
                    rec.failures = rec.failures.saturating_add(1);
                    self.write_now(&RunChange::default(), Some(&rec)).await?;
                    last_error = rec.error;
                    self.pause(rec.failures).await?;
                }
            }
        }
    }
}

/// A phase being set up: `.undo(…)` registers its compensation; `.await`
/// runs it.
#[must_use = "a phase does nothing until it is awaited"]
pub struct Phase<'r, S: RunStore, T, F> {
    run: &'r mut Run<S>,
    name: String,
    work: F,
    undo: Option<(String, UndoPhaseFn<S::Tx>)>,
    _t: PhantomData<fn() -> T>,
}

impl<'r, S: RunStore, T, F> Phase<'r, S, T, F>
where
    T: DeserializeOwned + Send + 'static,
{
    /// Registers the phase's compensation, local work named `name` that
    /// gets the phase's result. It runs (once, committed with its record)
    /// if the run fails after the phase committed.
    pub fn undo<U>(mut self, name: &str, undo: U) -> Self
    where
        U: for<'t> Fn(&'t mut S::Tx, T) -> BoxFuture<'t, Result<(), BoxError>>
            + Send
            + Sync
            + 'static,
    {
        let f = undo_phase_fn(move |tx: &mut S::Tx, bytes: &[u8]| {
            match serde_json::from_slice::<T>(bytes) {
                Ok(value) => undo(tx, value),
                Err(e) => {
                    let e: BoxError =
                        format!("the phase's recorded result does not decode: {e}").into();
                    Box::pin(std::future::ready(Err(e)))
                }
            }
        });
        self.undo = Some((name.to_owned(), Box::new(f)));
        self
    }
}

impl<'r, S, T, F> IntoFuture for Phase<'r, S, T, F>
where
    S: RunStore,
    T: Serialize + DeserializeOwned + Send + 'r,
    F: for<'t> FnOnce(&'t mut S::Tx) -> BoxFuture<'t, Result<T, BoxError>> + Send + 'r,
{
    type Output = Result<T, Stop>;
    type IntoFuture = BoxFuture<'r, Result<T, Stop>>;

    fn into_future(self) -> Self::IntoFuture {
        let Phase {
            run,
            name,
            work,
            undo,
            ..
        } = self;
        Box::pin(async move { run.run_phase(&name, work, undo).await })
    }
}

/// An external call being set up: `.undo(…)` registers its compensation,
/// `.lookup(…)` how that compensation learns an unknown outcome,
/// `.point_of_no_return()` marks it; `.await` runs it.
#[must_use = "a call does nothing until it is awaited"]
pub struct Call<'r, S: RunStore, T, F> {
    run: &'r mut Run<S>,
    name: String,
    call: F,
    undo: Option<(String, UndoCallFn)>,
    lookup: Option<LookupFn>,
    no_return: bool,
    _t: PhantomData<fn() -> T>,
}

impl<'r, S: RunStore, T, F> Call<'r, S, T, F>
where
    T: Serialize + DeserializeOwned + 'static,
{
    /// Registers the call's compensation, an external call named `name`
    /// with its own derived key ([`UndoCtx::key`]). It runs if the run
    /// fails after the call was attempted, and gets what the call did: its
    /// recorded result, or — when its outcome is unknown — what the call's
    /// [`Call::lookup`] found. It never gets a guess: a call whose outcome
    /// is unknown and that has no lookup makes the run wait for an operator
    /// instead; one the lookup does not find (after the landing window) is
    /// not compensated.
    pub fn undo<U, Fut>(mut self, name: &str, undo: U) -> Self
    where
        U: Fn(UndoCtx, T) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), StepError>> + Send + 'static,
    {
        let f: UndoCallFn = Arc::new(
            move |ctx: UndoCtx, bytes: &[u8]| match serde_json::from_slice::<T>(bytes) {
                Ok(value) => Box::pin(undo(ctx, value)),
                Err(e) => Box::pin(std::future::ready(Err(StepError::Permanent(format!(
                    "the call's result does not decode: {e}"
                ))))),
            },
        );
        self.undo = Some((name.to_owned(), f));
        self
    }

    /// Registers how the call's compensation learns its outcome when it is
    /// unknown (an answer lost, a timeout, a crash mid-call): a read-only
    /// request to the other system, by the call's derived key
    /// ([`LookupCtx::key`]) or a business reference the call sent, that
    /// answers `Some(result)` if the call's effect exists and `None` if it
    /// does not. Never the call itself: a lookup must not create what it
    /// looks for.
    ///
    /// `Some` is undone at once. `None` is trusted only from a lookup that
    /// starts once a request the call sent can no longer land: after its
    /// last attempt's start, plus
    /// [`RunsConfig::call_timeout`](crate::RunsConfig::call_timeout), plus
    /// [`RunsConfig::landing_margin`](crate::RunsConfig::landing_margin).
    /// Until then the compensation waits, then asks again. Either answer is
    /// recorded on the compensation's step, so no executor asks twice. A
    /// failed lookup is retried like a step ([`StepError::Unknown`] and
    /// [`StepError::Retry`], within `max_attempts`);
    /// [`StepError::Permanent`] or an exhausted budget makes the run wait
    /// for an operator. Used only by the call's compensation.
    pub fn lookup<L, LFut>(mut self, lookup: L) -> Self
    where
        L: Fn(LookupCtx) -> LFut + Send + Sync + 'static,
        LFut: Future<Output = Result<Option<T>, StepError>> + Send + 'static,
    {
        let f: LookupFn = Arc::new(move |ctx: LookupCtx| {
            let found = lookup(ctx);
            Box::pin(async move {
                match found.await? {
                    None => Ok(None),
                    Some(value) => serde_json::to_value(&value).map(Some).map_err(|e| {
                        StepError::Permanent(format!("the lookup's result does not encode: {e}"))
                    }),
                }
            })
        });
        self.lookup = Some(f);
        self
    }

    /// From this call's first attempt on, the run is past its point of no
    /// return: failures are retried forward (then wait for an operator),
    /// never compensated.
    pub fn point_of_no_return(mut self) -> Self {
        self.no_return = true;
        self
    }
}

impl<'r, S, T, F, Fut> IntoFuture for Call<'r, S, T, F>
where
    S: RunStore,
    T: Serialize + DeserializeOwned + Send + 'r,
    F: Fn(StepCtx) -> Fut + Send + Sync + 'r,
    Fut: Future<Output = Result<T, StepError>> + Send + 'r,
{
    type Output = Result<T, Stop>;
    type IntoFuture = BoxFuture<'r, Result<T, Stop>>;

    fn into_future(self) -> Self::IntoFuture {
        let Call {
            run,
            name,
            call,
            undo,
            lookup,
            no_return,
            ..
        } = self;
        Box::pin(async move { run.run_call(&name, call, undo, lookup, no_return).await })
    }
}
