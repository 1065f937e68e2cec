//! Endpoints and the receiving side: body limit → verify → dedupe key →
//! persist the receipt with its inbox record → answer.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::HeaderMap;
use idem_core::webhooks::{Accepted, NewReceipt, WebhookStore};
use idem_core::{Clock, StoreError, SystemClock};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::scheme::{Scheme, Secret, SlackBody, Verifier, VerifyError, slack_body};

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
fn short_text(s: &str) -> Option<String> {
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

    /// The entity id and version a body names, when the endpoint declares them.
    pub fn entity_of(&self, body: &[u8]) -> (Option<String>, Option<i64>) {
        let Some((id_ptr, version_ptr)) = &self.entity else {
            return (None, None);
        };
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
            return (None, None);
        };
        let id = match v.pointer(id_ptr) {
            Some(serde_json::Value::String(s)) => short_text(s),
            Some(serde_json::Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        let version = version_ptr.as_ref().and_then(|p| match v.pointer(p)? {
            serde_json::Value::Number(n) => n.as_i64(),
            serde_json::Value::String(s) => s.parse().ok().or_else(|| {
                let t = humantime::parse_rfc3339_weak(s).ok()?;
                let d = t.duration_since(std::time::UNIX_EPOCH).ok()?;
                i64::try_from(d.as_millis()).ok()
            }),
            _ => None,
        });
        let version = version.filter(|_| id.is_some());
        (id, version)
    }
}

/// Counters of one endpoint since start.
#[derive(Debug, Default)]
pub struct Counters {
    /// New deliveries stored.
    pub accepted: AtomicU64,
    /// Deliveries seen before.
    pub duplicates: AtomicU64,
    /// Deliveries whose signature did not verify (nothing stored).
    pub rejected_signature: AtomicU64,
    /// Deliveries over the body limit (nothing stored).
    pub too_large: AtomicU64,
}

/// The counter of deliveries by endpoint and result (`accepted`,
/// `duplicate`, `bad_signature`, `stale_timestamp`, `too_large`,
/// `url_verification` for an answered Slack handshake).
pub const DELIVERIES_TOTAL: &str = "idem_webhook_deliveries_total";

/// Counts one delivery of a configured endpoint (the name is the
/// configuration's, so the label's values are bounded).
fn count_delivery(endpoint: &str, result: &'static str) {
    metrics::counter!(DELIVERIES_TOTAL, "endpoint" => endpoint.to_owned(), "result" => result)
        .increment(1);
}

/// How often the "signature rejected" line is logged per endpoint, at most.
const REJECTION_LOG_EVERY_MS: i64 = 10_000;

/// Rate limit of a log line: the first event is logged, then at most one line
/// per interval, which says how many events were not logged since the last
/// line. Forgeries cost the sender nothing, so an unthrottled line per forgery
/// would let anyone fill the disk.
#[derive(Debug)]
struct LogLimiter {
    every_ms: i64,
    /// When the last line was logged, and how many events were not since.
    state: std::sync::Mutex<(Option<i64>, u64)>,
}

impl LogLimiter {
    fn new(every_ms: i64) -> Self {
        Self {
            every_ms,
            state: std::sync::Mutex::new((None, 0)),
        }
    }

    /// Whether an event at `now_ms` is logged: `Some(n)` with the `n` events
    /// not logged since the previous line, or `None` (counted, not logged). A
    /// clock that went backwards logs at once rather than staying silent.
    fn admit(&self, now_ms: i64) -> Option<u64> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match state.0 {
            Some(last) if (0..self.every_ms).contains(&now_ms.saturating_sub(last)) => {
                state.1 = state.1.saturating_add(1);
                None
            }
            _ => {
                state.0 = Some(now_ms);
                Some(std::mem::take(&mut state.1))
            }
        }
    }
}

