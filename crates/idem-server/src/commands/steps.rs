//! `idem steps list|show|resolve|recover`: multi-step runs for operators.

use anyhow::{Context, bail};
use clap::Subcommand;
use idem_core::Clock;
use idem_core::steps::{RunFilter, RunId, RunRecord, RunState, StepRecord};
use idem_steps::{Resolution, ResolveError, resolve};
use serde_json::{Value, json};

use super::args::DbArgs;
use super::checkout::CheckoutArgs;
use crate::backend::{Backend, Job};
use crate::respond::rfc3339;
use crate::shutdown::{self, stopped};

/// `--as` of `idem steps resolve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ResolveAs {
    /// It happened: record the step done; it is never attempted again.
    Sent,
    /// It did not happen: it may be attempted once more.
    NotSent,
}

/// `idem steps`'s subcommands.
#[derive(Subcommand)]
pub enum StepsAction {
    /// List runs, newest first, as JSON lines.
    List {
        #[command(flatten)]
        db: DbArgs,
        /// Only this state: running, compensating, needs_attention,
        /// completed or failed.
        #[arg(long)]
        state: Option<String>,
        /// At most this many (1 to 1000).
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Show one run: its state, lease (holder, fence, until when), failure,
    /// and each step with its state, attempts and derived key.
    Show {
        #[command(flatten)]
        db: DbArgs,
        /// The run's id (`run_…`), or its order's (`ord_…`).
        run: String,
    },
    /// Resolve the step a run in `needs_attention` waits at, after checking
    /// the other system: `--as sent` (it happened; never attempted again)
    /// or `--as not-sent` (it did not; attempted once more). The run is then
    /// resumed by a retry or the recovery worker.
    Resolve {
        #[command(flatten)]
        db: DbArgs,
        /// The run's id (`run_…`), or its order's (`ord_…`).
        run: String,
        /// What the operator found.
        #[arg(long = "as", value_enum)]
        resolution: ResolveAs,
    },
    /// Resume runs whose lease expired, as a process of its own, until
    /// Ctrl-C (`idem serve` does the same; any number may run on one
    /// PostgreSQL database).
    Recover {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        checkout: CheckoutArgs,
    },
}

/// A run id given on the command line: `run_…`, or an order id `ord_…`.
fn run_id(text: &str) -> anyhow::Result<RunId> {
    if let Some(id) = idem_demo::checkout::run_of(text) {
        return Ok(id);
    }
    RunId::parse(text).map_err(|e| anyhow::anyhow!("{e} (or an order id ord_…)"))
}

fn step_json(s: &StepRecord) -> Value {
    json!({
        "name": s.name,
        "kind": s.kind.as_str(),
        "state": s.state.as_str(),
        "attempts": s.attempts,
        "key": s.key,
        "fence": s.fence.0,
        "error": s.error,
        "result": s.result.as_deref().map(|r| {
            serde_json::from_slice::<Value>(r).unwrap_or_else(|_| String::from_utf8_lossy(r).into())
        }),
        "started_at": s.started_at_ms.map(rfc3339),
        "finished_at": s.finished_at_ms.map(rfc3339),
    })
}

/// A run as the command line shows it.
pub fn run_json(r: &RunRecord, steps: bool) -> Value {
    let mut v = json!({
        "id": r.id.as_str(),
        "tenant": r.scope.tenant.as_str(),
        "operation": r.scope.operation.as_str(),
        "key": r.scope.key.as_str(),
        "state": r.state.as_str(),
        "recovery_point": r.recovery_point,
        "failure": r.failure.as_ref().map(|f| json!({"reason": f.reason, "step": f.step, "detail": f.detail})),
        "blocked_step": r.blocked_step,
        "attention": r.attention,
        "no_return": r.no_return,
        "lease": {"holder": r.holder, "fence": r.fence.0, "until": rfc3339(r.locked_until_ms)},
        "takeovers": r.takeovers,
        "deadline": rfc3339(r.deadline_ms),
        "created_at": rfc3339(r.created_at_ms),
        "updated_at": rfc3339(r.updated_at_ms),
        "finished_at": r.finished_at_ms.map(rfc3339),
    });
    if steps {
        v["steps"] = r.steps.iter().map(step_json).collect();
    }
    v
}

impl StepsAction {
    /// Runs the subcommand.
    pub async fn run(self) -> anyhow::Result<()> {
        let (StepsAction::List { db, .. }
        | StepsAction::Show { db, .. }
        | StepsAction::Resolve { db, .. }
        | StepsAction::Recover { db, .. }) = &self;
        if let StepsAction::Recover { checkout, .. } = &self {
            // Checked before the database is touched.
            checkout.config()?.context(
                "idem steps recover needs --provider-url: it runs the checkout's orders",
            )?;
        }
        db.open_existing().await?.run(self).await
    }
}

impl Job for StepsAction {
    type Output = anyhow::Result<()>;
    async fn run<B: Backend>(self, store: B) -> anyhow::Result<()> {
        match self {
            StepsAction::List { state, limit, .. } => {
                let state = match state.as_deref() {
                    None => None,
                    Some(s) => Some(RunState::parse(s).with_context(|| {
                        format!(
                            "--state {s}: expected running, compensating, needs_attention, completed or failed"
                        )
                    })?),
                };
                if !(1..=1000).contains(&limit) {
                    bail!("--limit must be between 1 and 1000");
                }
                for r in store.list_runs(&RunFilter { state, limit }).await? {
                    println!("{}", run_json(&r, false));
                }
            }
            StepsAction::Show { run, .. } => {
                let id = run_id(&run)?;
                match store.load_run(&id).await? {
                    Some(r) => println!("{}", serde_json::to_string_pretty(&run_json(&r, true))?),
                    None => bail!("no run {id}"),
                }
            }
            StepsAction::Resolve {
                run, resolution, ..
            } => {
                let id = run_id(&run)?;
                let how = match resolution {
                    ResolveAs::Sent => Resolution::Sent,
                    ResolveAs::NotSent => Resolution::NotSent,
                };
                match resolve(&store, &id, how, store.clock().now_ms()).await {
                    Ok(done) => println!(
                        "{}",
                        json!({"run": done.run.as_str(), "step": done.step, "state": done.state.as_str(),
                               "resolved_as": match resolution { ResolveAs::Sent => "sent", ResolveAs::NotSent => "not-sent" }})
                    ),
                    Err(ResolveError::Store(e)) => {
                        return Err(anyhow::Error::new(e).context("failed to resolve"));
                    }
                    Err(e) => bail!("{e}"),
                }
            }
            StepsAction::Recover { checkout, .. } => {
                let Some(config) = checkout.config()? else {
                    bail!("idem steps recover needs --provider-url");
                };
                let runs = config.runs(store)?;
                tracing::info!(holder = runs.holder(), operations = ?runs.operations(),
                               "recovering runs whose lease expired, until Ctrl-C");
                runs.recovery().run(stopped(shutdown::on_signal())).await;
            }
        }
        Ok(())
    }
}
