//! The batched purge, written once: every table that expires rows is
//! emptied in batches of at most `$2` rows matching a condition on `$1`
//! (now, or a cutoff). SQLite deletes by `rowid`; PostgreSQL by `ctid`,
//! skipping rows another transaction holds (`FOR UPDATE SKIP LOCKED`), so
//! collectors on several hosts do not queue behind each other.

macro_rules! batches {
    ($($(#[$doc:meta])* $name:ident: $table:literal where $cond:literal;)*) => {
        /// SQLite's batches.
        pub mod sqlite {
            $($(#[$doc])*
            pub const $name: &str = concat!(
                "DELETE FROM ", $table, " WHERE rowid IN (SELECT rowid FROM ", $table,
                " WHERE ", $cond, " LIMIT $2)"
            );)*
        }

        /// PostgreSQL's batches.
        pub mod postgres {
            $($(#[$doc])*
            pub const $name: &str = concat!(
                "DELETE FROM ", $table, " WHERE ctid = ANY(ARRAY(SELECT ctid FROM ", $table,
                " WHERE ", $cond, " LIMIT $2 FOR UPDATE SKIP LOCKED))"
            );)*
        }
    };
}

batches! {
    /// Key records past their expiry.
    KEYS: "idem_keys" where "expires_at_ms <= $1";
    /// Final runs past their expiry (their steps go by cascade).
    RUNS: "idem_runs" where "expires_at_ms <= $1 AND state IN ('completed', 'failed')";
    /// Done and dead tasks finished at or before `$1` (their timelines go
    /// by cascade).
    TASKS: "idem_tasks" where "finished_at_ms <= $1 AND state IN ('done', 'dead')";
    /// Send-once ledger entries past their expiry.
    MESSAGES: "idem_send_once" where "expires_at_ms <= $1";
    /// Inbox records past their expiry.
    INBOX: "idem_inbox" where "expires_at_ms <= $1";
    /// Sent outbox messages sent at or before `$1`.
    OUTBOX_SENT: "idem_outbox" where "state = 'sent' AND sent_at_ms <= $1";
    /// Webhook receipts past their expiry.
    RECEIPTS: "idem_webhook_receipts" where "expires_at_ms <= $1";
    /// Webhook entity versions past their expiry.
    ENTITIES: "idem_webhook_entities" where "expires_at_ms <= $1";
    /// The inbox records of webhook deliveries past their expiry.
    WEBHOOK_INBOX: "idem_inbox" where "subscriber_id LIKE 'webhook:%' AND expires_at_ms <= $1";
}

/// The store's method that runs one batch: `purge_fn!()` inside an
/// `impl Store` block defines `purge(&self, statement, before_ms, limit)`,
/// answering the rows deleted (under the store's `bounded`, errors through
/// its `map`).
#[macro_export]
macro_rules! purge_fn {
    () => {
        /// Runs one batch of [`idem_sql::purge`]: rows matching `before_ms`
        /// (`$1`), at most `limit` (`$2`).
        pub(crate) async fn purge(
            &self,
            statement: &'static str,
            before_ms: i64,
            limit: u32,
        ) -> Result<u64, idem_core::StoreError> {
            self.bounded(async {
                let done = sqlx::query(statement)
                    .bind(before_ms)
                    .bind(i64::from(limit))
                    .execute(self.pool())
                    .await
                    .map_err(|e| self.map(e))?;
                Ok(done.rows_affected())
            })
            .await
        }
    };
}
