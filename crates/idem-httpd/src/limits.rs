//! [`Limits`]: the bounds of the server, each itself bounded.

use std::time::Duration;

/// The server's limits. [`Limits::default`] holds the documented defaults.
#[derive(Debug, Clone)]
pub struct Limits {
    /// How long a request head may take from its first byte. Default 10 s.
    pub header_read_timeout: Duration,
    /// How long a keep-alive connection may sit without a request. Default 60 s.
    pub idle_timeout: Duration,
    /// How long a request body may take after its head. Default 30 s.
    pub body_read_timeout: Duration,
    /// Connections served at once. Default 1024.
    pub max_connections: usize,
    /// Request body bytes buffered at once, over all requests. Default 64 MiB.
    pub max_buffered_bytes: usize,
    /// Of those, the most one peer holds at once. Default 8 MiB (an eighth).
    pub max_buffered_bytes_per_peer: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_read_timeout: Duration::from_secs(30),
            max_connections: 1024,
            max_buffered_bytes: 64 << 20,
            max_buffered_bytes_per_peer: 8 << 20,
        }
    }
}

/// The most connections `--max-connections` accepts.
pub const MAX_CONNECTIONS_LIMIT: usize = 100_000;
/// The most bytes `--max-buffered-bytes` accepts.
pub const MAX_BUFFERED_BYTES_LIMIT: usize = 16 << 30;

impl Limits {
    /// Checks every bound, and that one request body of `max_body_bytes`
    /// (the largest any route accepts) fits in one peer's share of the
    /// buffered-bytes budget. The error names the flag.
    pub fn validate(&self, max_body_bytes: usize) -> Result<(), String> {
        let second = Duration::from_secs(1);
        idem_core::duration_within(
            "--header-read-timeout",
            self.header_read_timeout,
            second,
            Duration::from_secs(60),
        )?;
        idem_core::duration_within(
            "--idle-timeout",
            self.idle_timeout,
            second,
            Duration::from_secs(3600),
        )?;
        idem_core::duration_within(
            "--body-read-timeout",
            self.body_read_timeout,
            second,
            Duration::from_secs(3600),
        )?;
        if !(1..=MAX_CONNECTIONS_LIMIT).contains(&self.max_connections) {
            return Err(format!(
                "--max-connections must be between 1 and {MAX_CONNECTIONS_LIMIT}, got {}",
                self.max_connections
            ));
        }
        if self.max_buffered_bytes < max_body_bytes
            || self.max_buffered_bytes > MAX_BUFFERED_BYTES_LIMIT
        {
            return Err(format!(
                "--max-buffered-bytes must be between the largest body accepted ({max_body_bytes}) \
                 and {MAX_BUFFERED_BYTES_LIMIT}, got {}",
                self.max_buffered_bytes
            ));
        }
        if self.max_buffered_bytes_per_peer < max_body_bytes
            || self.max_buffered_bytes_per_peer > self.max_buffered_bytes
        {
            return Err(format!(
                "--max-buffered-bytes-per-peer must be between the largest body accepted \
                 ({max_body_bytes}) and --max-buffered-bytes ({}), got {}",
                self.max_buffered_bytes, self.max_buffered_bytes_per_peer
            ));
        }
        Ok(())
    }

    /// The default share of one peer: an eighth of `max_buffered_bytes`, but
    /// at least `max_body_bytes` (one body of the largest size a route
    /// accepts) and at most the whole.
    pub fn default_share(max_buffered_bytes: usize, max_body_bytes: usize) -> usize {
        (max_buffered_bytes / 8)
            .max(max_body_bytes)
            .min(max_buffered_bytes)
    }
}

/// The soft limit on open files of this process, where the system says
/// (Linux: `/proc/self/limits`).
fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Connections need file descriptors, and so do the database pool, the
/// broker and the log: a cap above what the process may open means accepts
/// fail (and the health check with them) before the cap answers 503.
pub(crate) fn check_descriptors(max_connections: usize) {
    const RESERVED: u64 = 64;
    if let Some(limit) = open_files_limit()
        && (max_connections as u64).saturating_add(RESERVED) > limit
    {
        tracing::warn!(
            max_connections,
            open_files_limit = limit,
            "--max-connections is above what the open-file limit leaves for connections; \
             raise it (ulimit -n) or lower --max-connections to at most {}",
            limit.saturating_sub(RESERVED)
        );
    }
}
