//! The batched purge, written once: every table that expires rows is
//! emptied in batches of at most `$2` rows matching a condition on `$1`
//! (now, or a cutoff). SQLite deletes by `rowid`; PostgreSQL by `ctid`,
//! skipping rows another transaction holds (`FOR UPDATE SKIP LOCKED`), so
//! collectors on several hosts do not queue behind each other.

use idem_core::StoreError;

use crate::dialect::{Dialect, On, Stmt};

macro_rules! batches {
    ($($(#[$doc:meta])* $name:ident / $field:ident: $table:literal where $cond:literal;)*) => {
        /// One dialect's batch statements, by table.
        #[derive(Debug)]
        pub struct Batches {
            $($(#[$doc])* pub $field: &'static str,)*
        }

        /// SQLite's batches.
        pub mod sqlite {
            $($(#[$doc])*
            pub const $name: &str = concat!(
                "DELETE FROM ", $table, " WHERE rowid IN (SELECT rowid FROM ", $table,
                " WHERE ", $cond, " LIMIT $2)"
            );)*
            /// All of them.
            pub const BATCHES: super::Batches = super::Batches { $($field: $name,)* };
        }

        /// PostgreSQL's batches.
        pub mod postgres {
            $($(#[$doc])*
            pub const $name: &str = concat!(
                "DELETE FROM ", $table, " WHERE ctid = ANY(ARRAY(SELECT ctid FROM ", $table,
                " WHERE ", $cond, " LIMIT $2 FOR UPDATE SKIP LOCKED))"
            );)*
            /// All of them.
            pub const BATCHES: super::Batches = super::Batches { $($field: $name,)* };
        }
    };
}

/// The purge's batches in `D`'s SQL family.
pub(crate) fn batches<D: Dialect>() -> &'static Batches {
    D::FAMILY.pick(&sqlite::BATCHES, &postgres::BATCHES)
}

batches! {
    /// Key records past their expiry.
    KEYS / keys: "idem_keys" where "expires_at_ms <= $1";
    /// Final runs past their expiry (their steps go by cascade).
    RUNS / runs: "idem_runs" where "expires_at_ms <= $1 AND state IN ('completed', 'failed')";
    /// Done and dead tasks finished at or before `$1` (their timelines go
    /// by cascade).
    TASKS / tasks: "idem_tasks" where "finished_at_ms <= $1 AND state IN ('done', 'dead')";
    /// Send-once ledger entries past their expiry.
    MESSAGES / messages: "idem_send_once" where "expires_at_ms <= $1";
    /// Inbox records past their expiry.
    INBOX / inbox: "idem_inbox" where "expires_at_ms <= $1";
    /// Sent outbox messages sent at or before `$1`.
    OUTBOX_SENT / outbox_sent: "idem_outbox" where "state = 'sent' AND sent_at_ms <= $1";
    /// Webhook receipts past their expiry.
    RECEIPTS / receipts: "idem_webhook_receipts" where "expires_at_ms <= $1";
    /// Webhook entity versions past their expiry.
    ENTITIES / entities: "idem_webhook_entities" where "expires_at_ms <= $1";
    /// The inbox records of webhook deliveries past their expiry.
    WEBHOOK_INBOX / webhook_inbox: "idem_inbox" where "subscriber_id LIKE 'webhook:%' AND expires_at_ms <= $1";
}

/// Runs one batch: rows matching `before_ms` (`$1`), at most `limit`
/// (`$2`), under the store's deadline; the rows deleted.
pub async fn purge<D: Dialect>(
    d: &D,
    statement: &'static str,
    before_ms: i64,
    limit: u32,
) -> Result<u64, StoreError> {
    d.bounded(async {
        let batch = Stmt::new(statement).bind(before_ms).bind(i64::from(limit));
        D::execute(On::Pool(d.pool()), batch)
            .await
            .map_err(|e| d.map(e))
    })
    .await
}
