//! [`Endpoint`]: one webhook endpoint as configured and as checked — its
//! scheme and secrets, its limits, the entity its deliveries name — and how
//! a delivery id becomes the dedupe key stored.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::scheme::{Scheme, Secret, Verifier};

/// One endpoint as written in the configuration file (`[webhooks.<name>]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    /// `github`, `stripe`, `standard`, `shopify` or `slack`.
    pub scheme: Scheme,
    /// Secrets, several at once during a rotation.
    #[serde(default)]
    pub secrets: Vec<Secret>,
    /// An environment variable holding more secrets, comma-separated (keeps
    /// them out of the file).
    pub secrets_env: Option<String>,
    /// Where processing forwards each delivery (`http://…`).
    pub forward_to: Option<String>,
    /// How long one forward may take in seconds — connect, answer and the
    /// body of an error answer (default 10, 1 to 300). Keep it shorter than
    /// the workers' lease.
    pub forward_timeout_secs: Option<u64>,
    /// Timestamp tolerance in seconds, both directions (default 300).
    pub tolerance_secs: Option<u64>,
    /// Largest body accepted (default 1 MiB, at most 16 MiB).
    pub max_body_bytes: Option<usize>,
    /// How long receipts are kept (default 168 = 7 days).
    pub retention_hours: Option<u64>,
    /// JSON pointer to the entity a delivery is about (e.g. `/data/object/id`).
    pub entity_id: Option<String>,
    /// JSON pointer to its version: an integer, or an RFC 3339 timestamp.
    pub entity_version: Option<String>,
}

/// An endpoint setting that is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("webhooks.{endpoint}.{field}: {detail}")]
pub struct EndpointError {
    /// The endpoint.
    pub endpoint: String,
    /// The setting.
    pub field: &'static str,
    /// What is wrong with it.
    pub detail: String,
}

/// A validated endpoint.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Its name, the last segment of `/webhooks/{name}`.
    pub name: String,
    /// Its verifier.
    pub verifier: Verifier,
    /// Where processing forwards deliveries, if anywhere.
    pub forward_to: Option<http::Uri>,
    /// The bound on one forward.
    pub forward_timeout: Duration,
    /// Largest body accepted.
    pub max_body_bytes: usize,
    /// How long receipts are kept.
    pub retention: Duration,
    /// JSON pointers to the entity id and (optionally) its version.
    pub entity: Option<(String, Option<String>)>,
}

/// The largest `max_body_bytes` accepted.
pub const MAX_BODY_LIMIT: usize = 16 << 20;

/// The longest delivery id stored as the provider sent it; a longer one is
/// stored as `sha256:<hex of the id>` (see [`bounded_delivery_id`]).
pub const MAX_DELIVERY_ID_BYTES: usize = 255;

/// The lowercase hex SHA-256 of `bytes`.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The dedupe key stored for a delivery id: the id itself when it is at most
/// [`MAX_DELIVERY_ID_BYTES`] long, else `sha256:<hex of the id>`. The mapping
/// is deterministic, so a repeat of a long id is still a duplicate, and
/// operators may look a delivery up by the id the provider sent.
pub fn bounded_delivery_id(id: &str) -> Cow<'_, str> {
    if id.len() <= MAX_DELIVERY_ID_BYTES {
        Cow::Borrowed(id)
    } else {
        Cow::Owned(format!("sha256:{}", sha256_hex(id.as_bytes())))
    }
}

/// A short text field (event type, entity id) as stored: present only when it
/// is 1 to 255 bytes without control characters. A NUL could not be stored as
/// text on PostgreSQL, and no operator could type the others.
pub(crate) fn short_text(s: &str) -> Option<String> {
    (!s.is_empty() && s.len() <= 255 && !s.chars().any(char::is_control)).then(|| s.to_owned())
}

impl Endpoint {
    /// Whether `name` may name an endpoint: 1 to 64 characters of
    /// `[A-Za-z0-9_-]`.
    pub fn valid_name(name: &str) -> bool {
        !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    }

