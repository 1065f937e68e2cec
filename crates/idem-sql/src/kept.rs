//! [`Kept`]: connections a backend keeps beside sqlx's pool for the key
//! engine's hot path, so that they go back without the ping sqlx's pool
//! sends every connection it gets back.
//!
//! At most `max` are in use at once, one slot each; the idle ones wait on a
//! stack, the most recently used on top (its cache is the warmest and the
//! oldest fall out first). What a connection is — a bare driver connection,
//! or one with its birth time — is the backend's; opening one, and deciding
//! whether a returned one may be kept, too.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Slots and an idle stack of connections `C`.
pub struct Kept<C> {
    idle: Mutex<Vec<C>>,
    slots: Arc<Semaphore>,
    acquire_timeout: Duration,
}

// Not derived: a connection's options can hold a password.
impl<C> std::fmt::Debug for Kept<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kept")
            .field("idle", &self.lock().len())
            .field("free_slots", &self.slots.available_permits())
            .finish_non_exhaustive()
    }
}

impl<C> Kept<C> {
    /// At most `max` connections in use at once; a caller waits at most
    /// `acquire_timeout` for a slot.
    pub fn new(max: u32, acquire_timeout: Duration) -> Self {
        Self {
            idle: Mutex::new(Vec::new()),
            slots: Arc::new(Semaphore::new(max as usize)),
            acquire_timeout,
        }
    }

    /// A slot: [`sqlx::Error::PoolTimedOut`] when none frees up within the
    /// acquire timeout. The slot is held until the permit is dropped.
    pub async fn slot(&self) -> Result<OwnedSemaphorePermit, sqlx::Error> {
        tokio::time::timeout(self.acquire_timeout, self.slots.clone().acquire_owned())
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?
            .map_err(|_| sqlx::Error::PoolClosed)
    }

    /// The most recently used idle connection for which `fit` holds; the
    /// unfit ones are dropped (closed).
    pub fn take(&self, fit: impl FnMut(&C) -> bool) -> Option<C> {
        let mut idle = self.lock();
        idle.retain(fit);
        idle.pop()
    }

    /// Keeps `conn` for the next caller.
    pub fn put(&self, conn: C) {
        self.lock().push(conn);
    }

    /// Drops every idle connection: one of them was found dead, and
    /// whatever ended it (a restart, a failover, a proxy's idle limit) likely
    /// ended its neighbours.
    pub fn forget_idle(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> MutexGuard<'_, Vec<C>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn slots_bound_the_connections_in_use_and_the_stack_returns_the_last_kept() {
        let kept = Kept::<u32>::new(2, Duration::from_millis(20));
        let a = kept.slot().await.map_err(|e| e.to_string());
        let b = kept.slot().await.map_err(|e| e.to_string());
        assert!(a.is_ok() && b.is_ok());
        assert!(matches!(kept.slot().await, Err(sqlx::Error::PoolTimedOut)));
        drop(a);
        assert!(kept.slot().await.is_ok(), "a freed slot is taken again");
        kept.put(1);
        kept.put(2);
        kept.put(3);
        assert_eq!(kept.take(|c| *c != 3), Some(2), "unfit ones are dropped");
        assert_eq!(kept.take(|_| true), Some(1));
        kept.put(4);
        kept.forget_idle();
        assert_eq!(kept.take(|_| true), None);
    }
}
