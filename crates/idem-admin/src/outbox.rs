//! The outbox's lag figures as JSON, with the relay's publish rate when the
//! relay runs in this process: what `GET /admin/v1/outbox`
//! ([`crate::v1::outbox`]) answers and `idem stats` prints.

use std::sync::{Arc, OnceLock};

use anyhow::Context;
use idem_core::outbox::OutboxStore;
use idem_core::{Clock, KeyStore, SharedClock};
use idem_nats::NatsPublisher;
use idem_outbox::{Dispatcher, DispatcherStats};
use serde_json::{Value, json};

/// The relay of this process, once it has started.
pub type RelaySlot<S> = Arc<OnceLock<Arc<Dispatcher<S, NatsPublisher, SharedClock>>>>;

/// The relay's figures as JSON.
pub fn stats_json(s: &DispatcherStats) -> Value {
    json!({
        "pending": s.pending,
        "oldest_pending_age_ms": s.oldest_pending_age.map(|d| d.as_millis() as u64),
        "dead": s.dead,
        "published_total": s.published_total,
        "publish_rate_per_sec": (s.publish_rate_per_sec * 100.0).round() / 100.0,
    })
}

/// The outbox's figures as JSON, read from the store (no relay needed); the
/// age by the store's clock, which stamped the messages.
pub async fn store_stats_json<S: OutboxStore + KeyStore>(store: &S) -> anyhow::Result<Value> {
    let s = store.stats().await.context("failed to read the outbox")?;
    let now = store.clock().now_ms();
    Ok(json!({
        "pending": s.pending,
        "oldest_pending_age_ms": s.oldest_pending_ms.map(|t| now.saturating_sub(t).max(0)),
        "dead": s.dead,
    }))
}
