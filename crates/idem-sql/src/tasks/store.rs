//! [`TaskStore`] written once, generic over
//! the [`Dialect`], over the statements of [`super`].

use idem_core::StoreError;
use idem_core::steps::MessageState;
use idem_core::tasks::{
    ActionDecision, ActionMode, AskAnswer, AskHolder, Settle, SettlePlan, SettleWrite, TaskRecord,
    decide_ask, held_by_claim, holds, may_give_back, plan_settle,
};

use super as sql;
use crate::decode;
use crate::dialect::{Dialect, On, Stmt, fetch_one, read_row, read_rows};
use crate::row;
use crate::store::SqlStore;
use idem_core::tasks::{
    ActionAttempt, ActionClaim, ActionOutcome, ClaimRequest, CursorMove, Fenced, NewTask,
    PollerRecord, Steer, Steered, TaskEvent, TaskFilter, TaskState, TaskStore,
};

/// `s` on the transaction: its first row, if any.
async fn optional<D: Dialect>(tx: &mut D::Tx, s: Stmt<'_>) -> Result<Option<D::Row>, StoreError> {
    D::fetch_optional(On::Conn(&mut **tx), s)
        .await
        .map_err(D::map_err)
}

/// `s` on the transaction: its one row.
async fn one<D: Dialect>(tx: &mut D::Tx, s: Stmt<'_>) -> Result<D::Row, StoreError> {
    fetch_one::<D>(On::Conn(&mut **tx), s)
        .await
        .map_err(D::map_err)
}

/// `s` on the transaction: the rows it changed.
async fn execute<D: Dialect>(tx: &mut D::Tx, s: Stmt<'_>) -> Result<u64, StoreError> {
    D::execute(On::Conn(&mut **tx), s).await.map_err(D::map_err)
}

/// One timeline entry.
async fn event<D: Dialect>(
    tx: &mut D::Tx,
    task: &str,
    kind: &str,
    actor: Option<&str>,
    fence: Option<i64>,
    at_ms: i64,
    detail: Option<&str>,
) -> Result<(), StoreError> {
    let s = Stmt::new(sql::INSERT_EVENT)
        .bind(task)
        .bind(kind)
        .bind(actor)
        .bind(fence)
        .bind(at_ms)
        .bind(detail);
    execute::<D>(tx, s).await.map(drop)
}

/// The task of `tenant`, locked for a write (another tenant's is none of
/// the caller's business: missing).
async fn locked<D: Dialect>(
    tx: &mut D::Tx,
    tenant: &str,
    task: &str,
) -> Result<Option<TaskRecord>, StoreError> {
    let s = Stmt::new(super::texts::<D>().lock_task.as_str()).bind(task);
    let row = optional::<D>(tx, s).await?;
    let t = row.as_ref().map(decode::task).transpose()?;
    Ok(t.filter(|t| t.tenant == tenant))
}

/// The holder of `fence` settles `task` as `w` says.
async fn write<D: Dialect>(
    tx: &mut D::Tx,
    t: &TaskRecord,
    fence: i64,
    settle: &Settle<'_>,
    w: SettleWrite,
    now_ms: i64,
) -> Result<TaskRecord, StoreError> {
    let s = match (&w, settle) {
        (SettleWrite::Renew { until_ms }, _) => Stmt::new(sql::RENEW.as_str())
            .bind(&t.id)
            .bind(fence)
            .bind(*until_ms)
            .bind(now_ms),
        (
            SettleWrite::Complete,
            Settle::Complete {
                result,
                result_hash,
            },
        ) => Stmt::new(sql::COMPLETE.as_str())
            .bind(&t.id)
            .bind(fence)
            .bind(*result)
            .bind(*result_hash)
            .bind(now_ms),
        (SettleWrite::Retry { run_at_ms }, Settle::Fail { error, .. }) => {
            Stmt::new(sql::RETRY.as_str())
                .bind(&t.id)
                .bind(fence)
                .bind(*run_at_ms)
                .bind(*error)
                .bind(now_ms)
        }
        (SettleWrite::Dead, Settle::Fail { error, .. }) => Stmt::new(sql::DEAD.as_str())
            .bind(&t.id)
            .bind(fence)
            .bind(*error)
            .bind(now_ms),
        _ => {
            return Err(StoreError::Corrupt {
                detail: format!("a settle planned as {w:?}"),
            });
        }
    };
    let row = one::<D>(tx, s).await?;
    let written = decode::task(&row)?;
    let (kind, detail) = match (&w, settle) {
        (SettleWrite::Renew { .. }, _) => return Ok(written),
        (SettleWrite::Complete, _) => ("completed", None),
        (SettleWrite::Retry { .. }, Settle::Fail { error, .. }) => ("failed", Some(*error)),
        (_, Settle::Fail { error, .. }) => ("dead", Some(*error)),
        _ => ("dead", None),
    };
    let holder = t.holder.as_deref();
    event::<D>(tx, &t.id, kind, holder, Some(fence), now_ms, detail).await?;
    Ok(written)
}

