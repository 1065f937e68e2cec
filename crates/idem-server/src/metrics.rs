//! `GET /metrics`: the process's counters in the Prometheus text format,
//! with gauges read from the store at scrape time.
//!
//! The libraries count through the `metrics` facade; [`install`] puts the
//! Prometheus recorder (no listener of its own: `/metrics` is a route of
//! `idem serve`) in place once per process. The gauges — `idem_outbox_*`,
//! `idem_runs{state}`, `idem_webhook_receipts{endpoint,state}` — are set
//! from one grouped query each when a scrape arrives.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock};
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
            let builder = PrometheusBuilder::new()
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
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics shows none");
            }
            describe();
            // Histograms are drained into their buckets by upkeep; a scrape
            // does it too, this bounds the memory between scrapes.
            let upkeep = handle.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let mut every = tokio::time::interval(Duration::from_secs(5));
                    loop {
                        every.tick().await;
                        upkeep.run_upkeep();
                    }
                });
            }
            handle
        })
        .clone()
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
    describe_gauge!(TASKS, "Tasks, by queue and state");
    describe_gauge!(RUNS, "Multi-step runs, by state");
    describe_gauge!(RECEIPTS, "Stored webhook receipts, by endpoint and state");
}

const OUTBOX_PENDING: &str = "idem_outbox_pending";
const OUTBOX_OLDEST_AGE: &str = "idem_outbox_oldest_pending_age_seconds";
const OUTBOX_DEAD: &str = "idem_outbox_dead";
const RUNS: &str = "idem_runs";
const TASKS: &str = "idem_tasks";
const RECEIPTS: &str = "idem_webhook_receipts";

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
    /// The `(endpoint, state)` pairs of receipts set before, so a pair
    /// that has none any more is set to 0 rather than left at its last
    /// value.
    receipt_labels: Mutex<BTreeSet<(String, &'static str)>>,
    /// The queues whose task counts were set before: each keeps a value for
    /// every state, 0 once it has none.
    task_queues: Mutex<BTreeSet<String>>,
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
        receipt_labels: Mutex::new(BTreeSet::new()),
        task_queues: Mutex::new(BTreeSet::new()),
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
    if let Err(e) = scrape.gauges().await {
        // The counters are still worth a scrape; the gauges keep their last
        // values and the log says why.
        tracing::warn!(error = %idem_core::ErrorChain(&e), "metrics gauges not refreshed");
    }
    let mut res = (StatusCode::OK, scrape.handle.render()).into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    res
}

impl<S: OutboxStore + RunStore + WebhookStore + TaskStore> Scrape<S> {
    /// Sets the gauges from the store: four grouped queries.
    async fn gauges(&self) -> Result<(), idem_core::StoreError> {
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

        let receipts = self.store.count_receipts().await?;
        {
            let mut seen = self
                .receipt_labels
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let now_set: BTreeSet<(String, &'static str)> = receipts
                .iter()
                .map(|(e, s, _)| (e.clone(), s.as_str()))
                .collect();
            for (endpoint, state) in seen.difference(&now_set) {
                metrics::gauge!(RECEIPTS, "endpoint" => endpoint.clone(), "state" => *state)
                    .set(0.0);
            }
            for (endpoint, state, n) in receipts {
                metrics::gauge!(RECEIPTS, "endpoint" => endpoint, "state" => state.as_str())
                    .set(n as f64);
            }
            seen.extend(now_set);
        }

        let tasks = self.store.count_tasks().await?;
        self.set_task_gauges(&tasks);
        Ok(())
    }

    /// `idem_tasks{queue, state}` for every queue seen so far.
    fn set_task_gauges(&self, tasks: &[(String, TaskState, u64)]) {
        let mut queues = self
            .task_queues
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        queues.extend(tasks.iter().map(|(q, _, _)| q.clone()));
        for queue in queues.iter() {
            for state in TaskState::ALL {
                let n = tasks
                    .iter()
                    .find(|(q, s, _)| q == queue && *s == state)
                    .map_or(0, |(_, _, n)| *n);
                metrics::gauge!(TASKS, "queue" => queue.clone(), "state" => state.as_str())
                    .set(n as f64);
            }
        }
    }
}
