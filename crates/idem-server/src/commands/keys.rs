//! `idem keys show|resolve|release`: one key record, for operators — above
//! all a gateway forward whose outcome is unknown (the upstream may have
//! acted and no answer came back, or its gateway died, and the route holds
//! such keys: `on_unknown = "reject"` or `"verify"`).

use anyhow::{Context, bail};
use clap::Subcommand;
use idem_core::admin::{NewAudit, ReleaseRequest};
use idem_core::leased::Resolution;
use idem_core::{
    Clock, Completion, IdempotencyKey, KeyStore, Operation, Scope, StoredResponse, Tenant,
};
use serde_json::json;

use super::args::DbArgs;
use crate::admin::v1::keys::{FORCED_WARNING, ReleaseHints, release_refusal};
use crate::backend::{Backend, Job};
use crate::respond::rfc3339;

/// `--as` of `idem keys resolve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ResolveAs {
    /// The upstream did not act on it: delete the record; the next retry
    /// forwards the request again (with the same derived key).
    NotSent,
    /// The upstream acted on it and its answer is lost: every retry gets
    /// 409 `outcome-resolved` saying so (look the result up upstream).
    Sent,
}

/// Which key.
#[derive(clap::Args)]
pub struct KeyArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The tenant (the gateway's default is `default`).
    #[arg(long, default_value = idem_gateway::config::DEFAULT_TENANT)]
    tenant: String,
    /// The operation (the route's `operation`; `gateway` for `--upstream` alone).
    #[arg(long)]
    operation: String,
    /// The client's Idempotency-Key.
    key: String,
}

impl KeyArgs {
    fn scope(&self) -> anyhow::Result<Scope> {
        Ok(Scope::new(
            Tenant::new(&self.tenant).context("--tenant")?,
            Operation::new(&self.operation).context("--operation")?,
            IdempotencyKey::new(&self.key).context("KEY")?,
        ))
    }
}

/// `idem keys`'s subcommands.
#[derive(Subcommand)]
pub enum KeysAction {
    /// Show a key's record: state, lease, stored status, dates.
    Show(KeyArgs),
    /// End a record whose holder died with its outcome unknown (a pending
    /// record whose lease ran out), after checking the upstream:
    /// `--as not-sent` (forward again on the next retry) or `--as sent`
    /// (every retry is told it happened).
    Resolve {
        #[command(flatten)]
        key: KeyArgs,
        /// What the operator found upstream.
        #[arg(long = "as", value_enum)]
        resolution: ResolveAs,
    },
    /// Delete a pending leased record (what the admin API's release does),
    /// so the next retry forwards the request again; written to the audit
    /// log. A live lease only with --force: its holder's writes are fenced
    /// off, but a forward it already sent keeps running upstream and may
    /// still land there. On a route whose upstream does not deduplicate
    /// (on_unknown reject or verify) only with --upstream-checked.
    Release {
        #[command(flatten)]
        key: KeyArgs,
        /// Release a live lease too (its forward may still land upstream).
        #[arg(long)]
        force: bool,
        /// You looked the request up upstream: it did not land (and, with
        /// --force, no forward of it is still running there).
        #[arg(long)]
        upstream_checked: bool,
        /// Who acts, for the audit log (default: cli:$USER).
        #[arg(long)]
        actor: Option<String>,
    },
}

impl KeysAction {
    /// Runs the subcommand.
    pub async fn run(self) -> anyhow::Result<()> {
        let (KeysAction::Show(key)
        | KeysAction::Resolve { key, .. }
        | KeysAction::Release { key, .. }) = &self;
        key.scope()?;
        key.db.open_existing().await?.run(self).await
    }
}

/// The answer retries get after `--as sent`.
fn resolved_sent() -> Completion {
    let body = json!({
        "type": format!("{}outcome-resolved", idem_http::TYPE_BASE),
        "title": "The request was carried out; its answer is lost",
        "status": 409,
        "detail": "an operator confirmed that the upstream acted on the first request with this \
                   Idempotency-Key; its answer was lost; look its result up there",
    });
    Completion::failed(StoredResponse {
        status: 409,
        headers: vec![("content-type".into(), "application/problem+json".into())],
        body: body.to_string().into_bytes(),
    })
}

