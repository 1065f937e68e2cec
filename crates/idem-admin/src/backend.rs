//! [`AdminBackend`]: the store capabilities the admin API reads and acts on.

use idem_core::KeyStore;
use idem_core::admin::AdminStore;
use idem_core::inbox::InboxStore;
use idem_core::outbox::OutboxStore;
use idem_core::steps::RunStore;
use idem_core::tasks::TaskStore;
use idem_core::webhooks::WebhookStore;

/// Every store capability the admin routes use: keys (list, show, release),
/// the outbox and inbox, webhook receipts, workflow runs, polling agents'
/// tasks and the audit log.
///
/// Implemented for every store that has them all — `idem_sqlite::SqliteStore`
/// and `idem_postgres::PgStore` — by the blanket impl below; nothing else is
/// asked of the store.
pub trait AdminBackend:
    KeyStore
    + AdminStore
    + OutboxStore
    + InboxStore
    + WebhookStore
    + RunStore
    + TaskStore
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> AdminBackend for S where
    S: KeyStore
        + AdminStore
        + OutboxStore
        + InboxStore
        + WebhookStore
        + RunStore
        + TaskStore
        + Clone
        + Send
        + Sync
        + 'static
{
}