impl<D: Dialect> TaskStore for SqlStore<D> {
    async fn create_task(
        tx: &mut D::Tx,
        task: &NewTask<'_>,
    ) -> Result<(TaskRecord, bool), StoreError> {
        let insert = Stmt::new(sql::INSERT_TASK.as_str())
            .bind(task.id)
            .bind(task.tenant)
            .bind(task.queue)
            .bind(task.key)
            .bind(task.payload)
            .bind(task.payload_hash)
            .bind(task.priority)
            .bind(task.run_at_ms)
            .bind(i64::from(task.max_attempts))
            .bind(task.now_ms);
        if let Some(row) = optional::<D>(tx, insert).await? {
            let created = decode::task(&row)?;
            event::<D>(tx, task.id, "created", None, None, task.now_ms, None).await?;
            return Ok((created, true));
        }
        let by_key = Stmt::new(sql::TASK_BY_KEY.as_str())
            .bind(task.tenant)
            .bind(task.queue)
            .bind(task.key);
        match optional::<D>(tx, by_key).await? {
            Some(row) => Ok((decode::task(&row)?, false)),
            // The id is taken by another key: not a derived id.
            None => Err(StoreError::Corrupt {
                detail: format!("task id {} is another key's", task.id),
            }),
        }
    }

    async fn move_cursor(
        tx: &mut D::Tx,
        tenant: &str,
        poller: &str,
        expected: Option<&str>,
        value: &str,
        now_ms: i64,
    ) -> Result<CursorMove, StoreError> {
        let s = match expected {
            None => Stmt::new(sql::INSERT_CURSOR)
                .bind(tenant)
                .bind(poller)
                .bind(value)
                .bind(now_ms),
            Some(from) => Stmt::new(sql::MOVE_CURSOR)
                .bind(tenant)
                .bind(poller)
                .bind(from)
                .bind(value)
                .bind(now_ms),
        };
        if execute::<D>(tx, s).await? == 1 {
            return Ok(CursorMove::Moved);
        }
        let read =
            Stmt::new("SELECT cursor FROM idem_pollers WHERE tenant_id = $1 AND poller = $2")
                .bind(tenant)
                .bind(poller);
        let current: Option<String> = match optional::<D>(tx, read).await? {
            Some(row) => Some(row::get_at(&row, 0)?),
            None => None,
        };
        Ok(match current {
            Some(c) if c == value => CursorMove::AlreadyThere,
            other => CursorMove::Conflict(other),
        })
    }

    async fn cursor(&self, tenant: &str, poller: &str) -> Result<Option<PollerRecord>, StoreError> {
        let d = &self.0;
        let s = Stmt::new(sql::CURSOR).bind(tenant).bind(poller);
        read_row(d, s, decode::poller).await
    }

    async fn claim_tasks(
        tx: &mut D::Tx,
        claim: &ClaimRequest<'_>,
    ) -> Result<Vec<TaskRecord>, StoreError> {
        // Tasks that died (their last lease ended) are not claimed: look again
        // for as many, until none died.
        let mut claimed = Vec::new();
        loop {
            let want = i64::from(claim.max) - claimed.len() as i64;
            let s = Stmt::new(super::texts::<D>().claim.as_str())
                .bind(claim.tenant)
                .bind(claim.queue)
                .bind(claim.worker)
                .bind(claim.now_ms)
                .bind(claim.lease_ms)
                .bind(want);
            let rows = D::fetch_all(On::Conn(&mut **tx), s)
                .await
                .map_err(D::map_err)?;
            let before = claimed.len();
            for row in &rows {
                let t = decode::task(row)?;
                let kind = t.claim_kind.clone().unwrap_or_default();
                let actor = (t.state == TaskState::Claimed).then_some(claim.worker);
                event::<D>(tx, &t.id, &kind, actor, Some(t.fence), claim.now_ms, None).await?;
                if t.state == TaskState::Claimed {
                    claimed.push(t);
                }
            }
            let died = rows.len() - (claimed.len() - before);
            if died == 0 || (rows.len() as i64) < want {
                return Ok(claimed);
            }
        }
    }