/// How a delivery was taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// Stored now: answer 202.
    New {
        /// Its dedupe key within the endpoint.
        delivery_id: String,
    },
    /// Stored before: answer 200, nothing else happens.
    Duplicate {
        /// Its dedupe key within the endpoint.
        delivery_id: String,
    },
    /// Slack's `url_verification` handshake, signature verified: answer 200
    /// with the challenge. Nothing was stored; nothing is forwarded.
    Challenge {
        /// The `challenge` to echo.
        challenge: String,
    },
}

/// Why a delivery was not taken. Nothing was stored.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReceiveError {
    /// No such endpoint (404).
    #[error("no such webhook endpoint")]
    UnknownEndpoint,
    /// The body is over the endpoint's limit (413).
    #[error("body over {max} bytes")]
    TooLarge {
        /// The limit.
        max: usize,
    },
    /// The signature did not verify (401). The reason is for the log: send
    /// the sender a generic answer, since which check failed (or by how much a
    /// timestamp missed) helps a forger.
    #[error("signature: {0}")]
    Signature(#[from] VerifyError),
    /// A verified Slack `url_verification` whose `challenge` is missing or
    /// unusable (400).
    #[error("url_verification without a usable challenge")]
    BadChallenge,
    /// The store failed (503 when retryable).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Request headers never stored with a receipt, nor shown: credentials, and
/// the providers' signatures (with the body, a signature is a delivery anyone
/// could send again).
const SECRET_HEADERS: &[&str] = &[
    "authorization",
    "cookie",
    "proxy-authorization",
    "stripe-signature",
    "svix-signature",
    "webhook-signature",
    "x-shopify-hmac-sha256",
    "x-slack-signature",
];

/// Whether a request header is a credential or a signature: never stored
/// with a receipt, and left out when showing receipts stored before this
/// rule (`x-hub-signature*`, `stripe-signature`, `webhook-signature`,
/// `svix-signature`,
/// `x-shopify-hmac-sha256`, `x-slack-signature`, `authorization`, `cookie`,
/// `proxy-authorization`).
pub fn is_secret_header(name: &str) -> bool {
    let prefix = "x-hub-signature";
    name.get(..prefix.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(prefix))
        || SECRET_HEADERS.iter().any(|h| h.eq_ignore_ascii_case(name))
}

/// Whether a scheme's deliveries are also deduplicated on their content:
/// those whose delivery id is not covered by the signature and that have no
/// signed timestamp, so a captured delivery could otherwise be resent under
/// any number of new ids.
fn dedupes_on_content(scheme: Scheme) -> bool {
    match scheme {
        Scheme::Github | Scheme::Shopify => true,
        // The id is signed (Standard Webhooks' webhook-id; Stripe's and
        // Slack's ids are in the signed body), and so is a timestamp.
        Scheme::Stripe | Scheme::Standard | Scheme::Slack => false,
    }
}

/// Takes deliveries for a set of endpoints.
#[derive(Debug)]
pub struct Receiver<S, C = SystemClock> {
    store: S,
    clock: C,
    endpoints: BTreeMap<String, (Endpoint, Counters, LogLimiter)>,
}

impl<S: WebhookStore> Receiver<S> {
    /// A receiver on the system clock.
    pub fn new(store: S, endpoints: Vec<Endpoint>) -> Self {
        Self::with_clock(store, endpoints, SystemClock)
    }
}

impl<S: WebhookStore, C: Clock> Receiver<S, C> {
    /// A receiver on its own clock: receipts' times and expiries (on a store
    /// shared across hosts pass the store's,
    /// [`KeyStore::clock`](idem_core::KeyStore::clock)).
    pub fn with_clock(store: S, endpoints: Vec<Endpoint>, clock: C) -> Self {
        Self {
            store,
            clock,
            endpoints: endpoints
                .into_iter()
                .map(|e| {
                    let limiter = LogLimiter::new(REJECTION_LOG_EVERY_MS);
                    (e.name.clone(), (e, Counters::default(), limiter))
                })
                .collect(),
        }
    }

    /// An endpoint by name.
    pub fn endpoint(&self, name: &str) -> Option<&Endpoint> {
        self.endpoints.get(name).map(|(e, _, _)| e)
    }

    /// The endpoints and their counters.
    pub fn counters(&self) -> impl Iterator<Item = (&str, &Counters)> {
        self.endpoints.iter().map(|(n, (_, c, _))| (n.as_str(), c))
    }

    /// Counts a body refused over the limit while it was being read.
    pub fn note_too_large(&self, name: &str) {
        if let Some((e, c, _)) = self.endpoints.get(name) {
            c.too_large.fetch_add(1, Ordering::Relaxed);
            count_delivery(&e.name, "too_large");
        }
    }

    /// Verifies the raw `body` and, when it verifies, stores the receipt and
    /// its inbox record in one transaction before returning.
    ///
    /// # Cancel safety
    /// Cancelling before the commit stores nothing; the sender retries.
    pub async fn receive(
        &self,
        name: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Received, ReceiveError> {
        let (endpoint, counters, rejections) = self
            .endpoints
            .get(name)
            .ok_or(ReceiveError::UnknownEndpoint)?;
        if body.len() > endpoint.max_body_bytes {
            counters.too_large.fetch_add(1, Ordering::Relaxed);
            count_delivery(&endpoint.name, "too_large");
            return Err(ReceiveError::TooLarge {
                max: endpoint.max_body_bytes,
            });
        }
        let now_ms = self.clock.now_ms();
        let verified = match endpoint
            .verifier
            .verify(headers, body, now_ms.div_euclid(1000))
        {
            Ok(v) => v,
            Err(e) => {
                counters.rejected_signature.fetch_add(1, Ordering::Relaxed);
                let result = match e {
                    VerifyError::TooOld(_) | VerifyError::InFuture(_) => "stale_timestamp",
                    _ => "bad_signature",
                };
                count_delivery(&endpoint.name, result);
                // At most one line per 10 s per endpoint; the count of the
                // rejections not logged since the previous line rides along.
                if let Some(not_logged) = rejections.admit(now_ms) {
                    tracing::warn!(endpoint = name, reason = %e,
                                   suppressed_since_last_line = not_logged,
                                   "webhook signature rejected");
                }
                return Err(e.into());
            }
        };
        if endpoint.verifier.scheme() == Scheme::Slack {
            match slack_body(body) {
                SlackBody::Delivery => {}
                SlackBody::Challenge(challenge) => {
                    count_delivery(&endpoint.name, "url_verification");
                    return Ok(Received::Challenge { challenge });
                }
                SlackBody::BadChallenge => {
                    count_delivery(&endpoint.name, "invalid_challenge");
                    if let Some(not_logged) = rejections.admit(now_ms) {
                        tracing::warn!(
                            endpoint = name,
                            suppressed_since_last_line = not_logged,
                            "signed Slack url_verification without a usable challenge"
                        );
                    }
                    return Err(ReceiveError::BadChallenge);
                }
            }
        }
        let (entity_id, entity_version) = endpoint.entity_of(body);
        let delivery_id = bounded_delivery_id(&verified.delivery_id).into_owned();
        let receipt = NewReceipt {
            endpoint: name.to_owned(),
            delivery_id: delivery_id.clone(),
            event_type: verified.event_type.as_deref().and_then(short_text),
            headers: headers
                .iter()
                .filter(|(n, _)| !is_secret_header(n.as_str()))
                .map(|(n, v)| {
                    (
                        n.as_str().to_owned(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            body: body.to_vec(),
            entity_id,
            entity_version,
            content_sha256: dedupes_on_content(endpoint.verifier.scheme())
                .then(|| Sha256::digest(body).into()),
        };
        let retention = i64::try_from(endpoint.retention.as_millis()).unwrap_or(i64::MAX);
        match self
            .store
            .accept(&receipt, now_ms, now_ms.saturating_add(retention))
            .await?
        {
            Accepted::New => {
                counters.accepted.fetch_add(1, Ordering::Relaxed);
                count_delivery(&endpoint.name, "accepted");
                Ok(Received::New { delivery_id })
            }
            Accepted::Duplicate => {
                counters.duplicates.fetch_add(1, Ordering::Relaxed);
                count_delivery(&endpoint.name, "duplicate");
                Ok(Received::Duplicate { delivery_id })
            }
        }
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
    fn entity_and_version_pointers() {
        let e = Endpoint::from_config(
            "e",
            EndpointConfig {
                entity_id: Some("/data/id".into()),
                entity_version: Some("/data/updated".into()),
                ..config(Scheme::Github)
            },
        )
        .unwrap();
        assert_eq!(
            e.entity_of(br#"{"data":{"id":"o1","updated":7}}"#),
            (Some("o1".into()), Some(7))
        );
        assert_eq!(
            e.entity_of(br#"{"data":{"id":42,"updated":"12"}}"#),
            (Some("42".into()), Some(12))
        );
        assert_eq!(
            e.entity_of(br#"{"data":{"id":"o1","updated":"2026-12-02T10:00:00Z"}}"#),
            (Some("o1".into()), Some(1_796_205_600_000))
        );
        assert_eq!(
            e.entity_of(br#"{"data":{"id":"o1","updated":"whenever"}}"#),
            (Some("o1".into()), None)
        );
        assert_eq!(
            e.entity_of(br#"{"data":{"updated":3}}"#),
            (None, None),
            "no id, no version"
        );
        assert_eq!(e.entity_of(b"not json"), (None, None));
        assert_eq!(
            e.entity_of(br#"{"data":{"id":"o\u0000","updated":7}}"#),
            (None, None),
            "an id with a control character is absent"
        );
        let long = format!(r#"{{"data":{{"id":"{}","updated":7}}}}"#, "x".repeat(256));
        assert_eq!(e.entity_of(long.as_bytes()), (None, None), "too long");
    }

    #[test]
    fn a_burst_of_forgeries_logs_a_bounded_number_of_lines() {
        let clock = idem_core::ManualClock::new(1_700_000_000_000);
        let limiter = LogLimiter::new(REJECTION_LOG_EVERY_MS);
        let mut lines = Vec::new();
        // 10,000 forgeries over 25 s, one every 2.5 ms.
        for i in 0..10_000 {
            if i > 0 && i % 4 == 0 {
                clock.advance(Duration::from_millis(10));
            }
            if let Some(suppressed) = limiter.admit(clock.now_ms()) {
                lines.push((clock.now_ms(), suppressed));
            }
        }
        let start = 1_700_000_000_000;
        assert_eq!(
            lines,
            [(start, 0), (start + 10_000, 3999), (start + 20_000, 3999)],
            "the first, then one line per 10 s saying how many were not logged"
        );
        // The 2,000 after the last line are reported with the next one.
        clock.advance(Duration::from_secs(10));
        assert_eq!(limiter.admit(clock.now_ms()), Some(1999));
        // A clock that went backwards does not silence the log.
        assert_eq!(limiter.admit(clock.now_ms() - 60_000), Some(0));
    }

    #[test]
    fn signature_and_credential_headers_are_secret() {
        for h in [
            "x-hub-signature",
            "x-hub-signature-256",
            "X-Hub-Signature-256",
            "stripe-signature",
            "webhook-signature",
            "svix-signature",
            "x-shopify-hmac-sha256",
            "x-slack-signature",
            "authorization",
            "Cookie",
        ] {
            assert!(is_secret_header(h), "{h}");
        }
        for h in [
            "content-type",
            "x-github-delivery",
            "webhook-id",
            "svix-id",
            "x-hub",
        ] {
            assert!(!is_secret_header(h), "{h}");
        }
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
}