    /// Validates one endpoint's settings.
    pub fn from_config(name: &str, c: EndpointConfig) -> Result<Self, EndpointError> {
        let err = |field, detail: String| EndpointError {
            endpoint: name.to_owned(),
            field,
            detail,
        };
        if !Self::valid_name(name) {
            return Err(err("name", "1 to 64 characters of [A-Za-z0-9_-]".into()));
        }
        let mut secrets = c.secrets;
        if let Some(var) = &c.secrets_env {
            let value = std::env::var(var).map_err(|_| {
                err(
                    "secrets_env",
                    format!("environment variable {var} is not set"),
                )
            })?;
            secrets.extend(
                value
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(Secret::new),
            );
        }
        let tolerance = Duration::from_secs(c.tolerance_secs.unwrap_or(300));
        if tolerance.is_zero() || tolerance > Duration::from_secs(3600) {
            return Err(err("tolerance_secs", "1 to 3600".into()));
        }
        let verifier = Verifier::new(c.scheme, &secrets, tolerance)
            .map_err(|e| err("secrets", e.to_string()))?;
        let forward_to = match c.forward_to {
            None => None,
            Some(url) => {
                let uri: http::Uri = url.parse().map_err(|e| err("forward_to", format!("{e}")))?;
                if uri.scheme_str() != Some("http") || uri.host().is_none() {
                    return Err(err(
                        "forward_to",
                        "must be an http:// URL (forward to a service in your network; terminate TLS in front of it)".into(),
                    ));
                }
                Some(uri)
            }
        };
        let forward_timeout_secs = c.forward_timeout_secs.unwrap_or(10);
        if !(1..=300).contains(&forward_timeout_secs) {
            return Err(err("forward_timeout_secs", "1 to 300".into()));
        }
        let max_body_bytes = c.max_body_bytes.unwrap_or(1 << 20);
        if max_body_bytes == 0 || max_body_bytes > MAX_BODY_LIMIT {
            return Err(err("max_body_bytes", format!("1 to {MAX_BODY_LIMIT}")));
        }
        let hours = c.retention_hours.unwrap_or(168);
        if !(1..=400 * 24).contains(&hours) {
            return Err(err("retention_hours", "1 to 9600 (400 days)".into()));
        }
        let pointer = |field, p: Option<String>| match p {
            Some(p) if !p.starts_with('/') => {
                Err(err(field, "must be a JSON pointer such as /data/id".into()))
            }
            p => Ok(p),
        };
        let entity = match (
            pointer("entity_id", c.entity_id)?,
            pointer("entity_version", c.entity_version)?,
        ) {
            (Some(id), version) => Some((id, version)),
            (None, Some(_)) => return Err(err("entity_version", "needs entity_id".into())),
            (None, None) => None,
        };
        Ok(Self {
            name: name.to_owned(),
            verifier,
            forward_to,
            forward_timeout: Duration::from_secs(forward_timeout_secs),
            max_body_bytes,
            retention: Duration::from_secs(hours * 3600),
            entity,
        })
    }

    /// The entity id and version a body names, when the endpoint declares
    /// them. A numeric id is its text as the body writes it, every digit
    /// of it (two ids that differ in their 30th digit are two entities); a
    /// numeric version is an integer within `i64`.
    pub fn entity_of(&self, body: &[u8]) -> (Option<String>, Option<i64>) {
        let Some((id_ptr, version_ptr)) = &self.entity else {
            return (None, None);
        };
        let id = json_at(body, id_ptr).and_then(|raw| match raw {
            Json::String(s) => short_text(&s),
            Json::Number(n) => short_text(n),
        });
        let version = version_ptr.as_ref().and_then(|p| match json_at(body, p)? {
            Json::Number(n) => n.parse().ok(),
            Json::String(s) => s.parse().ok().or_else(|| {
                let t = humantime::parse_rfc3339_weak(&s).ok()?;
                let d = t.duration_since(std::time::UNIX_EPOCH).ok()?;
                i64::try_from(d.as_millis()).ok()
            }),
        });
        let version = version.filter(|_| id.is_some());
        (id, version)
    }
}

/// A string or a number of a JSON body.
enum Json<'a> {
    String(String),
    /// As the body writes it.
    Number(&'a str),
}

