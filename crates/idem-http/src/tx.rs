//! The open transaction handed to handlers.

use std::sync::Arc;

use idem_core::Claimed;
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};

/// The transaction the layer opened for a request: a claimed key, kept whole
/// so it goes back to the engine as it came, or a transaction without a key.
#[derive(Debug)]
pub(crate) enum Open<T> {
    /// A key claimed with [`Engine::begin`](idem_core::Engine::begin).
    Keyed(Claimed<T>),
    /// From [`Engine::begin_unkeyed`](idem_core::Engine::begin_unkeyed).
    Unkeyed(T),
}

impl<T> Open<T> {
    fn tx_mut(&mut self) -> &mut T {
        match self {
            Self::Keyed(claimed) => &mut claimed.tx,
            Self::Unkeyed(tx) => tx,
        }
    }
}

/// The open transaction of the current request, as a request extension.
///
/// The layer puts it in the request's extensions before calling the handler and
/// takes it back when the handler has answered, to store the response and
/// commit (or to roll back). Lock it for each use and drop the guard before
/// returning; the crate documentation has a complete handler.
pub struct IdemTx<T>(Arc<Mutex<Option<Open<T>>>>);

impl<T> Clone for IdemTx<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T> std::fmt::Debug for IdemTx<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdemTx")
    }
}

/// The transaction was already finished by the layer (the handler kept the
/// handle past its response).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the request's transaction is already finished")]
pub struct TxFinished;

impl<T> IdemTx<T> {
    pub(crate) fn new(open: Open<T>) -> Self {
        Self(Arc::new(Mutex::new(Some(open))))
    }

    /// Locks the transaction for use.
    pub async fn lock(&self) -> Result<MappedMutexGuard<'_, T>, TxFinished> {
        MutexGuard::try_map(self.0.lock().await, |open| open.as_mut().map(Open::tx_mut))
            .map_err(|_| TxFinished)
    }

    pub(crate) async fn take(&self) -> Option<Open<T>> {
        self.0.lock().await.take()
    }
}
