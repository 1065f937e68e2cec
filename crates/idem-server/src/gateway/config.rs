//! The gateway's settings: `--upstream URL`, and the `[gateway]` table of
//! the `--config` file with its routes. Every route key but `method`,
//! `path` and `operation` is optional; a route that cannot be used is
//! refused at start-up, naming the line of its table.

use std::time::Duration;

use anyhow::{Context, bail};
use axum::http::{HeaderName, Method};
use idem_core::leased::OnAbandoned;
use idem_core::{FingerprintSpec, Operation, Policy, Tenant};
use idem_http::{RouteConfig, TenantSource};
use serde::Deserialize;

use crate::config::HttpBase;

/// The tenant of every request when the route names no other source.
pub const DEFAULT_TENANT: &str = "default";
/// The operation of the route `--upstream` alone sets up.
pub const DEFAULT_OPERATION: &str = "gateway";
/// Default lease of a forward: how long it may go without a heartbeat
/// before a retry counts it as abandoned.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(5);
/// Default limit of one forward, from the request sent to the answer read.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The gateway: where to forward, and which routes hold keys.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// `http://HOST:PORT[/PREFIX]`.
    pub upstream: HttpBase,
    /// Keyed routes, the first match wins; anything else passes through.
    pub routes: Vec<Route>,
    /// The limit of one forward.
    pub timeout: Duration,
    /// Largest request body passed through on an unlisted route.
    pub max_body_bytes: usize,
}

/// A keyed route.
#[derive(Debug, Clone)]
pub struct Route {
    /// The method it applies to.
    pub method: Method,
    /// The path it applies to.
    pub path: PathPattern,
    /// Operation, key requirement, TTL and wait, tenant, stored statuses,
    /// fingerprint, body limits: the same settings as the HTTP layer's.
    pub config: RouteConfig,
    /// How long a forward may go without a heartbeat.
    pub lease: Duration,
    /// What a retry does with a forward whose gateway died.
    pub on_unknown: OnAbandoned,
}

impl Route {
    /// Whether the route covers a request.
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        self.method == *method && self.path.matches(path)
    }
}

/// A path: literal segments and `{param}` segments that match any one
/// non-empty segment; `*` matches every path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    segments: Option<Vec<Segment>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param,
}

impl PathPattern {
    /// Every path.
    pub fn any() -> Self {
        Self { segments: None }
    }

    /// Parses `/v1/payments/{id}/refunds`.
    pub fn parse(pattern: &str) -> Result<Self, String> {
        if pattern == "*" {
            return Ok(Self::any());
        }
        let Some(rest) = pattern.strip_prefix('/') else {
            return Err(format!("{pattern:?} does not start with /"));
        };
        if pattern.len() > 1024 {
            return Err("longer than 1024 characters".into());
        }
        let mut segments = Vec::new();
        for s in rest.split('/') {
            if s.starts_with('{') || s.ends_with('}') {
                let name = s
                    .strip_prefix('{')
                    .and_then(|s| s.strip_suffix('}'))
                    .filter(|n| {
                        !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    });
                if name.is_none() {
                    return Err(format!("{pattern:?}: {s:?} is not a {{param}} segment"));
                }
                segments.push(Segment::Param);
            } else if s
                .chars()
                .any(|c| c.is_control() || c == ' ' || c == '?' || c == '#' || c == '{')
            {
                return Err(format!("{pattern:?}: {s:?} is not a path segment"));
            } else {
                segments.push(Segment::Literal(s.to_owned()));
            }
        }
        Ok(Self {
            segments: Some(segments),
        })
    }

    /// Whether `path` (without its query) matches.
    pub fn matches(&self, path: &str) -> bool {
        let Some(segments) = &self.segments else {
            return true;
        };
        let Some(rest) = path.strip_prefix('/') else {
            return false;
        };
        let mut parts = rest.split('/');
        for s in segments {
            match (s, parts.next()) {
                (Segment::Literal(l), Some(p)) if l == p => {}
                (Segment::Param, Some(p)) if !p.is_empty() => {}
                _ => return false,
            }
        }
        parts.next().is_none()
    }
}

