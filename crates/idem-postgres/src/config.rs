//! [`PgConfig`]: the pool's, the lock waits' and the timeouts' bounds,
//! checked.

use std::time::Duration;

use idem_core::{ConfigError, Policy};

/// Connection settings for [`PgStore::connect`](crate::PgStore::connect).
#[derive(Debug, Clone)]
pub struct PgConfig {
    /// Connections in the pool. Default 16. Beside it the store keeps up
    /// to as many again for the claims' read-first step and as many for the
    /// key transactions handed to business code (both opened on first use,
    /// kept without a ping), so it opens at most three times this many;
    /// the pool itself serves the autocommit statements (the admin API,
    /// relays, collectors, migrations).
    pub max_connections: u32,
    /// How long to wait for a free connection before `Unavailable`. Default 5 s.
    pub acquire_timeout: Duration,
    /// Default `lock_timeout`, the bound on waiting for a concurrent claim.
    /// Default 5 s, matching [`Policy::DEFAULT_WAIT`].
    pub lock_timeout: Duration,
    /// `statement_timeout` of every connection, and (plus one second) the
    /// client-side deadline of every store call. Default 10 s; 1 s to 1 h, and
    /// longer than `lock_timeout`.
    pub statement_timeout: Duration,
    /// `idle_in_transaction_session_timeout`: the server ends a session that
    /// sits inside a transaction without sending anything for this long (its
    /// client is gone or hung), so the keys it claimed are free again.
    /// Longer than any handler may take between two statements. Default 60 s;
    /// 1 s to 24 h.
    pub idle_in_transaction_timeout: Duration,
}

impl Default for PgConfig {
    fn default() -> Self {
        Self {
            max_connections: 16,
            acquire_timeout: Duration::from_secs(5),
            lock_timeout: Policy::DEFAULT_WAIT,
            statement_timeout: Duration::from_secs(10),
            idle_in_transaction_timeout: Duration::from_secs(60),
        }
    }
}

impl PgConfig {
    /// Checks every bound (called by [`PgStore::connect`](crate::PgStore::connect)).
    pub fn validate(&self) -> Result<(), ConfigError> {
        const C: &str = "PgConfig";
        let (second, hour) = (Duration::from_secs(1), Duration::from_secs(3600));
        idem_sql::store::check_pool(C, self.max_connections, self.acquire_timeout)?;
        ConfigError::check_duration(
            C,
            "lock_timeout",
            self.lock_timeout,
            Duration::from_millis(1),
            Policy::MAX_WAIT,
        )?;
        ConfigError::check_duration(C, "statement_timeout", self.statement_timeout, second, hour)?;
        ConfigError::check_duration(
            C,
            "idle_in_transaction_timeout",
            self.idle_in_transaction_timeout,
            second,
            24 * hour,
        )?;
        if self.statement_timeout <= self.lock_timeout {
            return Err(ConfigError::new(
                C,
                "statement_timeout",
                format!("longer than lock_timeout ({:?})", self.lock_timeout),
                format!("{:?}", self.statement_timeout),
            ));
        }
        Ok(())
    }
}
