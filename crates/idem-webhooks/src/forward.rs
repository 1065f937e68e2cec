//! The forward handler: POST the delivery to an upstream with a stable
//! `Idempotency-Key`, so a service in any language gets exactly-once effects
//! if it honours the key.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_core::{BoxFuture, IdempotencyKey, Receipt};

use crate::processor::{HandleError, WebhookHandler};

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
        crate::receiver::sha256_hex(delivery_id.as_bytes())
    )
}

/// Forwards each receipt to `url`.
#[derive(Debug, Clone)]
pub struct Forward {
    url: Uri,
    client: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

/// Response bodies read for error messages, at most.
const ERROR_BODY_BYTES: usize = 4096;

impl Forward {
    /// Forwards to `url` (`http://…`), each call bounded by 10 s.
    pub fn new(url: Uri) -> Self {
        Self {
            url,
            client: Client::builder(TokioExecutor::new()).build_http(),
            timeout: Duration::from_secs(10),
        }
    }

    async fn forward(&self, r: &Receipt) -> Result<(), HandleError> {
        let key = idempotency_key(&r.receipt.endpoint, &r.receipt.delivery_id);
        let content_type = r
            .receipt
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-type"))
            .map_or("application/octet-stream", |(_, v)| v.as_str());
        let mut req = Request::post(self.url.clone())
            .header("content-type", content_type)
            .header("idempotency-key", &key)
            .header("x-idem-webhook-endpoint", &r.receipt.endpoint)
            .header("x-idem-webhook-delivery", &key);
        if let Some(t) = &r.receipt.event_type {
            req = req.header("x-idem-webhook-event", t);
        }
        let req = req
            .body(Full::new(Bytes::from(r.receipt.body.clone())))
            .map_err(|e| HandleError::Reject(format!("cannot build the request: {e}")))?;
        let res = match tokio::time::timeout(self.timeout, self.client.request(req)).await {
            Err(_) => {
                return Err(HandleError::Retry(format!(
                    "upstream did not answer in {:?}",
                    self.timeout
                )));
            }
            Ok(Err(e)) => return Err(HandleError::Retry(format!("upstream unreachable: {e}"))),
            Ok(Ok(res)) => res,
        };
        let status = res.status();
        if status.is_success() {
            return Ok(());
        }
        let body = Limited::new(res.into_body(), ERROR_BODY_BYTES)
            .collect()
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
            .unwrap_or_default();
        let message = format!("upstream answered {status}: {body}");
        let retryable = status.is_server_error()
            || [
                StatusCode::REQUEST_TIMEOUT,
                StatusCode::CONFLICT,
                StatusCode::TOO_EARLY,
                StatusCode::TOO_MANY_REQUESTS,
            ]
            .contains(&status);
        Err(if retryable {
            HandleError::Retry(message)
        } else {
            HandleError::Reject(message)
        })
    }
}

impl WebhookHandler for Forward {
    fn handle<'a>(&'a self, receipt: &'a Receipt) -> BoxFuture<'a, Result<(), HandleError>> {
        Box::pin(self.forward(receipt))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