impl Job for KeysAction {
    type Output = anyhow::Result<()>;
    async fn run<B: Backend>(self, store: B) -> anyhow::Result<()> {
        match self {
            KeysAction::Show(key) => {
                let scope = key.scope()?;
                let Some(r) = KeyStore::fetch(&store, &scope).await? else {
                    bail!("no record for this key (never used, released, or expired)");
                };
                // Judged like the gateways judge it: by the store's clock.
                let now = store.clock().now_ms();
                let abandoned = r.state == idem_core::RecordState::Pending
                    && r.locked_until_ms.is_some_and(|t| t <= now);
                println!(
                    "{}",
                    serde_json::to_string_pretty(&json!({
                        "tenant": key.tenant, "operation": key.operation, "key": key.key,
                        "state": r.state.as_str(),
                        "lease_until": r.locked_until_ms.map(rfc3339),
                        "on_unknown": r.on_unknown.map(|p| p.as_str()),
                        "abandoned": abandoned,
                        "status": r.response.as_ref().map(|s| s.status),
                        "created_at": rfc3339(r.created_at_ms),
                        "expires_at": rfc3339(r.expires_at_ms),
                    }))?
                );
            }
            KeysAction::Resolve { key, resolution } => {
                let scope = key.scope()?;
                let how = match resolution {
                    ResolveAs::NotSent => Resolution::Release,
                    ResolveAs::Sent => Resolution::Answer(resolved_sent()),
                };
                let now = store.clock().now_ms();
                if !store.resolve_abandoned(&scope, &how, now).await? {
                    bail!(
                        "nothing to resolve: the key has no pending record whose lease ran out \
                         (it finished, it is still being forwarded, or it does not exist); \
                         see idem keys show"
                    );
                }
                println!(
                    "{}",
                    json!({"tenant": key.tenant, "operation": key.operation, "key": key.key,
                           "resolved_as": match resolution { ResolveAs::NotSent => "not-sent", ResolveAs::Sent => "sent" }})
                );
            }
            KeysAction::Release {
                key,
                force,
                upstream_checked,
                actor,
            } => release(&store, &key, force, upstream_checked, actor).await?,
        }
        Ok(())
    }
}

/// `idem keys release`: the admin API's release, from the command line,
/// with its audit row in the same transaction.
async fn release<B: Backend>(
    store: &B,
    key: &KeyArgs,
    force: bool,
    upstream_checked: bool,
    actor: Option<String>,
) -> anyhow::Result<()> {
    let scope = key.scope()?;
    let actor = actor.unwrap_or_else(|| {
        format!(
            "cli:{}",
            std::env::var("USER").unwrap_or_else(|_| "unknown".into())
        )
    });
    if actor.is_empty() || actor.len() > 128 || actor.chars().any(char::is_control) {
        bail!("--actor must be 1 to 128 characters without control characters");
    }
    let request = ReleaseRequest {
        force,
        upstream_checked,
    };
    // Judged like every process judges the lease: by the store's clock.
    let now = store.clock().now_ms();
    let mut tx = KeyStore::begin(store).await?;
    let outcome = match B::release_key(&mut tx, &scope, request, now).await {
        Ok(o) => o,
        Err(e) => {
            let _ = KeyStore::rollback(store, tx).await;
            return Err(e.into());
        }
    };
    if let Some(refusal) = release_refusal(&outcome, force, ReleaseHints::CLI) {
        KeyStore::rollback(store, tx).await?;
        bail!("not released ({}): {}", refusal.slug, refusal.detail);
    }
    let target = format!(
        "{}/{}/{}",
        scope.tenant.as_str(),
        scope.operation.as_str(),
        scope.key.as_str()
    );
    let detail = json!({"tenant": key.tenant, "operation": key.operation, "key": key.key,
                        "force": force, "upstream_checked": upstream_checked})
    .to_string();
    let entry = NewAudit {
        // Like the admin API's audit rows: this host's time, read by people.
        at_ms: crate::admin::v1::host_now_ms(),
        actor: &actor,
        action: "keys.release",
        target: &target,
        detail: &detail,
        idempotency_key: None,
    };
    B::insert_audit(&mut tx, &entry).await?;
    KeyStore::commit(store, tx).await?;
    let mut out = json!({"released": true, "tenant": key.tenant, "operation": key.operation,
                         "key": key.key});
    if force {
        out["warning"] = json!(FORCED_WARNING);
    }
    println!("{out}");
    Ok(())
}
