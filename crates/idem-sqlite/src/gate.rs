//! An in-process queue per key, so concurrent requests with one key wait on a
//! notification (bounded by the policy's wait) instead of spinning on SQLite's
//! write lock, and get "in flight" when the wait ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use idem_core::{Scope, StoreError};
use tokio::sync::OwnedMutexGuard;

type Slot = Arc<tokio::sync::Mutex<()>>;

#[derive(Debug, Default)]
pub(crate) struct Gates {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    slots: HashMap<Scope, Weak<tokio::sync::Mutex<()>>>,
    // Dead entries are swept when the map doubles past the size it had after the
    // last sweep, so memory stays proportional to the keys in flight.
    sweep_at: usize,
}

impl Gates {
    pub(crate) async fn enter(
        &self,
        scope: &Scope,
        wait: Duration,
    ) -> Result<OwnedMutexGuard<()>, StoreError> {
        let slot = self.slot(scope);
        tokio::time::timeout(wait, slot.lock_owned())
            .await
            .map_err(|_| StoreError::Busy { waited: wait })
    }

    fn slot(&self, scope: &Scope) -> Slot {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = inner.slots.get(scope).and_then(Weak::upgrade) {
            return slot;
        }
        if inner.slots.len() >= inner.sweep_at.max(1024) {
            inner.slots.retain(|_, w| w.strong_count() > 0);
            inner.sweep_at = inner.slots.len() * 2;
        }
        let slot = Slot::default();
        inner.slots.insert(scope.clone(), Arc::downgrade(&slot));
        slot
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().unwrap().slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{IdempotencyKey, Operation, Tenant};

    fn scope(k: &str) -> Scope {
        Scope::new(
            Tenant::new("t").unwrap(),
            Operation::new("op").unwrap(),
            IdempotencyKey::new(k).unwrap(),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn second_entry_waits_then_times_out_as_busy() {
        let gates = Gates::default();
        let held = gates
            .enter(&scope("a"), Duration::from_secs(1))
            .await
            .unwrap();
        let err = gates
            .enter(&scope("a"), Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Busy { waited } if waited == Duration::from_millis(300)));
        // A different key is not blocked.
        assert!(gates.enter(&scope("b"), Duration::ZERO).await.is_ok());
        drop(held);
        assert!(gates.enter(&scope("a"), Duration::ZERO).await.is_ok());
    }

    #[tokio::test]
    async fn dead_entries_are_swept() {
        let gates = Gates::default();
        for i in 0..5000 {
            drop(
                gates
                    .enter(&scope(&format!("k{i}")), Duration::ZERO)
                    .await
                    .unwrap(),
            );
        }
        assert!(gates.len() <= 2048, "map kept {} entries", gates.len());
    }
}