/// The string or number at the JSON pointer `pointer` (RFC 6901) of
/// `body`; `None` when the body is not JSON or holds something else there.
/// Read through [`RawValue`], so no number goes through an `f64` (which
/// rounds `123456789012345678901234567890` and refuses `1e400`); of
/// duplicated keys the last counts, as with a `serde_json::Value`.
fn json_at<'a>(body: &'a [u8], pointer: &str) -> Option<Json<'a>> {
    let mut at: &'a RawValue = serde_json::from_slice(body).ok()?;
    for step in pointer.split('/').skip(1) {
        let step = step.replace("~1", "/").replace("~0", "~");
        let text = at.get().trim_start();
        at = match text.as_bytes().first()? {
            b'{' => serde_json::from_str::<HashMap<String, &'a RawValue>>(text)
                .ok()?
                .remove(&step)?,
            b'[' => {
                // An index as RFC 6901 writes it: `0`, `17`, not `01` or `+1`.
                let canonical = step == "0" || !step.starts_with(['0', '+']);
                let i: usize = step.parse().ok().filter(|_| canonical)?;
                *serde_json::from_str::<Vec<&'a RawValue>>(text)
                    .ok()?
                    .get(i)?
            }
            _ => return None,
        };
    }
    let text = at.get().trim();
    match text.as_bytes().first()? {
        b'"' => serde_json::from_str(text).ok().map(Json::String),
        b'-' | b'0'..=b'9' => Some(Json::Number(text)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(scheme: Scheme) -> EndpointConfig {
        EndpointConfig {
            scheme,
            secrets: vec![Secret::new("s")],
            secrets_env: None,
            forward_to: None,
            forward_timeout_secs: None,
            tolerance_secs: None,
            max_body_bytes: None,
            retention_hours: None,
            entity_id: None,
            entity_version: None,
        }
    }

    #[test]
    fn settings_are_validated_with_the_field_named() {
        let ok = Endpoint::from_config("github", config(Scheme::Github)).unwrap();
        assert_eq!(
            (ok.max_body_bytes, ok.retention, ok.forward_timeout),
            (
                1 << 20,
                Duration::from_secs(7 * 24 * 3600),
                Duration::from_secs(10)
            )
        );
        let field =
            |name: &str, c: EndpointConfig| Endpoint::from_config(name, c).unwrap_err().field;
        assert_eq!(field("bad name", config(Scheme::Github)), "name");
        assert_eq!(
            field(
                "e",
                EndpointConfig {
                    secrets: vec![],
                    ..config(Scheme::Github)
                }
            ),
            "secrets"
        );
        assert_eq!(
            field(
                "e",
                EndpointConfig {
                    forward_to: Some("https://x/y".into()),
                    ..config(Scheme::Github)
                }
            ),
            "forward_to"
        );
        assert_eq!(
            field(
                "e",
                EndpointConfig {
                    forward_to: Some("not a url".into()),
                    ..config(Scheme::Github)
                }
            ),
            "forward_to"
        );
        assert_eq!(
            field(
                "e",
                EndpointConfig {
                    forward_timeout_secs: Some(0),
                    ..config(Scheme::Github)
                }
            ),
            "forward_timeout_secs"
        );
        assert_eq!(
            field(
                "e",
                EndpointConfig {
                    forward_timeout_secs: Some(301),
                    ..config(Scheme::Github)
                }
            ),
            "forward_timeout_secs"
        );
        assert_eq!(
            field(
                "e",
                EndpointConfig {
                    max_body_bytes: Some(0),
                    ..config(Scheme::Github)
                }
            ),
            "max_body_bytes"
        );
        assert_eq!(
            field(
                "e",
                EndpointConfig {
                    retention_hours: Some(0),
                    ..config(Scheme::Github)
                }
            ),
            "retention_hours"
        );
        assert_eq!(
            field(
                "e",
                EndpointConfig {
                    tolerance_secs: Some(0),
                    ..config(Scheme::Stripe)
                }
            ),
            "tolerance_secs"
        );
        assert_eq!(
            field(
                "e",
                EndpointConfig {
                    entity_id: Some("no-slash".into()),
                    ..config(Scheme::Github)
                }
            ),
            "entity_id"
        );
        assert_eq!(
            field(
                "e",
                EndpointConfig {
                    entity_version: Some("/v".into()),
                    ..config(Scheme::Github)
                }
            ),
            "entity_version"
        );
        assert_eq!(
            field(
                "e",
                EndpointConfig {
                    secrets_env: Some("IDEM_TEST_UNSET_VAR".into()),
                    ..config(Scheme::Github)
                }
            ),
            "secrets_env"
        );
        let err = Endpoint::from_config(
            "e",
            EndpointConfig {
                forward_to: Some("https://x".into()),
                ..config(Scheme::Github)
            },
        )
        .unwrap_err();
        assert!(
            err.to_string().starts_with("webhooks.e.forward_to: "),
            "{err}"
        );
    }

    #[test]
    fn delivery_ids_over_255_bytes_are_hashed_deterministically() {
        let fits = "a".repeat(MAX_DELIVERY_ID_BYTES);
        assert_eq!(bounded_delivery_id(&fits), fits.as_str());
        let long = "a".repeat(MAX_DELIVERY_ID_BYTES + 1);
        let hashed = bounded_delivery_id(&long);
        assert_eq!(hashed, format!("sha256:{}", sha256_hex(long.as_bytes())));
        assert_eq!(hashed.len(), 71);
        assert_eq!(
            hashed,
            bounded_delivery_id(&long),
            "the same id, the same key"
        );
        assert_eq!(
            short_text("push\u{0}"),
            None,
            "event types with control characters are absent"
        );
        assert_eq!(short_text("push").as_deref(), Some("push"));
    }

    #[test]
    fn entity_ids_keep_every_digit() {
        let endpoint = Endpoint::from_config(
            "orders",
            EndpointConfig {
                entity_id: Some("/order/id".into()),
                entity_version: Some("/order/version".into()),
                ..config(Scheme::Github)
            },
        )
        .unwrap();
        let of = |body: &str| endpoint.entity_of(body.as_bytes());
        let big = r#"{"order":{"id":123456789012345678901234567890,"version":2}}"#;
        let next = r#"{"order":{"id":123456789012345678901234567891,"version":1}}"#;
        assert_eq!(
            of(big),
            (Some("123456789012345678901234567890".into()), Some(2))
        );
        assert_eq!(
            of(next),
            (Some("123456789012345678901234567891".into()), Some(1))
        );
        // Ordinary ids as they always were; a number no f64 holds elsewhere
        // in the body does not hide the entity.
        assert_eq!(
            of(r#"{"order":{"id":4242,"version":"7"}}"#),
            (Some("4242".into()), Some(7))
        );
        assert_eq!(
            of(r#"{"fee":1e400,"order":{"id":"o-1","version":3}}"#),
            (Some("o-1".into()), Some(3))
        );
        assert_eq!(
            of(r#"{"order":{"id":{"nested":1},"version":3}}"#),
            (None, None)
        );
    }
}
