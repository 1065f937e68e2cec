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
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use idem_core::outbox::OutboxStore;
use idem_core::steps::{RunState, RunStore};
use idem_core::tasks::{TaskState, TaskStore};
use idem_core::webhooks::WebhookStore;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;

use crate::admin::Auth;

/// The path.
pub const PATH: &str = "/metrics";

/// The buckets of the request-duration histogram, in seconds.
const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Buckets of how long tasks waited to be claimed, and outbox messages to
/// be published: up to an hour.
const CLAIM_LATENCY_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// The process's Prometheus recorder, installed on first use. When another
/// recorder was installed first (an embedding application's), `/metrics`
/// renders an empty recorder of its own rather than failing.
pub fn install() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = builder(idem_core::labels::FORGET_AFTER);
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics shows none");
            }
            describe();
            // Histograms are drained into their buckets by upkeep; a scrape
            // does it too, this bounds the memory between scrapes. Idle
            // series are dropped when the recorder renders: once a minute
            // here, so they go even when nobody scrapes.
            let upkeep = handle.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let mut every = tokio::time::interval(Duration::from_secs(5));
                    for tick in 1u64.. {
                        every.tick().await;
                        if tick % 12 == 0 {
                            drop(upkeep.render());
                        } else {
                            upkeep.run_upkeep();
                        }
                    }
                });
            }
            handle
        })
        .clone()
}

/// The recorder's settings: the buckets, and counters and histograms
/// dropped once idle for `idle` (a series labelled with a request's name
/// goes with the name; it comes back, from 0, when it moves again).
fn builder(idle: Duration) -> PrometheusBuilder {
    let buckets = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_duration_seconds".into()),
            DURATION_BUCKETS,
        )
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(idem_tasks::CLAIM_LATENCY.into()),
                CLAIM_LATENCY_BUCKETS,
            )
        })
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(idem_outbox::PUBLISH_LAG.into()),
                CLAIM_LATENCY_BUCKETS,
            )
        })
        .unwrap_or_else(|_| PrometheusBuilder::new());
    buckets.idle_timeout(
        MetricKindMask::COUNTER | MetricKindMask::HISTOGRAM,
        Some(idle),
    )
}

/// `# HELP` lines for the metrics every scrape shows.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        idem_http::REQUESTS_TOTAL,
        "Requests the idempotency layer answered, by operation and outcome"
    );
    describe_histogram!(
        idem_http::REQUEST_DURATION,
        metrics::Unit::Seconds,
        "Time to answer a request, by operation and outcome"
    );
    describe_gauge!(
        idem_http::BODY_BYTES_BUFFERED,
        metrics::Unit::Bytes,
        "Request body bytes held now (--max-buffered-bytes)"
    );
    describe_counter!(
        idem_http::BODY_BUDGET_REFUSALS,
        "Request bodies refused for want of buffered bytes, by bound (peer: the \
         client address held its share; total)"
    );
    describe_counter!(
        idem_webhooks::DELIVERIES_TOTAL,
        "Webhook deliveries received, by endpoint and result"
    );
    describe_counter!(
        idem_inbox::MESSAGES_TOTAL,
        "Messages the consumer settled, by subscriber and result"
    );
    describe_counter!(
        idem_inbox::REDELIVERIES_TOTAL,
        "Deliveries beyond a message's first that this process's consumer received, by subscriber"
    );
    describe_counter!(
        idem_outbox::PUBLISHED_TOTAL,
        "Outbox messages published and acknowledged"
    );
    describe_histogram!(
        idem_outbox::PUBLISH_LAG,
        metrics::Unit::Seconds,
        "How long messages this process's relay published had waited in the outbox, \
         from their commit to the broker's acknowledgement"
    );
    describe_counter!(
        idemkit::KEYS_PURGED_TOTAL,
        "Expired key records deleted by the collector"
    );
    describe_counter!(
        crate::admin::limit::ATTEMPTS_TOTAL,
        "Admin token attempts (console logins, bearer requests), by way in and result \
         (accepted, refused, locked_out)"
    );
    describe_gauge!(OUTBOX_PENDING, "Outbox messages not yet published");
    describe_gauge!(
        OUTBOX_OLDEST_AGE,
        metrics::Unit::Seconds,
        "Age of the oldest pending outbox message (0 when none)"
    );
    describe_gauge!(OUTBOX_DEAD, "Outbox messages that exhausted their attempts");
    describe_counter!(idem_tasks::CLAIMED_TOTAL, "Tasks claimed, by queue");
    describe_counter!(
        idem_tasks::RECLAIMED_TOTAL,
        "Tasks claimed again after a lease ended or a failure, by queue"
    );
    describe_counter!(
        idem_tasks::FENCED_OUT_TOTAL,
        "Task writes refused because the writer no longer held the task"
    );
    describe_counter!(
        idem_tasks::TAKEOVERS_TOTAL,
        "Tasks taken over because their holder's lease ended, by queue"
    );
    describe_histogram!(
        idem_tasks::CLAIM_LATENCY,
        metrics::Unit::Seconds,
        "How long claimed tasks had been due when claimed, by queue"
    );
    describe_gauge!(RUNS, "Multi-step runs, by state");
    describe_counter!(
        idem_core::labels::DROPPED_TOTAL,
        "Values of a label named by requests recorded as (other): the label had its 500 values"
    );
}

const OUTBOX_PENDING: &str = "idem_outbox_pending";
const OUTBOX_OLDEST_AGE: &str = "idem_outbox_oldest_pending_age_seconds";
const OUTBOX_DEAD: &str = "idem_outbox_dead";
const RUNS: &str = "idem_runs";

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
    fn a_counter_that_stops_moving_is_dropped_after_the_idle_time() {
        let recorder = builder(Duration::from_millis(200)).build_recorder();
        let handle = recorder.handle();
        let count = |queue: &'static str| {
            metrics::with_local_recorder(&recorder, || {
                metrics::counter!("t_claimed_total", "queue" => queue).increment(1);
            });
        };
        count("gone");
        count("busy");
        assert!(handle.render().contains("queue=\"gone\""));
        std::thread::sleep(Duration::from_millis(300));
        count("busy");
        let text = handle.render();
        assert!(!text.contains("queue=\"gone\""), "{text}");
        assert!(text.contains("t_claimed_total{queue=\"busy\"} 2"), "{text}");
    }

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
