//! [`KeyStore`](idem_core::KeyStore) for [`PgStore`], from
//! [`idem_sql::keys`]: the claim reads first on a reader connection, then
//! inserts in the caller's transaction, waiting (bounded by
//! `lock_timeout`) for a concurrent claim of the same key.

use std::time::Duration;

use idem_core::keys::{Claim, Settled, answered_by_read};
use idem_core::{ClaimMode, Completion, Scope, SharedClock, StoreError, StoredRecord};
use idem_sql::decode::record;
use idem_sql::keys::postgres as sql;
use idem_sql::keys::{ClaimRequest, INSERT_COMPLETED, SELECT_RECORD};
use sqlx::Postgres;

use crate::errors::map_err_waited;
use crate::{PgStore, PgTx, map_err};

idem_sql::binders!(Postgres, i32);
idem_sql::key_store!(PgStore, PgTx, postgres;
    /// The database server's clock ([`PgStore::database_clock`]): processes
    /// on hosts whose clocks disagree judge this store's leases alike.
    fn clock(&self) -> SharedClock {
        self.shared_clock.clone()
    }
);

impl PgStore {
    /// The claim, under the deadline (its policy's wait, if longer).
    async fn claim_here(
        &self,
        scope: &Scope,
        r: ClaimRequest<'_>,
    ) -> Result<Claim<PgTx>, StoreError> {
        let deadline = self.deadline_waiting(r.policy.wait);
        self.within(deadline, self.claim_in_tx(scope, r)).await
    }

    /// The optimistic claim's completed record, inserted at the end of the
    /// operation's transaction; it waits for an uncommitted duplicate as a
    /// claim does.
    async fn insert_completed_here(
        &self,
        mut tx: PgTx,
        scope: &Scope,
        r: ClaimRequest<'_>,
        completion: &Completion,
    ) -> Result<Settled, StoreError> {
        let insert = scoped(INSERT_COMPLETED, scope).bind(&r.fingerprint.as_bytes()[..]);
        let insert = outcome(insert, completion)
            .bind(r.now_ms)
            .bind(r.policy.expires_at_ms(r.now_ms));
        let existing = self
            .within(self.deadline_waiting(r.policy.wait), async {
                if insert
                    .fetch_optional(&mut *tx.tx)
                    .await
                    .map_err(map_err)?
                    .is_some()
                {
                    return Ok(None);
                }
                // The conflicting row is locked by the INSERT and committed:
                // READ COMMITTED shows it to the next statement.
                let row = scoped(SELECT_RECORD, scope)
                    .fetch_optional(&mut *tx.tx)
                    .await
                    .map_err(map_err)?;
                match row {
                    Some(row) => record(&row).map(Some),
                    None => Err(StoreError::Busy {
                        waited: Duration::ZERO,
                    }),
                }
            })
            .await?;
        match existing {
            None => self.commit_tx(tx.tx).await.map(|()| Settled::Committed),
            // Dropping the transaction queues its ROLLBACK on the connection.
            Some(record) => Ok(Settled::Existing(record)),
        }
    }

    /// A transaction for business writes, waiting the pool's `lock_timeout`.
    async fn begin_here(&self) -> Result<PgTx, StoreError> {
        let tx = self.bounded(self.begin_waiting(self.lock_timeout)).await?;
        Ok(PgTx { tx })
    }
    /// The claim's first step: one indexed read of the committed record,
    /// on a reader connection (no ping when it goes back; see `readers`).
    async fn read_first(&self, scope: &Scope) -> Result<Option<StoredRecord>, StoreError> {
        let binds = [
            scope.tenant.as_str().to_owned(),
            scope.operation.as_str().to_owned(),
            scope.key.as_str().to_owned(),
        ];
        let row = self
            .readers
            .fetch_optional(SELECT_RECORD, binds)
            .await
            .map_err(map_err)?;
        row.as_ref().map(record).transpose()
    }

    async fn claim_in_tx(
        &self,
        scope: &Scope,
        r: ClaimRequest<'_>,
    ) -> Result<Claim<PgTx>, StoreError> {
        let ClaimRequest {
            fingerprint,
            policy,
            now_ms,
        } = r;
        if let Some(record) = self.read_first(scope).await?
            && answered_by_read(&record, fingerprint, policy, now_ms)
        {
            return Ok(Claim::Existing(record));
        }
        let mut tx = self.begin_waiting(policy.wait).await?;
        if policy.mode == ClaimMode::Optimistic {
            return Ok(Claim::Claimed(PgTx { tx }));
        }
        let claim = |sql: &'static str| {
            scoped(sql, scope)
                .bind(&fingerprint.as_bytes()[..])
                .bind(now_ms)
                .bind(policy.expires_at_ms(now_ms))
        };
        // Between two statements a record can be collected or taken over by
        // another claim; each turn then sees a newer committed state, so a few
        // turns settle it. Usually the first statement decides.
        for _ in 0..3 {
            let inserted = claim(sql::INSERT_CLAIM)
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| map_err_waited(e, policy.wait))?;
            if inserted.is_some() {
                return Ok(Claim::Claimed(PgTx { tx }));
            }
            // READ COMMITTED: this statement sees the row the conflicting
            // transaction committed while our INSERT waited for it.
            let row = scoped(SELECT_RECORD, scope)
                .fetch_optional(&mut *tx)
                .await
                .map_err(map_err)?;
            let Some(row) = row else { continue };
            let record = record(&row)?;
            if record.expires_at_ms > now_ms {
                tx.rollback().await.map_err(map_err)?;
                return Ok(Claim::Existing(record));
            }
            let taken = claim(sql::TAKE_OVER_EXPIRED)
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| map_err_waited(e, policy.wait))?;
            if taken.is_some() {
                return Ok(Claim::Claimed(PgTx { tx }));
            }
        }
        tx.rollback().await.map_err(map_err)?;
        Err(StoreError::Busy {
            waited: policy.wait,
        })
    }
}
