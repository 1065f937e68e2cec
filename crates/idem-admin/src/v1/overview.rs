//! `GET /admin/v1/overview`: request outcomes of the last hour, outbox lag,
//! and counts by state of receipts, runs and key records.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use axum::routing::get;
use axum::{Extension, Router};
use serde_json::{Map, Value, json};

use super::outcomes::{OutcomeRing, WINDOW_MINUTES};
use super::{V1, read};
use crate::backend::AdminBackend;
use crate::respond::{internal, ok, rfc3339};

/// The routes.
pub fn routes<B: AdminBackend>() -> Router<V1<B>> {
    Router::new().route("/admin/v1/overview", get(overview::<B>))
}

/// `{state: count}` over `states` (zero when absent) and any other state
/// the store reported.
fn by_state(states: &[&str], counts: &[(String, u64)]) -> Value {
    let mut m: Map<String, Value> = states.iter().map(|s| ((*s).to_owned(), json!(0))).collect();
    for (s, n) in counts {
        m.insert(s.clone(), json!(n));
    }
    Value::Object(m)
}

async fn overview<B: AdminBackend>(
    State(st): State<V1<B>>,
    ring: Option<Extension<Arc<OutcomeRing>>>,
) -> Response {
    let now = super::host_now_ms();
    let (minutes, totals) = match &ring {
        Some(Extension(ring)) => ring.snapshot(now),
        None => (Vec::new(), Default::default()),
    };
    let counts = match read(st.store.state_counts()).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let outbox = match crate::outbox::store_stats_json(&st.store).await {
        Ok(v) => v,
        Err(e) => return internal(format!("{e:#}")),
    };
    ok(&json!({
        "requests": {
            "window_minutes": WINDOW_MINUTES,
            "outcomes": totals,
            "per_minute": minutes.iter().map(|(at, c)| json!({"minute": rfc3339(*at), "outcomes": c})).collect::<Vec<_>>(),
        },
        "outbox": outbox,
        "webhooks": by_state(&["received", "processed", "failed", "dead", "stale"], &counts.receipts),
        "runs": by_state(&["running", "compensating", "needs_attention", "completed", "failed"], &counts.runs),
        "keys": by_state(&["pending", "completed", "failed"], &counts.keys),
    }))
}
