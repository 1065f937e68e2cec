//! [`Receiver`]: the receiving side — body limit → verify → dedupe key →
//! persist the receipt with its inbox record → answer — with its counters,
//! its rate-limited rejection log and the headers never stored.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use http::HeaderMap;
use idem_core::webhooks::{Accepted, NewReceipt, WebhookStore};
use idem_core::{Clock, StoreError, SystemClock};
use sha2::{Digest, Sha256};

use crate::endpoint::{Endpoint, bounded_delivery_id, short_text};
use crate::scheme::{Scheme, SlackBody, VerifyError, slack_body};

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
    use std::time::Duration;

    use super::*;

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
}
