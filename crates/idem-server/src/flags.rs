//! The leaf parsers of the server's settings: the configuration file's
//! reading and its `[server]` table, bounds on durations, addresses and
//! URLs. They import nothing of the server; [`crate::config`] validates
//! the commands' settings with them.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::bail;

/// The largest request body `--max-body-bytes` accepts.
pub const MAX_BODY_BYTES_LIMIT: usize = 64 << 20;

/// The largest configuration file read.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Reads the configuration file, at most 1 MiB.
pub fn read_file(path: &std::path::Path) -> anyhow::Result<String> {
    use anyhow::Context;
    let size = std::fs::metadata(path)
        .with_context(|| format!("failed to read {}", path.display()))?
        .len();
    if size > MAX_CONFIG_BYTES {
        bail!(
            "{} is {size} bytes; the limit is {MAX_CONFIG_BYTES}",
            path.display()
        );
    }
    std::fs::read_to_string(path).with_context(|| format!("failed to read {}", path.display()))
}

/// The `[server]` table of a configuration file as `(setting, value)`
/// pairs, each setting one of `settings` (the flags of `idem serve` without
/// the dashes, `key_ttl` for `--key-ttl`) and each value as it would be typed
/// after the flag. The caller makes them the flags' defaults, so the
/// environment and the command line still win.
pub fn file_defaults(text: &str, settings: &[&str]) -> anyhow::Result<Vec<(String, String)>> {
    #[derive(serde::Deserialize)]
    struct File {
        server: Option<toml::Table>,
    }
    let file: File = toml::from_str(text)
        .map_err(|e| anyhow::anyhow!(crate::config_error::redacted(text, &e)))?;
    let mut out = Vec::new();
    for (key, value) in file.server.unwrap_or_default() {
        if !settings.contains(&key.as_str()) {
            bail!(
                "server.{key}: unknown setting; expected one of {}",
                settings.join(", ")
            );
        }
        let value = match value {
            toml::Value::String(s) => s,
            toml::Value::Integer(n) => n.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            _ => bail!("server.{key}: expected a string, an integer or a boolean"),
        };
        out.push((key, value));
    }
    Ok(out)
}

pub use idem_gateway::HttpBase;

pub use idem_core::duration_within as within;

pub(crate) fn check(r: Result<Duration, String>) -> anyhow::Result<Duration> {
    r.map_err(anyhow::Error::msg)
}

/// `--nats-url`: checked before anything starts.
pub fn nats_url(url: &str) -> anyhow::Result<()> {
    if !(url.starts_with("nats://") || url.starts_with("tls://")) || url.len() > 1024 {
        bail!("--nats-url must be a nats:// or tls:// URL");
    }
    // A list is checked entry by entry now, so a bad one is refused like
    // any other flag (not logged by a process that then exits 0).
    idem_nats::servers(url).map_err(|e| anyhow::anyhow!("--nats-url: {e:#}"))?;
    Ok(())
}

/// `--listen`: an IP address and port, or a host name and port resolved now.
pub fn listen_address(value: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(addr) = value.parse() {
        return Ok(addr);
    }
    let mut addrs = value.to_socket_addrs().map_err(|e| {
        format!("{e}: expected IP:PORT or HOST:PORT, e.g. 127.0.0.1:8080 or localhost:8080")
    })?;
    // Loopback first when the name has both (localhost: 127.0.0.1 and ::1).
    let all: Vec<SocketAddr> = addrs.by_ref().collect();
    all.iter()
        .find(|a| a.is_ipv4())
        .or_else(|| all.first())
        .copied()
        .ok_or_else(|| format!("{value} resolves to no address"))
}

/// The most async worker threads `TOKIO_WORKER_THREADS` may ask for.
pub const MAX_WORKER_THREADS: usize = 1024;

/// `TOKIO_WORKER_THREADS`, read before the runtime starts (tokio itself
/// panics on a value it cannot use): unset is `None` (one worker per CPU),
/// otherwise a whole number from 1 to [`MAX_WORKER_THREADS`].
pub fn worker_threads(value: Option<std::ffi::OsString>) -> anyhow::Result<Option<usize>> {
    let Some(value) = value else { return Ok(None) };
    let text = value.to_string_lossy();
    match text.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_WORKER_THREADS).contains(&n) => Ok(Some(n)),
        _ => bail!(
            "TOKIO_WORKER_THREADS must be a whole number from 1 to {MAX_WORKER_THREADS}, got {text:?}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_threads_are_a_whole_number_from_one() {
        assert_eq!(worker_threads(None).unwrap(), None);
        assert_eq!(worker_threads(Some("1".into())).unwrap(), Some(1));
        assert_eq!(worker_threads(Some(" 4 ".into())).unwrap(), Some(4));
        for bad in ["0", "abc", "-1", "", "1.5", "1025"] {
            let e = worker_threads(Some(bad.into())).unwrap_err().to_string();
            assert!(e.contains("TOKIO_WORKER_THREADS"), "{bad}: {e}");
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }
}