    async fn settle(
        tx: &mut D::Tx,
        tenant: &str,
        task: &str,
        fence: i64,
        settle: &Settle<'_>,
        now_ms: i64,
    ) -> Result<Fenced, StoreError> {
        let Some(t) = locked::<D>(tx, tenant, task).await? else {
            return Ok(Fenced::Missing);
        };
        match plan_settle(&t, fence, settle, now_ms) {
            SettlePlan::Refuse(r) => Ok(r.with(t)),
            SettlePlan::Write(w) => Ok(Fenced::Written(
                write::<D>(tx, &t, fence, settle, w, now_ms).await?,
            )),
        }
    }

    async fn claim_action(
        tx: &mut D::Tx,
        a: &ActionAttempt<'_>,
    ) -> Result<ActionClaim, StoreError> {
        let Some(t) = locked::<D>(tx, a.tenant, a.task).await? else {
            return Ok(ActionClaim::Missing);
        };
        if !holds(&t, a.fence, a.now_ms) {
            return Ok(ActionClaim::LeaseLost(t));
        }
        // The entry names the ask told go: only its exact replay is told go
        // again (the ledger's claim takes a not-sent entry for this ask, or
        // leaves it as it is).
        let asker = AskHolder::new(a.task, a.fence, a.ask, a.mode);
        let s = Stmt::new(crate::runs::texts::<D>().claim_message)
            .bind(a.key)
            .bind(asker.as_str())
            .bind(a.action)
            .bind(a.now_ms)
            .bind(a.expires_at_ms);
        let row = one::<D>(tx, s).await?;
        let entry = decode::message(&row)?;
        let decision = match decide_ask(entry.state, &entry.run_id, &asker) {
            AskAnswer::Decided(d) => d,
            AskAnswer::KeyReused => return Ok(ActionClaim::KeyReused(t)),
        };
        let detail = format!("{} {}: {}", a.mode.as_str(), a.action, decision.as_str());
        let holder = t.holder.as_deref();
        event::<D>(
            tx,
            a.task,
            "action",
            holder,
            Some(a.fence),
            a.now_ms,
            Some(&detail),
        )
        .await?;
        if decision == ActionDecision::Unknown && a.mode == ActionMode::AtMostOnce {
            let s = Stmt::new(sql::ATTENTION.as_str())
                .bind(a.task)
                .bind(a.fence)
                .bind(a.now_ms);
            let row = one::<D>(tx, s).await?;
            let why = format!(
                "the outcome of {} is unknown: check the other system by its key {}",
                a.action, a.key
            );
            let kind = "needs_attention";
            event::<D>(tx, a.task, kind, None, Some(a.fence), a.now_ms, Some(&why)).await?;
            return Ok(ActionClaim::Decided(decision, decode::task(&row)?));
        }
        Ok(ActionClaim::Decided(decision, t))
    }

    async fn record_action(
        tx: &mut D::Tx,
        a: &ActionAttempt<'_>,
        outcome: ActionOutcome,
    ) -> Result<ActionClaim, StoreError> {
        let Some(t) = locked::<D>(tx, a.tenant, a.task).await? else {
            return Ok(ActionClaim::Missing);
        };
        if !holds(&t, a.fence, a.now_ms) {
            return Ok(ActionClaim::LeaseLost(t));
        }
        // Only what this claim attempted (any of its asks), or was asked to
        // verify.
        let read = Stmt::new(crate::runs::MESSAGE.as_str()).bind(a.key);
        let entry = optional::<D>(tx, read).await?;
        let Some(entry) = entry.as_ref().map(decode::message).transpose()? else {
            return Ok(ActionClaim::NoAttempt(t));
        };
        // A go under this fence is given back by its own ask alone: any other
        // may look before that one sends.
        if outcome == ActionOutcome::NotSent
            && entry.state == MessageState::Sending
            && !may_give_back(&entry.run_id, a.task, a.fence, a.ask)
        {
            return Ok(ActionClaim::InFlight(t));
        }
        if !held_by_claim(&entry.run_id, a.task, a.fence) {
            let verify = format!("{} {}: unknown", ActionMode::Verify.as_str(), a.action);
            let s = Stmt::new(sql::ASKED_TO_VERIFY)
                .bind(a.task)
                .bind(a.fence)
                .bind(verify);
            let asked: bool = row::get_at(&one::<D>(tx, s).await?, 0)?;
            if !asked {
                return Ok(ActionClaim::NoAttempt(t));
            }
        }
        // Not sent frees the entry for the next ask (told go then, recorded as
        // that ask's): the report itself is no go, or a worker acting on it and
        // the next ask would both send.
        let (sql_text, name, answer) = match outcome {
            ActionOutcome::Done => (sql::MARK_SENT, "done", ActionDecision::Done),
            ActionOutcome::NotSent => (sql::MARK_NOT_SENT, "not-sent", ActionDecision::Ask),
        };
        let mark = Stmt::new(sql_text).bind(a.key).bind(a.now_ms);
        if execute::<D>(tx, mark).await? == 0 {
            // Reported not sent, recorded sent: it was done; reported not sent
            // again: free still.
            let was = match entry.state {
                MessageState::NotSent => ActionDecision::Ask,
                _ => ActionDecision::Done,
            };
            return Ok(ActionClaim::Decided(was, t));
        }
        let detail = match a.detail {
            Some(d) => format!("{}: {name} ({d})", a.action),
            None => format!("{}: {name}", a.action),
        };
        let (holder, kind) = (t.holder.as_deref(), "action_result");
        event::<D>(
            tx,
            a.task,
            kind,
            holder,
            Some(a.fence),
            a.now_ms,
            Some(&detail),
        )
        .await?;
        Ok(ActionClaim::Decided(answer, t))
    }

