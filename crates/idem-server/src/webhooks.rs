//! Webhook ingest in `idem serve`: endpoints from a TOML file and the workers
//! that forward stored deliveries. The receive route is
//! [`idem_webhooks::route`]; the operator's routes are [`crate::admin::v1::webhooks`].

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, bail};
use idem_core::SharedClock;
use idem_core::webhooks::WebhookStore;
use idem_webhooks::{Endpoint, EndpointConfig, Forward, Processor, ProcessorConfig};
use serde::Deserialize;

/// The configuration file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    webhooks: BTreeMap<String, EndpointConfig>,
    worker: Option<WorkerConfig>,
    /// `[server]`: read by [`crate::flags::file_defaults`].
    #[allow(dead_code)]
    server: Option<toml::Table>,
    /// `[gateway]`: read by [`crate::gateway::load`].
    #[allow(dead_code)]
    gateway: Option<toml::Table>,
}

/// `[worker]`: how stored deliveries are processed.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkerConfig {
    /// How long a worker holds a delivery (default 60 s, 1 s to 1 h).
    lease_secs: Option<u64>,
    /// Failed forwards before a delivery is dead (default 8, 1 to 100).
    max_attempts: Option<u32>,
    /// Sleep between idle rounds (default 500 ms, 10 ms to 60 s).
    poll_interval_ms: Option<u64>,
    /// Deliveries of one endpoint forwarded at once (default 16, 1 to 256).
    concurrency: Option<u32>,
}

/// Validated webhook settings.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// The endpoints.
    pub endpoints: Vec<Endpoint>,
    /// The workers.
    pub worker: ProcessorConfig,
}

/// Validates the text read from the configuration file at `path`.
pub fn from_text(path: &std::path::Path, text: &str) -> anyhow::Result<WebhookConfig> {
    parse(text).with_context(|| format!("invalid configuration in {}", path.display()))
}

/// `value` within `lo..=hi`, or the file's error naming the key.
fn within(key: &str, value: u64, lo: u64, hi: u64) -> anyhow::Result<()> {
    if !(lo..=hi).contains(&value) {
        bail!("{key}: {lo} to {hi}, got {value}");
    }
    Ok(())
}

/// Validates a configuration given as TOML text.
pub fn parse(text: &str) -> anyhow::Result<WebhookConfig> {
    let file: FileConfig = toml::from_str(text)
        .map_err(|e| anyhow::anyhow!(crate::config_error::redacted(text, &e)))?;
    let mut endpoints = Vec::new();
    for (name, config) in file.webhooks {
        let endpoint = Endpoint::from_config(&name, config)?;
        if endpoint.forward_to.is_none() {
            bail!(
                "webhooks.{name}.forward_to: required by idem serve (Rust handlers are registered through the library)"
            );
        }
        endpoints.push(endpoint);
    }
    // The file's own ranges, in its units (narrower than the library's:
    // a server polls no faster than every 10 ms); the library checks its
    // own bounds on top.
    let mut worker = ProcessorConfig::default();
    if let Some(w) = file.worker {
        if let Some(s) = w.lease_secs {
            within("worker.lease_secs", s, 1, 3600)?;
            worker.lease = Duration::from_secs(s);
        }
        if let Some(n) = w.max_attempts {
            within("worker.max_attempts", n.into(), 1, 100)?;
            worker.max_attempts = n;
        }
        if let Some(ms) = w.poll_interval_ms {
            within("worker.poll_interval_ms", ms, 10, 60_000)?;
            worker.poll_interval = Duration::from_millis(ms);
        }
        if let Some(n) = w.concurrency {
            within("worker.concurrency", n.into(), 1, 256)?;
            worker.concurrency = n;
        }
    }
    worker.validate()?;
    // A forward still running when its lease ends would be forwarded again by
    // another worker at the same time.
    for e in &endpoints {
        if e.forward_timeout >= worker.lease {
            bail!(
                "webhooks.{}.forward_timeout_secs: must be shorter than worker.lease_secs ({} s)",
                e.name,
                worker.lease.as_secs()
            );
        }
    }
    Ok(WebhookConfig { endpoints, worker })
}

/// The workers: each endpoint's deliveries forwarded to its `forward_to`,
/// each endpoint independently of the others.
/// Their claims' leases are judged by `clock` (the store's).
pub fn processor<S: WebhookStore>(
    store: S,
    clock: SharedClock,
    config: &WebhookConfig,
) -> Result<Processor<S, SharedClock>, idem_core::ConfigError> {
    let processor = Processor::with_clock(store, config.worker.clone(), clock)?;
    Ok(config
        .endpoints
        .iter()
        .fold(processor, |p, e| match Forward::for_endpoint(e) {
            Some(forward) => p.handler(&e.name, forward),
            None => p,
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_errors_name_the_setting() {
        let ok = parse(
            r#"
            [webhooks.github]
            scheme = "github"
            secrets = ["a", "b"]
            forward_to = "http://127.0.0.1:9000/hooks/github"
            entity_id = "/repository/id"
            forward_timeout_secs = 4
            [worker]
            lease_secs = 5
            "#,
        )
        .unwrap();
        assert_eq!(ok.endpoints.len(), 1);
        assert_eq!(ok.worker.lease, Duration::from_secs(5));
        let err = |text: &str| format!("{:#}", parse(text).unwrap_err());
        assert!(
            err("[webhooks.x]\nscheme = \"github\"\nsecrets = [\"a\"]")
                .contains("webhooks.x.forward_to")
        );
        assert!(
            err("[webhooks.x]\nscheme = \"gitlab\"\nsecrets = [\"a\"]").contains("unknown variant")
        );
        assert!(err("[webhooks.x]\nscheme = \"github\"\nsecret = \"a\"").contains("unknown field"));
        assert!(err("[worker]\nlease_secs = 0").contains("worker.lease_secs"));
        assert!(err("[worker]\nconcurrency = 0").contains("worker.concurrency"));
        // The file's ranges, narrower than the library's, in the file's units.
        assert!(
            err("[worker]\nconcurrency = 300").contains("worker.concurrency: 1 to 256, got 300")
        );
        assert!(
            err("[worker]\npoll_interval_ms = 5").contains("worker.poll_interval_ms: 10 to 60000")
        );
        assert!(err("[worker]\nmax_attempts = 101").contains("worker.max_attempts: 1 to 100"));
        assert!(err("[worker]\nlease_secs = 99999").contains("worker.lease_secs: 1 to 3600"));
        let slow =
            "[webhooks.x]\nscheme = \"github\"\nsecrets = [\"a\"]\nforward_to = \"http://h/\"\n";
        assert!(
            err(&format!("{slow}[worker]\nlease_secs = 10")).contains(
                "webhooks.x.forward_timeout_secs: must be shorter than worker.lease_secs (10 s)"
            ),
            "the default 10 s forward timeout needs a longer lease"
        );
        assert_eq!(
            parse(&format!(
                "{slow}forward_timeout_secs = 9\n[worker]\nlease_secs = 10"
            ))
            .unwrap()
            .endpoints[0]
                .forward_timeout,
            Duration::from_secs(9)
        );
        assert!(
            err("[webhooks.x]\nscheme = \"github\"\nforward_to = \"http://h/\"")
                .contains("webhooks.x.secrets")
        );
    }
}
