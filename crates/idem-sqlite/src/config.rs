//! [`SqliteConfig`]: the pool's and the write lock's bounds, checked.

use std::time::Duration;

use idem_core::ConfigError;

/// Connection settings for [`SqliteStore::connect`](crate::SqliteStore::connect), which validates them.
#[derive(Debug, Clone)]
pub struct SqliteConfig {
    /// Connections in the pool (readers run in parallel under WAL), and
    /// the most read-first connections beside it; the key transactions'
    /// writer is one more (see the crate docs). Default 8, 1 to 10 000.
    pub max_connections: u32,
    /// How long to wait for a free connection before `Unavailable`. Default
    /// 5 s, 10 ms to 1 h.
    pub acquire_timeout: Duration,
    /// How long a transaction waits for the database write lock
    /// (`busy_timeout`), and a key transaction for the writer connection.
    /// Default 5 s, at most 1 h.
    pub busy_timeout: Duration,
}

impl Default for SqliteConfig {
    fn default() -> Self {
        Self {
            max_connections: 8,
            acquire_timeout: Duration::from_secs(5),
            busy_timeout: Duration::from_secs(5),
        }
    }
}

impl SqliteConfig {
    /// Checks every bound (called by [`SqliteStore::connect`](crate::SqliteStore::connect)).
    pub fn validate(&self) -> Result<(), ConfigError> {
        const C: &str = "SqliteConfig";
        idem_sql::store::check_pool(C, self.max_connections, self.acquire_timeout)?;
        let hour = Duration::from_secs(3600);
        ConfigError::check_duration(C, "busy_timeout", self.busy_timeout, Duration::ZERO, hour)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_bounded() {
        assert_eq!(SqliteConfig::default().validate(), Ok(()));
        let bad = |c: SqliteConfig| c.validate().unwrap_err().to_string();
        let d = SqliteConfig::default;
        assert_eq!(
            bad(SqliteConfig {
                max_connections: 0,
                ..d()
            }),
            "SqliteConfig.max_connections must be between 1 and 10000, got 0"
        );
        assert_eq!(
            bad(SqliteConfig {
                acquire_timeout: Duration::ZERO,
                ..d()
            }),
            "SqliteConfig.acquire_timeout must be between 10ms and 1h, got 0s"
        );
        assert!(
            bad(SqliteConfig {
                busy_timeout: Duration::from_secs(7200),
                ..d()
            })
            .starts_with("SqliteConfig.busy_timeout")
        );
    }
}
