//! [`task_store!`](crate::task_store): the [`TaskStore`](idem_core::tasks::TaskStore)
//! implementation both backends expand, over the statements of [`super`].

/// Implements [`TaskStore`](idem_core::tasks::TaskStore) for a backend's
/// store: `task_store!(Store, Tx, sqlite)` (or `postgres`), the dialect's
/// module of this file and of [`crate::runs`] named last.
#[macro_export]
macro_rules! task_store {
    ($store:ty, $tx:ty, $d:ident) => {
        const _: () = {
            use idem_core::StoreError;
            use idem_core::steps::MessageState;
            use idem_core::tasks::{
                ActionAttempt, ActionClaim, ActionDecision, ActionMode, ActionOutcome, AskAnswer,
                AskHolder, ClaimRequest, CursorMove, Fenced, NewTask, PollerRecord, Settle,
                SettlePlan, SettleWrite, Steer, Steered, TaskEvent, TaskFilter, TaskRecord,
                TaskState, TaskStore, decide_ask, held_by_claim, holds, may_give_back, plan_settle,
            };
            use $crate::decode;
            use $crate::tasks as sql;

            /// One timeline entry.
            async fn event(
                tx: &mut $tx,
                task: &str,
                kind: &str,
                actor: Option<&str>,
                fence: Option<i64>,
                at_ms: i64,
                detail: Option<&str>,
            ) -> Result<(), StoreError> {
                sqlx::query(sql::INSERT_EVENT)
                    .bind(task)
                    .bind(kind)
                    .bind(actor)
                    .bind(fence)
                    .bind(at_ms)
                    .bind(detail)
                    .execute(&mut **tx)
                    .await
                    .map(drop)
                    .map_err(map_err)
            }

            /// The task of `tenant`, locked for a write (another tenant's is
            /// none of the caller's business: missing).
            async fn locked(
                tx: &mut $tx,
                tenant: &str,
                task: &str,
            ) -> Result<Option<TaskRecord>, StoreError> {
                let row = sqlx::query(&sql::$d::LOCK_TASK)
                    .bind(task)
                    .fetch_optional(&mut **tx)
                    .await
                    .map_err(map_err)?;
                let t = row.as_ref().map(decode::task).transpose()?;
                Ok(t.filter(|t| t.tenant == tenant))
            }

            /// The holder of `fence` settles `task` as `w` says.
            async fn write(
                tx: &mut $tx,
                t: &TaskRecord,
                fence: i64,
                settle: &Settle<'_>,
                w: SettleWrite,
                now_ms: i64,
            ) -> Result<TaskRecord, StoreError> {
                let q = match (&w, settle) {
                    (SettleWrite::Renew { until_ms }, _) => sqlx::query(&sql::RENEW)
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
                    ) => sqlx::query(&sql::COMPLETE)
                        .bind(&t.id)
                        .bind(fence)
                        .bind(*result)
                        .bind(*result_hash)
                        .bind(now_ms),
                    (SettleWrite::Retry { run_at_ms }, Settle::Fail { error, .. }) => {
                        sqlx::query(&sql::RETRY)
                            .bind(&t.id)
                            .bind(fence)
                            .bind(*run_at_ms)
                            .bind(*error)
                            .bind(now_ms)
                    }
                    (SettleWrite::Dead, Settle::Fail { error, .. }) => sqlx::query(&sql::DEAD)
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
                let row = q.fetch_one(&mut **tx).await.map_err(map_err)?;
                let written = decode::task(&row)?;
                let (kind, detail) = match (&w, settle) {
                    (SettleWrite::Renew { .. }, _) => return Ok(written),
                    (SettleWrite::Complete, _) => ("completed", None),
                    (SettleWrite::Retry { .. }, Settle::Fail { error, .. }) => {
                        ("failed", Some(*error))
                    }
                    (_, Settle::Fail { error, .. }) => ("dead", Some(*error)),
                    _ => ("dead", None),
                };
                event(
                    tx,
                    &t.id,
                    kind,
                    t.holder.as_deref(),
                    Some(fence),
                    now_ms,
                    detail,
                )
                .await?;
                Ok(written)
            }

            impl TaskStore for $store {
                async fn create_task(
                    tx: &mut $tx,
                    task: &NewTask<'_>,
                ) -> Result<(TaskRecord, bool), StoreError> {
                    let row = sqlx::query(&sql::INSERT_TASK)
                        .bind(task.id)
                        .bind(task.tenant)
                        .bind(task.queue)
                        .bind(task.key)
                        .bind(task.payload)
                        .bind(task.payload_hash)
                        .bind(task.priority)
                        .bind(task.run_at_ms)
                        .bind(i64::from(task.max_attempts))
                        .bind(task.now_ms)
                        .fetch_optional(&mut **tx)
                        .await
                        .map_err(map_err)?;
                    if let Some(row) = row {
                        let created = decode::task(&row)?;
                        event(tx, task.id, "created", None, None, task.now_ms, None).await?;
                        return Ok((created, true));
                    }
                    let row = sqlx::query(&sql::TASK_BY_KEY)
                        .bind(task.tenant)
                        .bind(task.queue)
                        .bind(task.key)
                        .fetch_optional(&mut **tx)
                        .await
                        .map_err(map_err)?;
                    match row {
                        Some(row) => Ok((decode::task(&row)?, false)),
                        // The id is taken by another key: not a derived id.
                        None => Err(StoreError::Corrupt {
                            detail: format!("task id {} is another key's", task.id),
                        }),
                    }
                }

                async fn move_cursor(
                    tx: &mut $tx,
                    tenant: &str,
                    poller: &str,
                    expected: Option<&str>,
                    value: &str,
                    now_ms: i64,
                ) -> Result<CursorMove, StoreError> {
                    let moved = match expected {
                        None => {
                            sqlx::query(sql::INSERT_CURSOR)
                                .bind(tenant)
                                .bind(poller)
                                .bind(value)
                                .bind(now_ms)
                                .execute(&mut **tx)
                                .await
                        }
                        Some(from) => {
                            sqlx::query(sql::MOVE_CURSOR)
                                .bind(tenant)
                                .bind(poller)
                                .bind(from)
                                .bind(value)
                                .bind(now_ms)
                                .execute(&mut **tx)
                                .await
                        }
                    }
                    .map_err(map_err)?;
                    if moved.rows_affected() == 1 {
                        return Ok(CursorMove::Moved);
                    }
                    let current: Option<String> = sqlx::query_scalar(
                        "SELECT cursor FROM idem_pollers WHERE tenant_id = $1 AND poller = $2",
                    )
                    .bind(tenant)
                    .bind(poller)
                    .fetch_optional(&mut **tx)
                    .await
                    .map_err(map_err)?;
                    Ok(match current {
                        Some(c) if c == value => CursorMove::AlreadyThere,
                        other => CursorMove::Conflict(other),
                    })
                }

                async fn cursor(
                    &self,
                    tenant: &str,
                    poller: &str,
                ) -> Result<Option<PollerRecord>, StoreError> {
                    self.bounded(async {
                        let row = sqlx::query(sql::CURSOR)
                            .bind(tenant)
                            .bind(poller)
                            .fetch_optional(self.pool())
                            .await
                            .map_err(|e| self.map(e))?;
                        row.as_ref().map(decode::poller).transpose()
                    })
                    .await
                }

                async fn claim_tasks(
                    tx: &mut $tx,
                    claim: &ClaimRequest<'_>,
                ) -> Result<Vec<TaskRecord>, StoreError> {
                    // Tasks that died (their last lease ended) are not
                    // claimed: look again for as many, until none died.
                    let mut claimed = Vec::new();
                    loop {
                        let want = i64::from(claim.max) - claimed.len() as i64;
                        let rows = sqlx::query(&sql::$d::CLAIM)
                            .bind(claim.tenant)
                            .bind(claim.queue)
                            .bind(claim.worker)
                            .bind(claim.now_ms)
                            .bind(claim.lease_ms)
                            .bind(want)
                            .fetch_all(&mut **tx)
                            .await
                            .map_err(map_err)?;
                        let before = claimed.len();
                        for row in &rows {
                            let t = decode::task(row)?;
                            let kind = t.claim_kind.clone().unwrap_or_default();
                            let actor = (t.state == TaskState::Claimed).then_some(claim.worker);
                            event(tx, &t.id, &kind, actor, Some(t.fence), claim.now_ms, None)
                                .await?;
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
                    tx: &mut $tx,
                    tenant: &str,
                    task: &str,
                    fence: i64,
                    settle: &Settle<'_>,
                    now_ms: i64,
                ) -> Result<Fenced, StoreError> {
                    let Some(t) = locked(tx, tenant, task).await? else {
                        return Ok(Fenced::Missing);
                    };
                    match plan_settle(&t, fence, settle, now_ms) {
                        SettlePlan::Refuse(r) => Ok(r.with(t)),
                        SettlePlan::Write(w) => Ok(Fenced::Written(
                            write(tx, &t, fence, settle, w, now_ms).await?,
                        )),
                    }
                }

                async fn claim_action(
                    tx: &mut $tx,
                    a: &ActionAttempt<'_>,
                ) -> Result<ActionClaim, StoreError> {
                    let Some(t) = locked(tx, a.tenant, a.task).await? else {
                        return Ok(ActionClaim::Missing);
                    };
                    if !holds(&t, a.fence, a.now_ms) {
                        return Ok(ActionClaim::LeaseLost(t));
                    }
                    // The entry names the ask told go: only its exact
                    // replay is told go again (the ledger's claim takes a
                    // not-sent entry for this ask, or leaves it as it is).
                    let asker = AskHolder::new(a.task, a.fence, a.ask, a.mode);
                    let row = sqlx::query($crate::runs::$d::CLAIM_MESSAGE)
                        .bind(a.key)
                        .bind(asker.as_str())
                        .bind(a.action)
                        .bind(a.now_ms)
                        .bind(a.expires_at_ms)
                        .fetch_one(&mut **tx)
                        .await
                        .map_err(map_err)?;
                    let entry = decode::message(&row)?;
                    let decision = match decide_ask(entry.state, &entry.run_id, &asker) {
                        AskAnswer::Decided(d) => d,
                        AskAnswer::KeyReused => return Ok(ActionClaim::KeyReused(t)),
                    };
                    let detail = format!("{} {}: {}", a.mode.as_str(), a.action, decision.as_str());
                    event(
                        tx,
                        a.task,
                        "action",
                        t.holder.as_deref(),
                        Some(a.fence),
                        a.now_ms,
                        Some(&detail),
                    )
                    .await?;
                    if decision == ActionDecision::Unknown && a.mode == ActionMode::AtMostOnce {
                        let row = sqlx::query(&sql::ATTENTION)
                            .bind(a.task)
                            .bind(a.fence)
                            .bind(a.now_ms)
                            .fetch_one(&mut **tx)
                            .await
                            .map_err(map_err)?;
                        let why = format!(
                            "the outcome of {} is unknown: check the other system by its key {}",
                            a.action, a.key
                        );
                        event(
                            tx,
                            a.task,
                            "needs_attention",
                            None,
                            Some(a.fence),
                            a.now_ms,
                            Some(&why),
                        )
                        .await?;
                        return Ok(ActionClaim::Decided(decision, decode::task(&row)?));
                    }
                    Ok(ActionClaim::Decided(decision, t))
                }

                async fn record_action(
                    tx: &mut $tx,
                    a: &ActionAttempt<'_>,
                    outcome: ActionOutcome,
                ) -> Result<ActionClaim, StoreError> {
                    let Some(t) = locked(tx, a.tenant, a.task).await? else {
                        return Ok(ActionClaim::Missing);
                    };
                    if !holds(&t, a.fence, a.now_ms) {
                        return Ok(ActionClaim::LeaseLost(t));
                    }
                    // Only what this claim attempted (any of its asks),
                    // or was asked to verify.
                    let entry = sqlx::query(&$crate::runs::MESSAGE)
                        .bind(a.key)
                        .fetch_optional(&mut **tx)
                        .await
                        .map_err(map_err)?;
                    let Some(entry) = entry.as_ref().map(decode::message).transpose()? else {
                        return Ok(ActionClaim::NoAttempt(t));
                    };
                    // A go under this fence is given back by its own ask
                    // alone: any other may look before that one sends.
                    if outcome == ActionOutcome::NotSent
                        && entry.state == MessageState::Sending
                        && !may_give_back(&entry.run_id, a.task, a.fence, a.ask)
                    {
                        return Ok(ActionClaim::InFlight(t));
                    }
                    if !held_by_claim(&entry.run_id, a.task, a.fence) {
                        let asked: bool = sqlx::query_scalar(sql::ASKED_TO_VERIFY)
                            .bind(a.task)
                            .bind(a.fence)
                            .bind(format!(
                                "{} {}: unknown",
                                ActionMode::Verify.as_str(),
                                a.action
                            ))
                            .fetch_one(&mut **tx)
                            .await
                            .map_err(map_err)?;
                        if !asked {
                            return Ok(ActionClaim::NoAttempt(t));
                        }
                    }
                    // Not sent frees the entry for the next ask (told go
                    // then, recorded as that ask's): the report itself is
                    // no go, or a worker acting on it and the next ask
                    // would both send.
                    let (sql_text, name, answer) = match outcome {
                        ActionOutcome::Done => (sql::MARK_SENT, "done", ActionDecision::Done),
                        ActionOutcome::NotSent => {
                            (sql::MARK_NOT_SENT, "not-sent", ActionDecision::Ask)
                        }
                    };
                    let marked = sqlx::query(sql_text)
                        .bind(a.key)
                        .bind(a.now_ms)
                        .execute(&mut **tx)
                        .await
                        .map_err(map_err)?;
                    if marked.rows_affected() == 0 {
                        // Reported not sent, recorded sent: it was done;
                        // reported not sent again: free still.
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
                    event(
                        tx,
                        a.task,
                        "action_result",
                        t.holder.as_deref(),
                        Some(a.fence),
                        a.now_ms,
                        Some(&detail),
                    )
                    .await?;
                    Ok(ActionClaim::Decided(answer, t))
                }

                async fn steer(
                    tx: &mut $tx,
                    task: &str,
                    steer: Steer<'_>,
                    actor: &str,
                    now_ms: i64,
                ) -> Result<Steered, StoreError> {
                    let row = sqlx::query(&sql::$d::LOCK_TASK)
                        .bind(task)
                        .fetch_optional(&mut **tx)
                        .await
                        .map_err(map_err)?;
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
                            let marked = sqlx::query(mark)
                                .bind(key)
                                .bind(now_ms)
                                .execute(&mut **tx)
                                .await
                                .map_err(map_err)?;
                            if marked.rows_affected() == 0 {
                                return Ok(Steered::NotApplicable(t));
                            }
                            let how = if sent { "sent" } else { "not sent" };
                            ("resolved", Some(format!("{action}: {how}")))
                        }
                    };
                    let row = sqlx::query(&sql::REVIVE)
                        .bind(task)
                        .bind(now_ms)
                        .fetch_one(&mut **tx)
                        .await
                        .map_err(map_err)?;
                    let revived = decode::task(&row)?;
                    event(
                        tx,
                        task,
                        kind,
                        Some(actor),
                        Some(revived.fence),
                        now_ms,
                        detail.as_deref(),
                    )
                    .await?;
                    Ok(Steered::Done(revived))
                }

                async fn has_due(
                    &self,
                    tenant: &str,
                    queue: &str,
                    now_ms: i64,
                ) -> Result<bool, StoreError> {
                    self.bounded(async {
                        sqlx::query_scalar(sql::HAS_DUE)
                            .bind(tenant)
                            .bind(queue)
                            .bind(now_ms)
                            .fetch_one(self.pool())
                            .await
                            .map_err(|e| self.map(e))
                    })
                    .await
                }

                async fn load_task(&self, id: &str) -> Result<Option<TaskRecord>, StoreError> {
                    self.bounded(async {
                        let row = sqlx::query(&sql::TASK)
                            .bind(id)
                            .fetch_optional(self.pool())
                            .await
                            .map_err(|e| self.map(e))?;
                        row.as_ref().map(decode::task).transpose()
                    })
                    .await
                }

                async fn task_events(&self, id: &str) -> Result<Vec<TaskEvent>, StoreError> {
                    self.bounded(async {
                        let rows = sqlx::query(sql::EVENTS)
                            .bind(id)
                            .fetch_all(self.pool())
                            .await
                            .map_err(|e| self.map(e))?;
                        rows.iter().map(decode::task_event).collect()
                    })
                    .await
                }

                async fn list_tasks(&self, f: &TaskFilter) -> Result<Vec<TaskRecord>, StoreError> {
                    self.bounded(async {
                        let (created, id) = match &f.before {
                            Some((c, i)) => (Some(*c), Some(i.as_str())),
                            None => (None, None),
                        };
                        let rows = sqlx::query(&sql::$d::LIST)
                            .bind(f.queue.as_deref())
                            .bind(f.state.map(TaskState::as_str))
                            .bind(created)
                            .bind(id)
                            .bind(i64::from(f.limit))
                            .fetch_all(self.pool())
                            .await
                            .map_err(|e| self.map(e))?;
                        rows.iter().map(decode::task).collect()
                    })
                    .await
                }

                async fn purge_tasks(&self, before_ms: i64, limit: u32) -> Result<u64, StoreError> {
                    self.purge($crate::purge::$d::TASKS, before_ms, limit).await
                }

                async fn count_tasks(&self) -> Result<Vec<(String, TaskState, u64)>, StoreError> {
                    self.bounded(async {
                        let rows = sqlx::query(sql::COUNT)
                            .fetch_all(self.pool())
                            .await
                            .map_err(|e| self.map(e))?;
                        rows.iter().map(decode::task_count).collect()
                    })
                    .await
                }
            }
        };
    };
}
