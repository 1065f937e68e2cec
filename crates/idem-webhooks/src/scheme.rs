//! Signature schemes, each verified over the raw body bytes in constant time.

use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use ed25519_dalek::{Signature, VerifyingKey};
use hmac::{Hmac, Mac};
use http::HeaderMap;
use serde::Deserialize;
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// A provider's signing scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scheme {
    /// `X-Hub-Signature-256: sha256=<hex>` over the body.
    Github,
    /// `Stripe-Signature: t=…,v1=…` over `t.body`.
    Stripe,
    /// Standard Webhooks: `webhook-id`, `webhook-timestamp`,
    /// `webhook-signature: v1,<base64> v1a,<base64>` over `id.timestamp.body`;
    /// or the same three as Svix names them by default (`svix-id`,
    /// `svix-timestamp`, `svix-signature`). One set is read whole, never a
    /// mix (see [`Verifier::verify`]).
    Standard,
    /// `X-Shopify-Hmac-Sha256: <base64>` over the body.
    Shopify,
    /// `X-Slack-Signature: v0=<hex>` over `v0:timestamp:body`.
    Slack,
}

impl Scheme {
    /// The default timestamp tolerance (the providers' own).
    pub fn default_tolerance(self) -> Duration {
        Duration::from_secs(300)
    }
}

/// A shared secret or key. Its bytes never appear in `Debug` or `Display`.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

/// A secret as a verifier uses it.
#[derive(Clone)]
enum Key {
    Hmac(Vec<u8>),
    Ed25519(VerifyingKey),
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Hmac(_) => f.write_str("Hmac([redacted])"),
            Self::Ed25519(_) => f.write_str("Ed25519(public key)"),
        }
    }
}

/// A secret that does not fit its scheme.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// No secrets at all.
    #[error("at least one secret is required")]
    Missing,
    /// An empty secret.
    #[error("secret {index} is empty")]
    Empty {
        /// Its position in the list.
        index: usize,
    },
    /// A Standard Webhooks secret without `whsec_` or `whpk_`, or with bad base64.
    #[error("secret {index} must be whsec_<base64> (HMAC) or whpk_<base64> (ed25519 public key)")]
    Standard {
        /// Its position in the list.
        index: usize,
    },
}

/// Why a delivery did not verify. Messages name what was wrong, never a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// A header the scheme needs is absent.
    #[error("header {0} is missing")]
    MissingHeader(&'static str),
    /// A header is present but unreadable.
    #[error("header {0} is malformed")]
    Malformed(&'static str),
    /// The signed timestamp is further in the past than the tolerance.
    #[error("timestamp is {0} s old, beyond the tolerance")]
    TooOld(i64),
    /// The signed timestamp is further in the future than the tolerance.
    #[error("timestamp is {0} s in the future, beyond the tolerance")]
    InFuture(i64),
    /// No signature matched any secret.
    #[error("no signature matches")]
    NoMatch,
}

/// What a verified delivery says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The provider's delivery id, the dedupe key within an endpoint (see the
    /// crate docs for each scheme and the fallback). The receiver stores
    /// [`bounded_delivery_id`](crate::bounded_delivery_id) of it.
    pub delivery_id: String,
    /// The event type, when the provider says.
    pub event_type: Option<String>,
}

/// Verifies one endpoint's deliveries: a scheme, its secrets (several at once
/// during rotation), and a timestamp tolerance in both directions.
#[derive(Debug, Clone)]
pub struct Verifier {
    scheme: Scheme,
    keys: Vec<Key>,
    tolerance: Duration,
}

/// Standard base64 whose padding may be written or left out: how
/// `whsec_`/`whpk_` secrets are read (the `standardwebhooks` library accepts
/// both spellings). Signatures keep the strict, padded decoder.
const SECRET_B64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The three Standard Webhooks headers under one naming.
struct HeaderSet {
    id: &'static str,
    timestamp: &'static str,
    signature: &'static str,
}

