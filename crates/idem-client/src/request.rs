//! One intent (a method, a path, a body, a key) and the retry loop that
//! sends it.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper_util::client::legacy::connect::{Connect, HttpConnector};
use tokio::time::Instant;

use crate::error::Failure;
use crate::policy::{XorShift, retry_after};
use crate::{Client, ClientError, key};

/// The `Idempotency-Key` request header.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// The response header an Idem server adds to a replayed answer.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The final answer of a send: the server's status, headers and body, and
/// what it took to get it.
///
/// Any status can be an answer: a 4xx other than 429 and an in-flight 409
/// is final and returned here, not as an error, because it is the server's
/// verdict on the request (a declined card, a validation failure) and the
/// caller decides what it means.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Answer {
    /// The status of the answer.
    pub status: StatusCode,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body, read in full (at most the client's `max_response_body`).
    pub body: Bytes,
    /// True when the server says this is a stored answer replayed for the
    /// key (`Idempotent-Replayed: true`): the request had taken effect
    /// before, on an attempt whose answer was lost, or on an earlier send.
    pub replayed: bool,
    /// The attempts it took, this one included (1 = no retry).
    pub attempts: u32,
    /// The idempotency key every attempt carried.
    pub key: String,
}

impl Answer {
    /// The body parsed as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }
}

/// One intent: a request and its idempotency key, sent with retries by
/// [`send`](Self::send).
///
/// The key is fixed when the builder is made ([`Client::request`]): a fresh
/// v4 UUID, or the one given to [`key`](Self::key). Sending the builder
/// again, or a clone of it, sends the same intent with the same key, so
/// the server replays the first outcome rather than acting twice; a new
/// intent is a new builder.
///
/// The setters do not fail: an invalid key, header or body is remembered
/// and reported by [`send`](Self::send) as an error, before anything is sent.
#[must_use = "a request does nothing until it is sent"]
pub struct RequestBuilder<C = HttpConnector> {
    client: Client<C>,
    method: Method,
    path: String,
    key: String,
    headers: HeaderMap,
    body: Bytes,
    error: Option<InputError>,
}

impl<C> Clone for RequestBuilder<C> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            method: self.method.clone(),
            path: self.path.clone(),
            key: self.key.clone(),
            headers: self.headers.clone(),
            body: self.body.clone(),
            error: self.error.clone(),
        }
    }
}

impl<C> fmt::Debug for RequestBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Header values can be secrets (Authorization): names only.
        f.debug_struct("RequestBuilder")
            .field("method", &self.method)
            .field("path", &self.path)
            .field("key", &self.key)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("body_len", &self.body.len())
            .finish_non_exhaustive()
    }
}

