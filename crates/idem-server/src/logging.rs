//! Logs: `RUST_LOG` (`info` by default), as text (colours only on a
//! terminal) or JSON lines (`--log-format json`), one line per request (`idem_httpd::RequestLine`), and
//! with the `otlp` feature the spans sent to an OpenTelemetry collector
//! (`--otlp-endpoint`).

use std::io::IsTerminal;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::prelude::*;

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines; colours on a terminal.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `fields`,
    /// `span`, `spans`), for a log shipper.
    Json,
}

/// Keeps the trace exporter running; dropping it sends what is buffered.
#[must_use = "dropping the guard stops the trace exporter"]
pub struct LogGuard {
    #[cfg(feature = "otlp")]
    otlp: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        #[cfg(feature = "otlp")]
        if let Some(provider) = self.otlp.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("warning: traces not all sent to the OTLP collector: {e}");
        }
    }
}

/// Installs the log subscriber: the filter from `RUST_LOG` (a level such as
/// `debug`, or `info,idem_http=debug`; default `info`), written to stderr in
/// `format`; with `otlp_endpoint` (an `http://` or `https://` URL; needs the
/// `otlp` feature) spans also go to that OpenTelemetry collector over
/// OTLP/HTTP. Fails only on a bad endpoint or a build without the feature.
pub fn init(format: LogFormat, otlp_endpoint: Option<&str>) -> anyhow::Result<LogGuard> {
    let (filter, bad) = match std::env::var("RUST_LOG") {
        Ok(s) if !s.trim().is_empty() => match s.parse::<Targets>() {
            Ok(t) => (t, None),
            Err(e) => (default_filter(), Some((s, e))),
        },
        _ => (default_filter(), None),
    };
    let stderr = std::io::stderr();
    let text = (format == LogFormat::Text).then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(stderr.is_terminal())
    });
    let json = (format == LogFormat::Json).then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .with_writer(std::io::stderr)
    });
    let (otlp_layer, guard) = otlp(otlp_endpoint)?;
    tracing_subscriber::registry()
        .with(otlp_layer)
        .with(text)
        .with(json)
        .with(filter)
        .init();
    if let Some((value, e)) = bad {
        tracing::warn!(RUST_LOG = %value, error = %e, "RUST_LOG is not a valid filter; logging at info");
    }
    Ok(guard)
}

#[cfg(feature = "otlp")]
type OtlpLayer = tracing_opentelemetry::OpenTelemetryLayer<
    tracing_subscriber::Registry,
    opentelemetry_sdk::trace::Tracer,
>;

#[cfg(not(feature = "otlp"))]
type OtlpLayer = tracing_subscriber::layer::Identity;

/// The OTLP layer for `endpoint`, and the guard that flushes it.
#[cfg(feature = "otlp")]
fn otlp(endpoint: Option<&str>) -> anyhow::Result<(Option<OtlpLayer>, LogGuard)> {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig as _;
    let Some(endpoint) = endpoint else {
        return Ok((None, LogGuard { otlp: None }));
    };
    let url = traces_url(endpoint)?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(url)
        .with_timeout(std::time::Duration::from_secs(10))
        .build()
        .map_err(|e| anyhow::anyhow!("--otlp-endpoint: {e}"))?;
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name("idem")
                .build(),
        )
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("idem"));
    Ok((
        Some(layer),
        LogGuard {
            otlp: Some(provider),
        },
    ))
}

#[cfg(not(feature = "otlp"))]
fn otlp(endpoint: Option<&str>) -> anyhow::Result<(Option<OtlpLayer>, LogGuard)> {
    match endpoint {
        Some(_) => anyhow::bail!(
            "--otlp-endpoint needs an idem built with the otlp feature \
             (cargo install --locked --path crates/idem-server --features otlp)"
        ),
        None => Ok((None, LogGuard {})),
    }
}

/// The collector's traces URL: `endpoint` as given when it names a path,
/// else with the standard `/v1/traces`.
#[cfg_attr(not(feature = "otlp"), allow(dead_code))]
fn traces_url(endpoint: &str) -> anyhow::Result<String> {
    let rest = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))
        .ok_or_else(|| {
            anyhow::anyhow!("--otlp-endpoint {endpoint}: expected http://HOST:PORT or https://…")
        })?;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if authority.is_empty()
        || endpoint
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
    {
        anyhow::bail!("--otlp-endpoint {endpoint}: expected http://HOST:PORT or https://…");
    }
    Ok(if path.is_empty() {
        format!("{}/v1/traces", endpoint.trim_end_matches('/'))
    } else {
        endpoint.to_owned()
    })
}

/// `info`, except the NATS client's own reconnect chatter (one line per
/// attempt; the relay and the consumer say what is wrong instead), and
/// lapin's line for a message RabbitMQ returned, which holds the whole
/// message, payload included (the publisher logs the return without it).
fn default_filter() -> Targets {
    Targets::new()
        .with_default(LevelFilter::INFO)
        .with_target("async_nats", LevelFilter::WARN)
        .with_target("lapin::returned_messages", LevelFilter::OFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lapins_returned_message_lines_holding_payloads_are_off_by_default() {
        use tracing::Level;
        let f = default_filter();
        assert!(!f.would_enable("lapin::returned_messages", &Level::ERROR));
        assert!(f.would_enable("lapin::channel", &Level::WARN));
        assert!(f.would_enable("idem_rabbitmq::publish", &Level::WARN));
        assert!(!f.would_enable("async_nats", &Level::INFO));
    }

    #[test]
    fn traces_url_adds_the_standard_path_or_keeps_one_given() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://127.0.0.1:4318/").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("https://otel.example/custom/path").unwrap(),
            "https://otel.example/custom/path"
        );
        for bad in ["127.0.0.1:4318", "grpc://x:4317", "http://", "http://a b"] {
            assert!(traces_url(bad).is_err(), "{bad}");
        }
    }
}