/// The specification's names.
const WEBHOOK_HEADERS: HeaderSet = HeaderSet {
    id: "webhook-id",
    timestamp: "webhook-timestamp",
    signature: "webhook-signature",
};

/// Svix's default names (`webhook-*` is its white-label option).
const SVIX_HEADERS: HeaderSet = HeaderSet {
    id: "svix-id",
    timestamp: "svix-timestamp",
    signature: "svix-signature",
};

/// The header set a Standard Webhooks delivery is read with: `webhook-*`
/// when any of its three headers is present, else `svix-*`. Never a mix:
/// with the `webhook-*` set, a `svix-id` or `svix-timestamp` beside its
/// `webhook-id` or `webhook-timestamp` must hold the same value, or the
/// delivery is malformed (a receipt never carries two different ids or
/// times); `svix-signature` is then not read.
fn standard_set(headers: &HeaderMap) -> Result<&'static HeaderSet, VerifyError> {
    let present = |set: &HeaderSet| {
        [set.id, set.timestamp, set.signature]
            .iter()
            .any(|h| headers.contains_key(*h))
    };
    if !present(&WEBHOOK_HEADERS) {
        return Ok(if present(&SVIX_HEADERS) {
            &SVIX_HEADERS
        } else {
            &WEBHOOK_HEADERS
        });
    }
    for (ours, theirs) in [
        (WEBHOOK_HEADERS.id, SVIX_HEADERS.id),
        (WEBHOOK_HEADERS.timestamp, SVIX_HEADERS.timestamp),
    ] {
        if let Some(a) = headers.get(ours)
            && headers.get_all(theirs).iter().any(|b| a != b)
        {
            return Err(VerifyError::Malformed(theirs));
        }
    }
    Ok(&WEBHOOK_HEADERS)
}

/// Strict hex: pairs of `[0-9a-fA-F]` only. (`u8::from_str_radix` would also
/// take `+f`, so one signature would have several spellings.)
fn hex_decode(s: &str) -> Option<Vec<u8>> {
    fn nibble(b: u8) -> Option<u8> {
        match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'a'..=b'f' => Some(b - b'a' + 10),
            b'A'..=b'F' => Some(b - b'A' + 10),
            _ => None,
        }
    }
    let s = s.as_bytes();
    if !s.len().is_multiple_of(2) {
        return None;
    }
    s.chunks_exact(2)
        .map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?))
        .collect()
}

/// The longest signed timestamp read, in digits: unix seconds have 10 until
/// the year 2286, and 18 digits always fit an `i64`.
const TIMESTAMP_DIGITS_MAX: usize = 18;