    async fn steer(
        tx: &mut D::Tx,
        task: &str,
        steer: Steer<'_>,
        actor: &str,
        now_ms: i64,
    ) -> Result<Steered, StoreError> {
        let read = Stmt::new(super::texts::<D>().lock_task.as_str()).bind(task);
        let row = optional::<D>(tx, read).await?;
        let Some(t) = row.as_ref().map(decode::task).transpose()? else {
            return Ok(Steered::Missing);
        };
        let (kind, detail) = match steer {
            Steer::Retry => {
                if !matches!(t.state, TaskState::Dead | TaskState::NeedsAttention) {
                    return Ok(Steered::NotApplicable(t));
                }
                ("retried", None)
            }
            Steer::Resolve { action, key, sent } => {
                if t.state != TaskState::NeedsAttention {
                    return Ok(Steered::NotApplicable(t));
                }
                let mark = if sent {
                    sql::MARK_SENT
                } else {
                    sql::MARK_NOT_SENT
                };
                if execute::<D>(tx, Stmt::new(mark).bind(key).bind(now_ms)).await? == 0 {
                    return Ok(Steered::NotApplicable(t));
                }
                let how = if sent { "sent" } else { "not sent" };
                ("resolved", Some(format!("{action}: {how}")))
            }
        };
        let revive = Stmt::new(sql::REVIVE.as_str()).bind(task).bind(now_ms);
        let revived = decode::task(&one::<D>(tx, revive).await?)?;
        let fence = Some(revived.fence);
        event::<D>(
            tx,
            task,
            kind,
            Some(actor),
            fence,
            now_ms,
            detail.as_deref(),
        )
        .await?;
        Ok(Steered::Done(revived))
    }

    async fn has_due(&self, tenant: &str, queue: &str, now_ms: i64) -> Result<bool, StoreError> {
        let d = &self.0;
        d.bounded(async {
            let s = Stmt::new(sql::HAS_DUE)
                .bind(tenant)
                .bind(queue)
                .bind(now_ms);
            let row = fetch_one::<D>(On::Pool(d.pool()), s)
                .await
                .map_err(|e| d.map(e))?;
            row::get_at(&row, 0)
        })
        .await
    }

    async fn load_task(&self, id: &str) -> Result<Option<TaskRecord>, StoreError> {
        let d = &self.0;
        read_row(d, Stmt::new(sql::TASK.as_str()).bind(id), decode::task).await
    }

    async fn task_events(&self, id: &str) -> Result<Vec<TaskEvent>, StoreError> {
        let d = &self.0;
        read_rows(d, Stmt::new(sql::EVENTS).bind(id), decode::task_event).await
    }

    async fn list_tasks(&self, f: &TaskFilter) -> Result<Vec<TaskRecord>, StoreError> {
        let d = &self.0;
        let (created, id) = match &f.before {
            Some((c, i)) => (Some(*c), Some(i.as_str())),
            None => (None, None),
        };
        let s = Stmt::new(super::texts::<D>().list.as_str())
            .bind(f.queue.as_deref())
            .bind(f.state.map(TaskState::as_str))
            .bind(created)
            .bind(id)
            .bind(i64::from(f.limit));
        read_rows(d, s, decode::task).await
    }

    async fn purge_tasks(&self, before_ms: i64, limit: u32) -> Result<u64, StoreError> {
        let batch = crate::purge::batches::<D>().tasks;
        crate::purge::purge(&self.0, batch, before_ms, limit).await
    }

    async fn count_tasks(&self) -> Result<Vec<(String, TaskState, u64)>, StoreError> {
        let d = &self.0;
        read_rows(d, Stmt::new(sql::COUNT), decode::task_count).await
    }
}
