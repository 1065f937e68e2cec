//! `GET /metrics`: the process's counters in the Prometheus text format,
//! with gauges read from the store at scrape time.
//!
//! The libraries count through the `metrics` facade; [`install`] puts the
//! Prometheus recorder (no listener of its own: `/metrics` is a route of
//! `idem serve`) in place once per process. The gauges — `idem_outbox_*`,
//! `idem_runs{state}`, `idem_webhook_receipts{endpoint,state}`,
//! `idem_tasks{queue,state}` — are read with one grouped query each when a
//! scrape arrives; the last two are written into the scrape's text as the
//! store has them, so a queue (or endpoint) without rows has no series.
//!
//! Bounded (DESIGN 16): a label a request names (`queue`) takes at most
//! 500 values ([`idem_core::labels`]), and the recorder drops a counter or
//! histogram series that has not moved for [`idem_core::labels::FORGET_AFTER`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use idem_core::outbox::OutboxStore;
use idem_core::steps::{RunState, RunStore};
use idem_core::tasks::{TaskState, TaskStore};
use idem_core::webhooks::WebhookStore;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::admin::Auth;

mod recorder;

pub use recorder::install;
pub(crate) use recorder::{OUTBOX_DEAD, OUTBOX_OLDEST_AGE, OUTBOX_PENDING, RUNS};

/// The path.
pub const PATH: &str = "/metrics";

/// Who may scrape.
#[derive(Clone)]
pub enum Access {
    /// Anyone (`--public-metrics`).
    Public,
    /// Holders of the admin token (the admin guard's rules: hosts, origin,
    /// lockout); nobody when none is configured.
    Token(Arc<Auth>),
}

struct Scrape<S> {
    store: S,
    access: Access,
    handle: PrometheusHandle,
}

/// `GET /metrics` over `store`.
pub fn router<S>(store: S, access: Access, handle: PrometheusHandle) -> Router
where
    S: OutboxStore + RunStore + WebhookStore + TaskStore,
{
    let scrape = Arc::new(Scrape {
        store,
        access,
        handle,
    });
    Router::new()
        .route(PATH, get(metrics_text::<S>))
        .with_state(scrape)
}

async fn metrics_text<S>(State(scrape): State<Arc<Scrape<S>>>, req: Request) -> Response
where
    S: OutboxStore + RunStore + WebhookStore + TaskStore,
{
    if let Access::Token(auth) = &scrape.access
        && let Some(refusal) = crate::admin::auth::refusal(auth, &req)
    {
        return refusal;
    }
    let gauges = scrape.gauges().await.unwrap_or_else(|e| {
        // The counters are still worth a scrape; the recorder's gauges keep
        // their last values, the store's rows are left out, and the log says
        // why.
        tracing::warn!(error = %idem_core::ErrorChain(&e), "metrics gauges not refreshed");
        String::new()
    });
    let mut text = scrape.handle.render();
    text.push_str(&gauges);
    let mut res = (StatusCode::OK, text).into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    res
}

impl<S: OutboxStore + RunStore + WebhookStore + TaskStore> Scrape<S> {
    /// Sets the recorder's gauges from the store and writes the store's
    /// rows (receipts, tasks) as text: four grouped queries.
    async fn gauges(&self) -> Result<String, idem_core::StoreError> {
        let outbox = self.store.stats().await?;
        // By the store's clock, which stamped the messages.
        let now = idem_core::Clock::now_ms(&self.store.clock());
        metrics::gauge!(OUTBOX_PENDING).set(outbox.pending as f64);
        metrics::gauge!(OUTBOX_DEAD).set(outbox.dead as f64);
        let age_ms = outbox
            .oldest_pending_ms
            .map_or(0, |t| now.saturating_sub(t).max(0));
        metrics::gauge!(OUTBOX_OLDEST_AGE).set(age_ms as f64 / 1000.0);

        let runs = self.store.count_runs().await?;
        for state in RunState::ALL {
            let n = runs.iter().find(|(s, _)| s == state).map_or(0, |(_, n)| *n);
            metrics::gauge!(RUNS, "state" => state.as_str()).set(n as f64);
        }

        let mut text = String::new();
        let receipts = self.store.count_receipts().await?;
        let receipts = receipts.into_iter().map(|(endpoint, state, n)| {
            (
                [("endpoint", endpoint), ("state", state.as_str().into())],
                n,
            )
        });
        family(
            &mut text,
            "idem_webhook_receipts",
            "Stored webhook receipts, by endpoint and state",
            receipts,
        );
        let tasks = self.store.count_tasks().await?;
        family(
            &mut text,
            "idem_tasks",
            "Tasks, by queue and state (the queues that have tasks)",
            task_rows(tasks),
        );
        Ok(text)
    }
}

/// Every state of each queue that has tasks, counted under the queue's
/// label value ([`idem_tasks::QUEUE_LABELS`]: 500 queues, the rest summed
/// under `(other)`).
fn task_rows(
    tasks: Vec<(String, TaskState, u64)>,
) -> impl Iterator<Item = ([(&'static str, String); 2], u64)> {
    let mut by_label: BTreeMap<String, [u64; TaskState::ALL.len()]> = BTreeMap::new();
    for (queue, state, n) in tasks {
        let label = idem_tasks::QUEUE_LABELS.value(&queue);
        let i = TaskState::ALL.iter().position(|s| *s == state).unwrap_or(0);
        by_label.entry(label).or_default()[i] += n;
    }
    by_label.into_iter().flat_map(|(queue, counts)| {
        TaskState::ALL
            .into_iter()
            .zip(counts)
            .map(move |(state, n)| {
                (
                    [("queue", queue.clone()), ("state", state.as_str().into())],
                    n,
                )
            })
    })
}

/// One gauge family in the text format: its `# HELP` and `# TYPE` lines and
/// a line per sample (none at all without samples).
fn family<const N: usize>(
    out: &mut String,
    name: &str,
    help: &str,
    samples: impl Iterator<Item = ([(&'static str, String); N], u64)>,
) {
    let mut samples = samples.peekable();
    if samples.peek().is_none() {
        return;
    }
    let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n");
    for (labels, n) in samples {
        let labels: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escaped(v)))
            .collect();
        let _ = writeln!(out, "{name}{{{}}} {n}", labels.join(","));
    }
    out.push('\n');
}

/// A label value as the text format writes it.
fn escaped(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_gauges_keep_500_queues_and_sum_the_rest_under_other() {
        let rows = (0..502)
            .map(|i| (format!("q{i:03}"), TaskState::Ready, 1))
            .collect();
        let mut text = String::new();
        family(&mut text, "idem_tasks", "Tasks", task_rows(rows));
        let ready: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("state=\"ready\""))
            .collect();
        assert_eq!(ready.len(), 501, "500 queues and (other)");
        assert!(
            ready.contains(&"idem_tasks{queue=\"(other)\",state=\"ready\"} 2"),
            "{text}"
        );
        assert!(
            ready.contains(&"idem_tasks{queue=\"q000\",state=\"ready\"} 1"),
            "{text}"
        );
        assert_eq!(escaped("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