/// A signed unix timestamp: ASCII digits only, no sign, no leading zero, no
/// inner whitespace, at most [`TIMESTAMP_DIGITS_MAX`] digits (`str::parse`
/// would also take `+1700000000` and `01700000000`).
fn parse_timestamp(value: &str) -> Option<i64> {
    let bytes = value.as_bytes();
    let canonical = (1..=TIMESTAMP_DIGITS_MAX).contains(&bytes.len())
        && bytes.iter().all(u8::is_ascii_digit)
        && (bytes[0] != b'0' || bytes.len() == 1);
    if !canonical {
        return None;
    }
    Some(
        bytes
            .iter()
            .fold(0i64, |acc, &d| acc * 10 + i64::from(d - b'0')),
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The most signatures one delivery may carry (several only while a secret
/// rotates); more is malformed, so a header of thousands of entries costs
/// nothing but its parsing.
pub const MAX_SIGNATURES: usize = 8;

/// Whether `signature` is one of `tags`: constant time, and an empty or
/// truncated signature never verifies.
fn tag_matches(tags: &[[u8; 32]], signature: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    signature.len() == 32
        && tags
            .iter()
            .fold(subtle::Choice::from(0), |acc, t| acc | t.ct_eq(signature))
            .into()
}

/// Header `name`'s one value, trimmed: missing, sent more than once, not
/// visible text or empty is an error (a second value would be stored with
/// the receipt without being what the signature covered).
fn header<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<&'a str, VerifyError> {
    let mut values = headers.get_all(name).iter();
    let value = values.next().ok_or(VerifyError::MissingHeader(name))?;
    if values.next().is_some() {
        return Err(VerifyError::Malformed(name));
    }
    let value = value
        .to_str()
        .map_err(|_| VerifyError::Malformed(name))?
        .trim();
    if value.is_empty() {
        return Err(VerifyError::Malformed(name));
    }
    Ok(value)
}

fn optional<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

fn json_str(body: &[u8], path: &[&str]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let mut cur = &v;
    for p in path {
        cur = cur.get(p)?;
    }
    // A string a column could not hold as text (NUL), or that no operator
    // could type, is treated as absent: the documented fallback applies.
    cur.as_str()
        .filter(|s| !s.is_empty() && s.len() <= 255 && !s.chars().any(char::is_control))
        .map(str::to_owned)
}

/// What a verified Slack body is to the receiver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SlackBody {
    /// An event, a command, anything but the handshake: stored as a delivery.
    Delivery,
    /// Slack's `url_verification` handshake: answered with this challenge,
    /// never stored nor forwarded.
    Challenge(String),
    /// A `url_verification` without a usable `challenge` (a string of 1 to
    /// 255 bytes without control characters): refused, nothing stored.
    BadChallenge,
}

/// Reads a Slack body, already verified: `{"type":"url_verification",
/// "challenge":"…"}` is the handshake Slack sends before it enables a
/// request URL. A body that is not a JSON object (a slash command's form,
/// say) is a delivery.
pub(crate) fn slack_body(body: &[u8]) -> SlackBody {
    let Ok(serde_json::Value::Object(v)) = serde_json::from_slice(body) else {
        return SlackBody::Delivery;
    };
    if v.get("type").and_then(serde_json::Value::as_str) != Some("url_verification") {
        return SlackBody::Delivery;
    }
    v.get("challenge")
        .and_then(serde_json::Value::as_str)
        .filter(|c| !c.is_empty() && c.len() <= 255 && !c.chars().any(char::is_control))
        .map_or(SlackBody::BadChallenge, |c| {
            SlackBody::Challenge(c.to_owned())
        })
}

/// The fallback delivery id when a scheme has none: the signed timestamp (if
/// any) and the body's SHA-256. Two identical bodies signed at the same second
/// are one delivery.
fn fallback_id(timestamp: Option<&str>, body: &[u8]) -> String {
    let digest = hex(&Sha256::digest(body));
    match timestamp {
        Some(t) => format!("{t}:sha256:{digest}"),
        None => format!("sha256:{digest}"),
    }
}

impl Verifier {
    /// A verifier for `scheme` with `secrets` (tried in order; any may match).
    /// Standard Webhooks secrets are `whsec_<base64>` (HMAC) or
    /// `whpk_<base64>` (ed25519 public key, for `v1a`), their base64 with or
    /// without its `=` padding; other schemes take the secret's bytes as the
    /// HMAC key.
    pub fn new(
        scheme: Scheme,
        secrets: &[Secret],
        tolerance: Duration,
    ) -> Result<Self, SecretError> {
        if secrets.is_empty() {
            return Err(SecretError::Missing);
        }
        let keys = secrets
            .iter()
            .enumerate()
            .map(|(index, s)| {
                let s = s.expose();
                if s.is_empty() {
                    return Err(SecretError::Empty { index });
                }
                if scheme != Scheme::Standard {
                    return Ok(Key::Hmac(s.as_bytes().to_vec()));
                }
                let bad = || SecretError::Standard { index };
                if let Some(b) = s.strip_prefix("whsec_") {
                    let key = SECRET_B64.decode(b).map_err(|_| bad())?;
                    if key.is_empty() {
                        return Err(bad());
                    }
                    Ok(Key::Hmac(key))
                } else if let Some(b) = s.strip_prefix("whpk_") {
                    let bytes: [u8; 32] = SECRET_B64
                        .decode(b)
                        .ok()
                        .and_then(|k| k.try_into().ok())
                        .ok_or_else(bad)?;
                    Ok(Key::Ed25519(
                        VerifyingKey::from_bytes(&bytes).map_err(|_| bad())?,
                    ))
                } else {
                    Err(bad())
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            scheme,
            keys,
            tolerance,
        })
    }

    /// The scheme.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    fn hmac_matches(&self, message: &[&[u8]], signature: &[u8]) -> bool {
        tag_matches(&self.hmac_tags(message), signature)
    }

    /// The HMAC-SHA256 tag of `message` under every HMAC key: computed once
    /// per delivery, however many signatures it carries (each is then a
    /// 32-byte comparison, not another pass over the body).
    fn hmac_tags(&self, message: &[&[u8]]) -> Vec<[u8; 32]> {
        self.keys
            .iter()
            .filter_map(|k| match k {
                Key::Hmac(key) => {
                    let mut mac = HmacSha256::new_from_slice(key).ok()?;
                    for part in message {
                        mac.update(part);
                    }
                    Some(mac.finalize().into_bytes().into())
                }
                Key::Ed25519(_) => None,
            })
            .collect()
    }

    fn ed25519_matches(&self, message: &[u8], signature: &[u8]) -> bool {
        let Ok(sig) = Signature::from_slice(signature) else {
            return false;
        };
        self.keys.iter().any(|k| match k {
            Key::Ed25519(key) => key.verify_strict(message, &sig).is_ok(),
            Key::Hmac(_) => false,
        })
    }

    fn check_time(&self, name: &'static str, value: &str, now_s: i64) -> Result<(), VerifyError> {
        let ts = parse_timestamp(value).ok_or(VerifyError::Malformed(name))?;
        // Saturating both ways: a clock near i64::MIN must not overflow `-skew`.
        let skew = now_s.saturating_sub(ts);
        let ahead = skew.saturating_neg();
        let tolerance = i64::try_from(self.tolerance.as_secs()).unwrap_or(i64::MAX);
        if skew > tolerance {
            Err(VerifyError::TooOld(skew))
        } else if ahead > tolerance {
            Err(VerifyError::InFuture(ahead))
        } else {
            Ok(())
        }
    }

    /// Verifies a delivery's signature over its raw `body`, at `now_s` (unix
    /// seconds), and reads its delivery id.
    ///
    /// Standard Webhooks deliveries are read with one header set, whole:
    /// `webhook-*` when any `webhook-id`, `webhook-timestamp` or
    /// `webhook-signature` is present, else Svix's `svix-*`. The id, time and
    /// signature never come from different sets; a `svix-id` or
    /// `svix-timestamp` beside the `webhook-*` set must repeat its value
    /// ([`VerifyError::Malformed`] otherwise).
    pub fn verify(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now_s: i64,
    ) -> Result<Verified, VerifyError> {
        match self.scheme {
            Scheme::Github => {
                const H: &str = "x-hub-signature-256";
                let sig = header(headers, H)?
                    .strip_prefix("sha256=")
                    .and_then(hex_decode)
                    .ok_or(VerifyError::Malformed(H))?;
                if !self.hmac_matches(&[body], &sig) {
                    return Err(VerifyError::NoMatch);
                }
                let delivery = optional(headers, "x-github-delivery");
                let delivery_id = match (optional(headers, "x-github-hook-id"), delivery) {
                    (Some(hook), Some(d)) => format!("{hook}:{d}"),
                    (None, Some(d)) => d.to_owned(),
                    _ => fallback_id(None, body),
                };
                Ok(Verified {
                    delivery_id,
                    event_type: optional(headers, "x-github-event").map(str::to_owned),
                })
            }
            Scheme::Stripe => {
                const H: &str = "stripe-signature";
                let value = header(headers, H)?;
                let mut timestamp = None;
                let mut signatures = Vec::new();
                for item in value.split(',') {
                    match item.trim().split_once('=') {
                        Some(("t", t)) => timestamp = Some(t),
                        // Several during secret rotation; other schemes (v0) ignored.
                        Some(("v1", s)) => signatures.extend(hex_decode(s)),
                        _ => {}
                    }
                }
                let t = timestamp.ok_or(VerifyError::Malformed(H))?;
                self.check_time(H, t, now_s)?;
                if signatures.len() > MAX_SIGNATURES {
                    return Err(VerifyError::Malformed(H));
                }
                let tags = self.hmac_tags(&[t.as_bytes(), b".", body]);
                if !signatures.iter().any(|s| tag_matches(&tags, s)) {
                    return Err(VerifyError::NoMatch);
                }
                Ok(Verified {
                    delivery_id: json_str(body, &["id"])
                        .unwrap_or_else(|| fallback_id(Some(t), body)),
                    event_type: json_str(body, &["type"]),
                })
            }
            Scheme::Standard => {
                let set = standard_set(headers)?;
                let id = header(headers, set.id)?;
                let ts = header(headers, set.timestamp)?;
                let sigs = header(headers, set.signature)?;
                self.check_time(set.timestamp, ts, now_s)?;
                let message = [id.as_bytes(), b".", ts.as_bytes(), b".", body].concat();
                let entries: Vec<&str> = sigs.split(' ').filter(|e| !e.is_empty()).collect();
                if entries.len() > MAX_SIGNATURES {
                    return Err(VerifyError::Malformed(set.signature));
                }
                let tags = self.hmac_tags(&[&message]);
                let matched = entries.iter().any(|entry| match entry.split_once(',') {
                    Some(("v1", s)) => B64.decode(s).is_ok_and(|s| tag_matches(&tags, &s)),
                    Some(("v1a", s)) => B64
                        .decode(s)
                        .is_ok_and(|s| self.ed25519_matches(&message, &s)),
                    _ => false,
                });
                if !matched {
                    return Err(VerifyError::NoMatch);
                }
                Ok(Verified {
                    delivery_id: id.to_owned(),
                    event_type: json_str(body, &["type"]),
                })
            }
            Scheme::Shopify => {
                const H: &str = "x-shopify-hmac-sha256";
                let sig = B64
                    .decode(header(headers, H)?)
                    .map_err(|_| VerifyError::Malformed(H))?;
                if !self.hmac_matches(&[body], &sig) {
                    return Err(VerifyError::NoMatch);
                }
                let delivery_id = optional(headers, "x-shopify-webhook-id")
                    .or_else(|| optional(headers, "x-shopify-event-id"))
                    .map_or_else(|| fallback_id(None, body), str::to_owned);
                Ok(Verified {
                    delivery_id,
                    event_type: optional(headers, "x-shopify-topic").map(str::to_owned),
                })
            }
            Scheme::Slack => {
                const H: &str = "x-slack-signature";
                const T: &str = "x-slack-request-timestamp";
                let sig = header(headers, H)?
                    .strip_prefix("v0=")
                    .and_then(hex_decode)
                    .ok_or(VerifyError::Malformed(H))?;
                let ts = header(headers, T)?;
                self.check_time(T, ts, now_s)?;
                if !self.hmac_matches(&[b"v0:", ts.as_bytes(), b":", body], &sig) {
                    return Err(VerifyError::NoMatch);
                }
                Ok(Verified {
                    delivery_id: json_str(body, &["event_id"])
                        .unwrap_or_else(|| fallback_id(Some(ts), body)),
                    event_type: json_str(body, &["event", "type"])
                        .or_else(|| json_str(body, &["type"])),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests;
