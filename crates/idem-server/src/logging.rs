//! Logs: `RUST_LOG` (`info` by default), as text (colours only on a
//! terminal) or JSON lines (`--log-format json`), one line per request, and
//! with the `otlp` feature the spans sent to an OpenTelemetry collector
//! (`--otlp-endpoint`).

use std::io::IsTerminal;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::response::Response;
use idem_http::RequestOutcome;
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
/// attempt; the relay and the consumer say what is wrong instead).
fn default_filter() -> Targets {
    Targets::new()
        .with_default(LevelFilter::INFO)
        .with_target("async_nats", LevelFilter::WARN)
}

/// Where the route a request matched is noted for its [`RequestLine`],
/// written outside the router: a request extension [`NoteRoute`] fills.
#[derive(Clone, Default)]
struct RouteSlot(Arc<OnceLock<MatchedPath>>);

/// The request log's line for one request, begun as it arrives and
/// written once it is answered: method, route (the matched pattern, not the
/// raw path), status, what the idempotency layer did, and the time taken.
pub struct RequestLine {
    started: Instant,
    method: axum::http::Method,
    route: RouteSlot,
}

impl RequestLine {
    /// Begins the line of `req`; `None` (and nothing done) when
    /// `idem::request` lines are filtered out (`RUST_LOG=warn`).
    pub fn begin(req: &mut Request) -> Option<Self> {
        if !tracing::enabled!(target: "idem::request", tracing::Level::INFO) {
            return None;
        }
        let route = RouteSlot::default();
        req.extensions_mut().insert(route.clone());
        Some(Self {
            started: Instant::now(),
            method: req.method().clone(),
            route,
        })
    }

    /// Writes the line for the answer `res`.
    pub fn end(self, res: &Response) {
        let route = self.route.0.get().map_or("unmatched", MatchedPath::as_str);
        let outcome = res
            .extensions()
            .get::<RequestOutcome>()
            .map_or("-", |o| o.as_str());
        tracing::info!(
            target: "idem::request",
            method = %self.method,
            %route,
            status = res.status().as_u16(),
            %outcome,
            duration_ms = %format_args!("{:.1}", self.started.elapsed().as_secs_f64() * 1000.0),
            "request"
        );
    }
}

/// A layer for each route of a router ([`axum::Router::layer`]): notes the
/// route a request matched for its [`RequestLine`] outside the router. It
/// wraps nothing else.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoteRoute;

impl<S> tower::Layer<S> for NoteRoute {
    type Service = Noted<S>;
    fn layer(&self, inner: S) -> Noted<S> {
        Noted(inner)
    }
}

/// The service of [`NoteRoute`].
#[derive(Debug, Clone)]
pub struct Noted<S>(S);

impl<S, B> tower::Service<axum::http::Request<B>> for Noted<S>
where
    S: tower::Service<axum::http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: axum::http::Request<B>) -> S::Future {
        let ext = req.extensions();
        if let (Some(slot), Some(route)) = (ext.get::<RouteSlot>(), ext.get::<MatchedPath>()) {
            let _ = slot.0.set(route.clone());
        }
        self.0.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