impl<C> RequestBuilder<C>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    pub(crate) fn new(client: Client<C>, method: Method, path: &str) -> Self {
        Self {
            client,
            method,
            path: path.into(),
            key: key::generate(),
            headers: HeaderMap::new(),
            body: Bytes::new(),
            error: None,
        }
    }

    /// Use this idempotency key instead of the generated one: 1 to 255
    /// visible ASCII characters (an invalid one makes [`send`](Self::send)
    /// fail with [`ClientError::InvalidKey`]). Give a key when the intent already has an
    /// identity (an order id, a key derived from a workflow step) so that a
    /// retry from another process carries the same key.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        let key = key.into();
        match key::validate(&key) {
            Ok(()) => self.key = key,
            Err(e) => self.fail(e),
        }
        self
    }

    /// Adds a header (repeatable). `Idempotency-Key` is refused here: use
    /// [`key`](Self::key).
    pub fn header<K, V>(mut self, name: K, value: V) -> Self
    where
        K: TryInto<HeaderName>,
        V: TryInto<HeaderValue>,
    {
        let Ok(name) = name.try_into() else {
            self.fail(ClientError::InvalidRequest {
                reason: "invalid header name".into(),
            });
            return self;
        };
        if name == IDEMPOTENCY_KEY {
            self.fail(ClientError::InvalidRequest {
                reason: "set the idempotency key with RequestBuilder::key, not as a header".into(),
            });
            return self;
        }
        match value.try_into() {
            Ok(value) => {
                self.headers.append(name, value);
            }
            Err(_) => self.fail(ClientError::InvalidRequest {
                reason: format!("invalid value for header {name}"),
            }),
        }
        self
    }

    /// The request body, sent as is on every attempt.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    /// The body as JSON, with `Content-Type: application/json`.
    pub fn json<T: serde::Serialize + ?Sized>(mut self, value: &T) -> Self {
        match serde_json::to_vec(value) {
            Ok(body) => {
                self.body = body.into();
                self.headers
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            }
            Err(e) => self.fail(ClientError::InvalidRequest {
                reason: format!("the body does not serialize to JSON: {e}"),
            }),
        }
        self
    }

    /// The idempotency key of this intent.
    pub fn idempotency_key(&self) -> &str {
        &self.key
    }

    fn fail(&mut self, e: ClientError) {
        // The first mistake is the one to report.
        self.error.get_or_insert(e.into());
    }

    /// Sends the intent, retrying with the same key until a final answer,
    /// `max_attempts` attempts, or the deadline.
    ///
    /// Retried, after a full-jitter backoff (at least the `Retry-After` of
    /// the answer, if any): a connection error, an attempt timeout, 429,
    /// any 5xx, and a 409 that says the first request with this key is
    /// still running (it has a `Retry-After`, or a problem `type` ending in
    /// `in-flight`). Every other answer, a 4xx included, is returned as an
    /// [`Answer`]. When the next wait would end after the deadline, the send
    /// stops at once with [`ClientError::DeadlineExceeded`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future abandons the attempt in progress, which may
    /// still take effect on the server. Sending this builder again is safe:
    /// it carries the same key, so the server replays the outcome.
    pub async fn send(&self) -> Result<Answer, ClientError> {
        if let Some(e) = &self.error {
            return Err(e.clone().into());
        }
        let request = self.prepare()?;
        let inner = &self.client.inner;
        let policy = inner.policy;
        let start = Instant::now();
        let deadline_at = start + policy.deadline;
        let mut rng = XorShift::from_entropy();
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let remaining = deadline_at.saturating_duration_since(Instant::now());
            let budget = policy.attempt_timeout.min(remaining);
            let outcome = tokio::time::timeout(budget, self.attempt(&request, attempts)).await;
            let failure = match outcome {
                Ok(Ok(answer)) if !retryable(&answer) => return Ok(answer),
                Ok(Ok(answer)) => Failure::Status(Box::new(answer)),
                Ok(Err(AttemptError::Transport(e))) => Failure::Transport(e),
                Ok(Err(AttemptError::TooLarge(status))) => {
                    return Err(ClientError::ResponseTooLarge {
                        key: self.key.clone(),
                        attempts,
                        status,
                        limit: inner.max_response_body,
                    });
                }
                Err(_elapsed) => Failure::Timeout { after: budget },
            };
            let gave_up_on_deadline = |last| ClientError::DeadlineExceeded {
                key: self.key.clone(),
                attempts,
                deadline: policy.deadline,
                last,
            };
            if Instant::now() >= deadline_at {
                return Err(gave_up_on_deadline(failure));
            }
            if attempts >= policy.max_attempts {
                return Err(ClientError::AttemptsExhausted {
                    key: self.key.clone(),
                    attempts,
                    last: failure,
                });
            }
            let backoff = policy.backoff(attempts, &mut rng);
            let server_wait = failure
                .answer()
                .and_then(|a| retry_after(&a.headers))
                .unwrap_or(Duration::ZERO);
            let wait = backoff.max(server_wait);
            // Sleeping up to (or past) the deadline would leave no time for
            // another attempt: stop now and say why.
            let remaining = deadline_at.saturating_duration_since(Instant::now());
            if wait >= remaining {
                return Err(gave_up_on_deadline(failure));
            }
            tracing::debug!(
                key = %self.key,
                attempt = attempts,
                last = %failure,
                wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                "retrying with the same idempotency key"
            );
            tokio::time::sleep(wait).await;
        }
    }

    /// Everything that can be checked before sending: the URI and the key
    /// header.
    fn prepare(&self) -> Result<Prepared, ClientError> {
        if !self.path.starts_with('/') {
            return Err(ClientError::InvalidRequest {
                reason: "the path must start with /".into(),
            });
        }
        if self.path.contains('#') {
            return Err(ClientError::InvalidRequest {
                reason: "the path must not have a fragment".into(),
            });
        }
        let uri = format!("{}{}", self.client.inner.base, self.path);
        let uri: http::Uri = uri.parse().map_err(|e| ClientError::InvalidRequest {
            reason: format!("the path does not make a valid URI: {e}"),
        })?;
        let mut headers = self.headers.clone();
        headers.insert(IDEMPOTENCY_KEY, key::header_value(&self.key)?);
        Ok(Prepared { uri, headers })
    }

    async fn attempt(&self, prepared: &Prepared, attempts: u32) -> Result<Answer, AttemptError> {
        let inner = &self.client.inner;
        let mut request = Request::new(Full::new(self.body.clone()));
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = prepared.uri.clone();
        *request.headers_mut() = prepared.headers.clone();
        let response = inner
            .http
            .request(request)
            .await
            .map_err(|e| AttemptError::Transport(Box::new(e)))?;
        let (parts, body) = response.into_parts();
        let limit = inner.max_response_body;
        let declared = parts
            .headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return Err(AttemptError::TooLarge(parts.status));
        }
        let body = match Limited::new(body, limit).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.is::<LengthLimitError>() => {
                return Err(AttemptError::TooLarge(parts.status));
            }
            Err(e) => return Err(AttemptError::Transport(e)),
        };
        let replayed = parts
            .headers
            .get(IDEMPOTENT_REPLAYED)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body,
            replayed,
            attempts,
            key: self.key.clone(),
        })
    }
}

struct Prepared {
    uri: http::Uri,
    headers: HeaderMap,
}

enum AttemptError {
    Transport(Box<dyn std::error::Error + Send + Sync>),
    TooLarge(StatusCode),
}

/// A setter's mistake, remembered until `send` reports it.
#[derive(Clone, Debug)]
enum InputError {
    Key(String),
    Request(String),
}

impl From<ClientError> for InputError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::InvalidKey { reason } => Self::Key(reason),
            ClientError::InvalidRequest { reason } => Self::Request(reason),
            other => Self::Request(other.to_string()),
        }
    }
}

impl From<InputError> for ClientError {
    fn from(e: InputError) -> Self {
        match e {
            InputError::Key(reason) => ClientError::InvalidKey { reason },
            InputError::Request(reason) => ClientError::InvalidRequest { reason },
        }
    }
}

/// Whether an answer is worth another attempt with the same key.
fn retryable(answer: &Answer) -> bool {
    let status = answer.status;
    if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
        return true;
    }
    if status == StatusCode::CONFLICT {
        // A 409 is a business answer ("this order already exists") unless it
        // says the first request with this key is still running: Idem sends
        // `Retry-After` with it, and its problem type ends in `in-flight`.
        return answer.headers.contains_key(http::header::RETRY_AFTER)
            || problem_type(&answer.body).is_some_and(|t| t.ends_with("in-flight"));
    }
    false
}

fn problem_type(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Problem {
        #[serde(rename = "type")]
        kind: String,
    }
    serde_json::from_slice::<Problem>(body).ok().map(|p| p.kind)
}
