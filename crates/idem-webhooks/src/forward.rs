//! The forward handler: POST the delivery to an upstream with a stable
//! `Idempotency-Key`, so a service in any language gets exactly-once effects
//! if it honours the key.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_core::webhooks::Receipt;
use idem_core::{BoxFuture, IdempotencyKey};

use crate::endpoint::Endpoint;
use crate::processor::{HandlerError, WebhookHandler};

/// The `Idempotency-Key` for a delivery: `<endpoint>:<delivery id>`, or, when
/// that is not a valid key (too long, not visible ASCII),
/// `<endpoint>:sha256:<hex of the delivery id>`. The same delivery always gets
/// the same key, whichever worker forwards it and however often.
pub fn idempotency_key(endpoint: &str, delivery_id: &str) -> String {
    let plain = format!("{endpoint}:{delivery_id}");
    if IdempotencyKey::new(plain.as_str()).is_ok() {
        return plain;
    }
    format!(
        "{endpoint}:sha256:{}",
        crate::endpoint::sha256_hex(delivery_id.as_bytes())
    )
}

/// Forwards each receipt to `url`. The whole exchange — connect, request,
/// response head and (for an error) the first 4 KiB of its body — is bounded
/// by one timeout; a forward that does not complete in time is retried.
#[derive(Debug, Clone)]
pub struct Forward {
    url: Uri,
    client: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

/// Response bodies read for error messages, at most.
const ERROR_BODY_BYTES: usize = 4096;

impl Forward {
    /// The timeout of [`Forward::new`].
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

    /// Forwards to `url` (`http://…`), each forward bounded by
    /// [`Forward::DEFAULT_TIMEOUT`].
    pub fn new(url: Uri) -> Self {
        Self {
            url,
            client: Client::builder(TokioExecutor::new()).build_http(),
            timeout: Self::DEFAULT_TIMEOUT,
        }
    }

    /// The endpoint's `forward_to` with its `forward_timeout`, if it forwards.
    pub fn for_endpoint(endpoint: &Endpoint) -> Option<Self> {
        let url = endpoint.forward_to.clone()?;
        Some(Self::new(url).with_timeout(endpoint.forward_timeout))
    }

    /// Bounds each forward by `timeout` instead; keep it shorter than the
    /// processor's lease, or another worker may forward the same receipt
    /// while this one still waits.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The bound on each forward.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    async fn forward(&self, r: &Receipt) -> Result<(), HandlerError> {
        let key = idempotency_key(&r.receipt.endpoint, &r.receipt.delivery_id);
        // Stored header values and event types come from the sender: one that
        // is not a valid header value is left out rather than failing the
        // forward for good.
        let content_type = r
            .receipt
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-type"))
            .and_then(|(_, v)| HeaderValue::from_str(v).ok())
            .unwrap_or(HeaderValue::from_static("application/octet-stream"));
        let mut req = Request::post(self.url.clone())
            .header("content-type", content_type)
            .header("idempotency-key", &key)
            .header("x-idem-webhook-endpoint", &r.receipt.endpoint)
            .header("x-idem-webhook-delivery", &key);
        if let Some(t) = r
            .receipt
            .event_type
            .as_deref()
            .and_then(|t| HeaderValue::from_str(t).ok())
        {
            req = req.header("x-idem-webhook-event", t);
        }
        let req = req
            .body(Full::new(Bytes::from(r.receipt.body.clone())))
            .map_err(|e| HandlerError::Reject(format!("cannot build the request: {e}")))?;
        match tokio::time::timeout(self.timeout, self.exchange(req)).await {
            Ok(result) => result,
            Err(_) => Err(HandlerError::Retry(format!(
                "upstream timed out: no complete answer within {:?}",
                self.timeout
            ))),
        }
    }

    /// Sends the request and reads the answer; the caller bounds it.
    async fn exchange(&self, req: Request<Full<Bytes>>) -> Result<(), HandlerError> {
        let res = self.client.request(req).await.map_err(|e| {
            HandlerError::Retry(format!(
                "upstream unreachable: {}",
                idem_core::ErrorChain(&e)
            ))
        })?;
        let status = res.status();
        if status.is_success() {
            return Ok(());
        }
        // The start of the body, for the message; a body that breaks off is
        // reported as far as it came.
        let mut body = res.into_body();
        let mut text = Vec::new();
        while text.len() < ERROR_BODY_BYTES {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        let room = ERROR_BODY_BYTES - text.len();
                        text.extend_from_slice(&data[..data.len().min(room)]);
                    }
                }
                Some(Err(_)) | None => break,
            }
        }
        let message = format!(
            "upstream answered {status}: {}",
            String::from_utf8_lossy(&text)
        );
        let retryable = status.is_server_error()
            || [
                StatusCode::REQUEST_TIMEOUT,
                StatusCode::CONFLICT,
                StatusCode::TOO_EARLY,
                StatusCode::TOO_MANY_REQUESTS,
            ]
            .contains(&status);
        Err(if retryable {
            HandlerError::Retry(message)
        } else {
            HandlerError::Reject(message)
        })
    }
}

impl WebhookHandler for Forward {
    fn handle<'a>(&'a self, receipt: &'a Receipt) -> BoxFuture<'a, Result<(), HandlerError>> {
        Box::pin(self.forward(receipt))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unreachable_upstream_says_why() {
        // A port nobody listens on: bound, then closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let forward = Forward::new(format!("http://127.0.0.1:{port}/hooks").parse().unwrap());
        let receipt = Receipt {
            id: 1,
            receipt: idem_core::webhooks::NewReceipt {
                endpoint: "github".into(),
                delivery_id: "d-1".into(),
                event_type: None,
                headers: vec![],
                body: b"{}".to_vec(),
                entity_id: None,
                entity_version: None,
                content_sha256: None,
            },
            state: idem_core::webhooks::ReceiptState::Received,
            attempts: 0,
            last_error: None,
            received_at_ms: 0,
            finished_at_ms: None,
        };
        let Err(HandlerError::Retry(message)) = forward.handle(&receipt).await else {
            panic!("a refused connection is retried");
        };
        assert!(message.to_lowercase().contains("refused"), "{message}");
    }

    #[test]
    fn keys_are_stable_and_always_valid() {
        assert_eq!(idempotency_key("github", "1:abc"), "github:1:abc");
        let long = "x".repeat(300);
        let k = idempotency_key("github", &long);
        assert!(k.starts_with("github:sha256:") && IdempotencyKey::new(k.as_str()).is_ok());
        assert_eq!(k, idempotency_key("github", &long));
        let spaced = idempotency_key("slack", "a b");
        assert!(spaced.starts_with("slack:sha256:"));
    }
}
