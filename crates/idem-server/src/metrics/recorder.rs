//! The process's Prometheus recorder: its buckets, the idle time after
//! which a series that stopped moving is dropped, and the `# HELP` text of
//! every metric a scrape shows.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;

pub(crate) const OUTBOX_PENDING: &str = "idem_outbox_pending";
pub(crate) const OUTBOX_OLDEST_AGE: &str = "idem_outbox_oldest_pending_age_seconds";
pub(crate) const OUTBOX_DEAD: &str = "idem_outbox_dead";
pub(crate) const RUNS: &str = "idem_runs";

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
}