/// The `[gateway]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GatewayFile {
    upstream: Option<String>,
    timeout: Option<String>,
    max_body_bytes: Option<usize>,
    #[serde(default)]
    routes: Vec<toml::Spanned<RouteFile>>,
}

/// One `[[gateway.routes]]` table, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteFile {
    method: String,
    path: String,
    operation: String,
    key: Option<String>,
    ttl: Option<String>,
    lease: Option<String>,
    wait: Option<String>,
    on_unknown: Option<String>,
    #[serde(default)]
    ignore_fields: Vec<String>,
    tenant_header: Option<String>,
    tenant: Option<String>,
    store_statuses: Option<Vec<u16>>,
    max_request_bytes: Option<usize>,
    max_response_bytes: Option<usize>,
}

#[derive(Debug, Deserialize)]
struct File {
    // Not `Spanned`: a table that only `[[gateway.routes]]` creates has no
    // span of its own.
    gateway: Option<GatewayFile>,
}

/// The offset of the table's first line: `[gateway]`, else its first
/// `[[gateway.routes]]`.
fn table_start(text: &str) -> usize {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let t = line.trim_start();
        if t.starts_with("[gateway]") || t.starts_with("[[gateway.") || t.starts_with("[gateway.") {
            return offset;
        }
        offset += line.len();
    }
    0
}

