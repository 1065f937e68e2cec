//! The outbox's write side, as the `Outbox` entry point of `idem-outbox` uses it.

use std::future::Future;

use crate::error::StoreError;
use crate::message::OutboxMessage;
use crate::store::KeyStore;

/// Writes outbox messages in the caller's transaction. Backends implement it
/// with their low-level `outbox::enqueue` function; applications use it
/// through `idem_outbox::Outbox`, which brings the clock.
pub trait OutboxWriter: KeyStore {
    /// Writes `message` in `tx`, created at `now_ms` (available then, unless
    /// the message says later). It is published only if `tx` commits.
    /// Returns the message's outbox id.
    ///
    /// # Cancel safety
    /// Cancelling leaves `tx` in an unknown state: roll it back (or drop it).
    fn enqueue(
        &self,
        tx: &mut Self::Tx,
        message: &OutboxMessage,
        now_ms: i64,
    ) -> impl Future<Output = Result<i64, StoreError>> + Send;
}
