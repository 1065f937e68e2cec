//! The gateway's wiring: `--upstream URL` and the `[gateway]` table of the
//! `--config` file, read into an [`idem_gateway::GatewayConfig`]. A route
//! that cannot be used is refused at start-up, naming the line of its
//! table. The gateway itself is the library crate `idem-gateway`.

use anyhow::bail;
use idem_gateway::{GatewayConfig, RouteSpec};
use serde::Deserialize;

pub use idem_gateway::config::{DEFAULT_OPERATION, DEFAULT_TENANT};

use crate::flags::HttpBase;

/// The `[gateway]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GatewayFile {
    upstream: Option<String>,
    timeout: Option<String>,
    max_body_bytes: Option<usize>,
    max_held_bytes: Option<usize>,
    #[serde(default)]
    routes: Vec<toml::Spanned<RouteSpec>>,
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
    let mut config = GatewayConfig::new(upstream, max_body_bytes);
    let Some((path, text, at, file)) = table else {
        return Ok(Some(config));
    };
    let place = |line: usize| format!("invalid configuration in {} (line {line})", path.display());
    if let Some(t) = &file.timeout {
        let d = humantime::parse_duration(t).map_err(|e| {
            anyhow::anyhow!(
                "{}: gateway.timeout: {t:?} is not a duration ({e})",
                place(line_of(text, at))
            )
        })?;
        config.timeout = d;
    }
    if let Some(n) = file.max_body_bytes {
        if !(1..=crate::flags::MAX_BODY_BYTES_LIMIT).contains(&n) {
            bail!(
                "{}: gateway.max_body_bytes: 1 to {}, got {n}",
                place(line_of(text, at)),
                crate::flags::MAX_BODY_BYTES_LIMIT
            );
        }
        config.max_body_bytes = n;
    }
    if let Some(n) = file.max_held_bytes {
        config.max_held_bytes = n;
    }
    let mut routes = Vec::new();
    let mut lines = Vec::new();
    for (i, route) in file.routes.into_iter().enumerate() {
        let line = line_of(text, route.span().start);
        let route = route
            .into_inner()
            .route()
            .map_err(|e| anyhow::anyhow!("{}: gateway.routes[{i}]: {e}", place(line)))?;
        routes.push(route);
        lines.push(line);
    }
    if !routes.is_empty() {
        config.routes = routes;
    }
    if let Err(e) = config.validate() {
        let line = match &e {
            idem_gateway::GatewayConfigError::Route(i, _) => lines.get(*i).copied(),
            _ => None,
        };
        // A route's error names its setting; a value's names itself.
        let prefix = match &e {
            idem_gateway::GatewayConfigError::Invalid(_) => "",
            _ => "gateway.",
        };
        bail!(
            "{}: {prefix}{e}",
            place(line.unwrap_or_else(|| line_of(text, at)))
        );
    }
    Ok(Some(config))
}

#[cfg(test)]
mod tests;