fn duration(what: &str, text: &str, lo: Duration, hi: Duration) -> anyhow::Result<Duration> {
    let d = humantime::parse_duration(text)
        .map_err(|e| anyhow::anyhow!("{what}: {text:?} is not a duration ({e})"))?;
    crate::config::within(what, d, lo, hi).map_err(anyhow::Error::msg)
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The gateway of `idem serve`: `upstream` (`--upstream`) wins over the
/// file's; without either there is no gateway. With routes in the file
/// those are the keyed routes; with none, every POST and PATCH is keyed,
/// the key optional.
pub fn load(
    upstream: Option<&str>,
    file: Option<(&std::path::Path, &str)>,
    max_body_bytes: usize,
) -> anyhow::Result<Option<GatewayConfig>> {
    let table = match file {
        Some((path, text)) => {
            let parsed: File = toml::from_str(text).map_err(|e| {
                anyhow::anyhow!(
                    "invalid configuration in {}: {}",
                    path.display(),
                    crate::config_error::redacted(text, &e)
                )
            })?;
            parsed.gateway.map(|g| (path, text, table_start(text), g))
        }
        None => None,
    };
    let Some(url) = upstream.or(table.as_ref().and_then(|t| t.3.upstream.as_deref())) else {
        if let Some((path, text, at, _)) = &table {
            bail!(
                "invalid configuration in {} ([gateway], line {}): upstream: required (or --upstream)",
                path.display(),
                line_of(text, *at)
            );
        }
        return Ok(None);
    };
    let upstream = HttpBase::parse("upstream", url).map_err(|e| match &table {
        // From the file: say where.
        Some((path, text, at, _)) if upstream.is_none() => anyhow::anyhow!(
            "invalid configuration in {} (line {}): gateway.{e}",
            path.display(),
            line_of(text, *at)
        ),
        _ => anyhow::anyhow!("--{e}"),
    })?;
    let mut config = GatewayConfig {
        upstream,
        routes: Vec::new(),
        timeout: DEFAULT_TIMEOUT,
        max_body_bytes,
    };
    let Some((path, text, at, file)) = table else {
        config.routes = default_routes()?;
        return Ok(Some(config));
    };
    let place = |line: usize| format!("invalid configuration in {} (line {line})", path.display());
    if let Some(t) = &file.timeout {
        config.timeout = duration(
            "gateway.timeout",
            t,
            Duration::from_millis(100),
            Duration::from_secs(3600),
        )
        .with_context(|| place(line_of(text, at)))?;
    }
    if let Some(n) = file.max_body_bytes {
        if !(1..=crate::config::MAX_BODY_BYTES_LIMIT).contains(&n) {
            bail!(
                "{}: gateway.max_body_bytes: 1 to {}, got {n}",
                place(line_of(text, at)),
                crate::config::MAX_BODY_BYTES_LIMIT
            );
        }
        config.max_body_bytes = n;
    }
    for (i, route) in file.routes.into_iter().enumerate() {
        let line = line_of(text, route.span().start);
        let route = route_of(route.into_inner())
            .with_context(|| format!("{}: gateway.routes[{i}]", place(line)))?;
        if route.config.policy.ttl < config.timeout + route.lease {
            bail!(
                "{}: gateway.routes[{i}]: ttl must be at least the gateway's timeout plus the \
                 route's lease ({} + {}): a key that expires during its forward is a second \
                 forward",
                place(line),
                crate::duration_text(config.timeout),
                crate::duration_text(route.lease)
            );
        }
        config.routes.push(route);
    }
    if config.routes.is_empty() {
        config.routes = default_routes()?;
    }
    Ok(Some(config))
}

/// Every POST and PATCH, the key optional, one static tenant.
fn default_routes() -> anyhow::Result<Vec<Route>> {
    let tenant = TenantSource::Static(Tenant::new(DEFAULT_TENANT)?);
    let operation = Operation::new(DEFAULT_OPERATION)?;
    Ok([Method::POST, Method::PATCH]
        .into_iter()
        .map(|method| Route {
            method,
            path: PathPattern::any(),
            config: RouteConfig::optional(operation.clone(), tenant.clone()),
            lease: DEFAULT_LEASE,
            on_unknown: OnAbandoned::TakeOver,
        })
        .collect())
}

fn route_of(f: RouteFile) -> anyhow::Result<Route> {
    let method: Method = f
        .method
        .to_ascii_uppercase()
        .parse()
        .map_err(|_| anyhow::anyhow!("method: {:?} is not a method", f.method))?;
    if matches!(
        method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    ) {
        bail!("method: {method} is safe; only unsafe methods take keys");
    }
    let path = PathPattern::parse(&f.path).map_err(|e| anyhow::anyhow!("path: {e}"))?;
    let operation = Operation::new(&f.operation).map_err(|e| anyhow::anyhow!("operation: {e}"))?;
    let tenant = match (&f.tenant_header, &f.tenant) {
        (Some(h), default) => TenantSource::TrustedHeader {
            name: HeaderName::try_from(h.as_str())
                .map_err(|_| anyhow::anyhow!("tenant_header: {h:?} is not a header name"))?,
            default: default
                .as_deref()
                .map(Tenant::new)
                .transpose()
                .map_err(|e| anyhow::anyhow!("tenant: {e}"))?,
        },
        (None, t) => TenantSource::Static(
            Tenant::new(t.as_deref().unwrap_or(DEFAULT_TENANT))
                .map_err(|e| anyhow::anyhow!("tenant: {e}"))?,
        ),
    };
    let mut config = match f.key.as_deref() {
        None | Some("required") => RouteConfig::required(operation, tenant),
        Some("optional") => RouteConfig::optional(operation, tenant),
        Some(other) => bail!("key: {other:?}; expected \"required\" or \"optional\""),
    };
    config.methods = vec![method.clone()];
    let mut policy = Policy::default();
    if let Some(t) = &f.ttl {
        policy = policy.ttl(duration("ttl", t, Duration::from_secs(1), Policy::MAX_TTL)?);
    }
    if let Some(w) = &f.wait {
        policy.wait = duration("wait", w, Duration::ZERO, Policy::MAX_WAIT)?;
    }
    config.policy = policy;
    let mut spec = FingerprintSpec::default();
    for p in &f.ignore_fields {
        spec = spec
            .ignore_field(p)
            .ok_or_else(|| anyhow::anyhow!("ignore_fields: {p:?} is not a JSON pointer"))?;
    }
    config.fingerprint = spec;
    if let Some(statuses) = f.store_statuses {
        if let Some(s) = statuses.iter().find(|s| !(400..=499).contains(*s)) {
            bail!("store_statuses: {s} is not a 4xx status (2xx and 3xx are always stored)");
        }
        config.store_client_errors = statuses.into_iter().collect();
    }
    if let Some(n) = f.max_request_bytes {
        config.max_request_bytes = n;
    }
    if let Some(n) = f.max_response_bytes {
        config.max_response_bytes = n;
    }
    config.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    let lease = match &f.lease {
        Some(l) => duration(
            "lease",
            l,
            Duration::from_millis(500),
            Duration::from_secs(3600),
        )?,
        None => DEFAULT_LEASE,
    };
    let on_unknown = match f.on_unknown.as_deref() {
        None | Some("reforward") => OnAbandoned::TakeOver,
        Some("reject") => OnAbandoned::Stop,
        Some(other) => bail!("on_unknown: {other:?}; expected \"reforward\" or \"reject\""),
    };
    Ok(Route {
        method,
        path,
        config,
        lease,
        on_unknown,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> anyhow::Result<Option<GatewayConfig>> {
        load(
            None,
            Some((std::path::Path::new("idem.toml"), text)),
            1 << 20,
        )
    }

    #[test]
    fn the_documented_file_works_as_written() {
        let text = r#"
[gateway]
upstream = "http://127.0.0.1:9000"

[[gateway.routes]]
method = "POST"
path = "/v1/payments"          # exact, or with {param} segments
operation = "payments.create"
key = "required"               # or "optional"
ttl = "24h"
lease = "2s"                   # how long a forward may be silent before it counts as abandoned
on_unknown = "reforward"       # or "reject"
ignore_fields = ["/client_ts"] # JSON pointers left out of the fingerprint
tenant_header = "X-Tenant-Id"  # set by a trusted component in front; default: one static tenant
"#;
        let g = parse(text).unwrap().unwrap();
        assert_eq!(g.upstream.authority, "127.0.0.1:9000");
        let r = &g.routes[0];
        assert_eq!(
            (r.method.as_str(), r.lease),
            ("POST", Duration::from_secs(2))
        );
        assert!(r.matches(&Method::POST, "/v1/payments"));
        assert!(!r.matches(&Method::POST, "/v1/payments/x"));
        assert!(r.config.key_required);
        assert_eq!(r.on_unknown, OnAbandoned::TakeOver);
        assert!(matches!(
            r.config.tenant,
            TenantSource::TrustedHeader { .. }
        ));
    }

    #[test]
    fn only_method_path_and_operation_are_required() {
        let text = "[gateway]\nupstream = \"http://localhost:9000/api/\"\n\n[[gateway.routes]]\nmethod = \"put\"\npath = \"/v1/things/{id}\"\noperation = \"things.put\"\n";
        let g = parse(text).unwrap().unwrap();
        assert_eq!(g.upstream.prefix, "/api");
        let r = &g.routes[0];
        assert!(r.matches(&Method::PUT, "/v1/things/42"));
        assert!(!r.matches(&Method::PUT, "/v1/things/"));
        assert!(!r.matches(&Method::POST, "/v1/things/42"));
        assert!(r.config.key_required, "required by default");
        assert_eq!(r.lease, DEFAULT_LEASE);
        assert_eq!(r.config.policy.ttl, Policy::DEFAULT_TTL);
    }

    #[test]
    fn upstream_alone_keys_every_post_and_patch_optionally() {
        let g = load(Some("http://127.0.0.1:9000"), None, 1 << 20)
            .unwrap()
            .unwrap();
        assert_eq!(g.routes.len(), 2);
        for r in &g.routes {
            assert!(!r.config.key_required);
            assert!(r.matches(&r.method, "/anything/at/all"));
        }
        assert!(!g.routes.iter().any(|r| r.method == Method::PUT));
        assert!(
            load(None, None, 1).unwrap().is_none(),
            "no upstream, no gateway"
        );
    }

    #[test]
    fn bad_routes_are_refused_naming_their_line() {
        let base = "[gateway]\nupstream = \"http://127.0.0.1:9000\"\n\n[[gateway.routes]]\n";
        for (route, says) in [
            (
                "method = \"GET\"\npath = \"/a\"\noperation = \"a\"\n",
                "safe",
            ),
            (
                "method = \"POST\"\npath = \"a\"\noperation = \"a\"\n",
                "path",
            ),
            (
                "method = \"POST\"\npath = \"/a/{}\"\noperation = \"a\"\n",
                "path",
            ),
            (
                "method = \"POST\"\npath = \"/a\"\noperation = \"\"\n",
                "operation",
            ),
            (
                "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\nkey = \"maybe\"\n",
                "key",
            ),
            (
                "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\nttl = \"soon\"\n",
                "ttl",
            ),
            (
                "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\nlease = \"1ms\"\n",
                "lease",
            ),
            (
                "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\non_unknown = \"pray\"\n",
                "on_unknown",
            ),
            (
                "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\nignore_fields = [\"x\"]\n",
                "ignore_fields",
            ),
            (
                "method = \"POST\"\npath = \"/a\"\noperation = \"a\"\nstore_statuses = [500]\n",
                "store_statuses",
            ),
        ] {
            let err = format!("{:#}", parse(&format!("{base}{route}")).unwrap_err());
            assert!(err.contains("line 4"), "{err}");
            assert!(err.contains(says), "{says}: {err}");
        }
        let err = format!(
            "{:#}",
            parse(&format!("{base}method = \"POST\"\npath = \"/a\"\n")).unwrap_err()
        );
        assert!(err.contains("operation"), "{err}");
        let err = format!(
            "{:#}",
            parse(&format!(
                "{base}method = \"POST\"\npath = \"/a\"\noperation = \"a\"\ncolour = 1\n"
            ))
            .unwrap_err()
        );
        assert!(err.contains("line 8") && err.contains("colour"), "{err}");
    }

    #[test]
    fn routes_without_a_gateway_header_use_the_flag() {
        let text = "[[gateway.routes]]\nmethod = \"POST\"\npath = \"/a\"\noperation = \"a\"\n";
        let g = load(
            Some("http://127.0.0.1:9000"),
            Some((std::path::Path::new("x.toml"), text)),
            1,
        )
        .unwrap()
        .unwrap();
        assert_eq!(g.routes.len(), 1);
        let err = format!("{:#}", parse(text).unwrap_err());
        assert!(err.contains("line 1") && err.contains("upstream"), "{err}");
    }

    #[test]
    fn upstreams_other_than_plain_http_are_refused() {
        for (url, says) in [
            ("ftp://h:1", "expected http"),
            ("https://h:1", "https"),
            ("http://u:p@h:1", "credentials"),
            ("http://h:1/?a=b", "query"),
            ("not a url", "not a URL"),
        ] {
            let err = format!("{:#}", load(Some(url), None, 1).unwrap_err());
            assert!(err.contains(says), "{url}: {err}");
        }
        let err = format!(
            "{:#}",
            parse("\n[gateway]\nupstream = \"ftp://x\"\n").unwrap_err()
        );
        assert!(
            err.contains("line 2") && err.contains("gateway.upstream"),
            "{err}"
        );
        let err = format!("{:#}", parse("[gateway]\ntimeout = \"1s\"\n").unwrap_err());
        assert!(err.contains("line 1") && err.contains("upstream"), "{err}");
    }
}
