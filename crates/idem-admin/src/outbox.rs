//! The outbox's lag figures as JSON, with the relay's publish rate when the
//! relay runs in this process: what `GET /admin/v1/outbox`
//! ([`crate::v1::outbox`]) answers and `idem stats` prints.

use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

use anyhow::Context;
use idem_core::outbox::OutboxStore;
use idem_core::{Clock, KeyStore};
use idem_outbox::DispatcherStats;
use serde_json::{Value, json};

/// What the admin API reads of a relay running in this process: its lag
/// figures and publish rate, whatever its broker (this crate knows none).
pub use idem_outbox::RelayFigures;

/// The relay of this process over the store `S`, once it has started
/// (empty until then, and where the relay runs in another process).
pub struct RelaySlot<S> {
    relay: Arc<OnceLock<Arc<dyn RelayFigures>>>,
    store: PhantomData<fn() -> S>,
}

impl<S> Default for RelaySlot<S> {
    fn default() -> Self {
        Self {
            relay: Arc::default(),
            store: PhantomData,
        }
    }
}

impl<S> Clone for RelaySlot<S> {
    fn clone(&self) -> Self {
        Self {
            relay: self.relay.clone(),
            store: PhantomData,
        }
    }
}

impl<S> RelaySlot<S> {
    /// Puts the relay (a [`Dispatcher`](idem_outbox::Dispatcher) over `S`)
    /// in the slot (every clone sees it); gives it back if one is there
    /// already.
    pub fn set(&self, relay: Arc<dyn RelayFigures>) -> Result<(), Arc<dyn RelayFigures>> {
        self.relay.set(relay)
    }

    /// The relay, once it runs.
    pub fn get(&self) -> Option<&Arc<dyn RelayFigures>> {
        self.relay.get()
    }
}

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use idem_core::outbox::{OutboxMessage, OutboxRecord, Topic};
    use idem_outbox::{Dispatcher, DispatcherConfig, Outbox, PublishError, Published, Publisher};
    use idem_sqlite::{SqliteConfig, SqliteStore};

    use super::*;

    /// A broker that takes every message (the slot names no broker).
    struct Accepting;
    impl Publisher for Accepting {
        async fn publish(&self, _: &OutboxRecord) -> Result<Published, PublishError> {
            Ok(Published::default())
        }
    }

    #[tokio::test]
    async fn a_relay_put_in_the_slot_answers_its_figures_through_every_clone() {
        let dir = std::env::temp_dir().join(format!("idem-admin-relay-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}?mode=rwc", dir.join("relay.db").display());
        let store = SqliteStore::connect(&url, SqliteConfig::default())
            .await
            .unwrap();
        store.migrate().await.unwrap();
        let mut tx = store.begin().await.unwrap();
        let event =
            OutboxMessage::new(Topic::new("orders.shipped").unwrap(), "o-1", b"{}".to_vec());
        Outbox::new(store.clone())
            .enqueue(&mut tx, &event.unwrap())
            .await
            .unwrap();
        store.commit(tx).await.unwrap();

        let slot = RelaySlot::<SqliteStore>::default();
        let seen_by = slot.clone();
        assert!(seen_by.get().is_none(), "empty until the relay runs");
        let relay = Dispatcher::new(store, Accepting, DispatcherConfig::default()).unwrap();
        let relay = Arc::new(relay);
        assert_eq!(relay.run_once().await.unwrap().sent, 1);
        assert!(slot.set(relay.clone()).is_ok());
        assert!(slot.set(relay).is_err(), "one relay per slot");

        let figures = seen_by.get().unwrap().stats().await.unwrap();
        assert_eq!((figures.pending, figures.dead), (0, 0));
        assert_eq!(figures.published_total, 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
