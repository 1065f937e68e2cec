//! One exchange with the upstream: the request rewritten as a reverse
//! proxy should (hop-by-hop headers dropped, `X-Forwarded-*` set, the key
//! header replaced), over a keep-alive pool, bounded in time and in the
//! bytes read back.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_http::RequestOutcome;

use crate::config::HttpBase;

/// The most bytes of an answer on a route that stores none (unlisted, or
/// sent without a key).
pub const PASS_THROUGH_MAX_ANSWER: usize = 16 << 20;

/// Headers that belong to one connection, never forwarded (RFC 9110 7.6.1),
/// with those the proxy sets itself.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
];

/// The upstream and a pooled client.
pub struct Upstream {
    client: Client<HttpConnector, Full<Bytes>>,
    authority: String,
    prefix: String,
    timeout: Duration,
}

/// What the upstream answered, read whole.
pub struct Answer {
    /// Its status.
    pub status: StatusCode,
    /// Its end-to-end headers.
    pub headers: HeaderMap,
    /// Its body.
    pub body: Bytes,
}

impl Answer {
    /// The answer as the gateway's response.
    pub fn into_response(self) -> Response {
        let mut res = Response::new(Body::from(self.body));
        *res.status_mut() = self.status;
        *res.headers_mut() = self.headers;
        res
    }
}

/// Why there is no answer.
#[derive(Debug)]
pub enum ForwardError {
    /// No connection: nothing was sent.
    Unreachable(String),
    /// Sent, and the exchange broke before a whole answer.
    Broken(String),
    /// No whole answer within the timeout.
    Timeout(Duration),
    /// The answer is larger than the route keeps.
    TooLarge(usize),
}

impl ForwardError {
    /// Whether the request was sent: the upstream may have acted on it.
    pub fn may_have_acted(&self) -> bool {
        !matches!(self, ForwardError::Unreachable(_))
    }

    /// 502 or 504, problem+json; the cause is logged, not sent. `kept`:
    /// the key was kept for an operator (a `reject` route, the request
    /// sent), else released.
    pub fn into_response(self, kept: bool) -> Response {
        let (status, slug, title, what) = match &self {
            ForwardError::Unreachable(why) => {
                tracing::warn!(error = %why, "upstream unreachable");
                (
                    StatusCode::BAD_GATEWAY,
                    "upstream-unavailable",
                    "The upstream service is unavailable",
                    "the upstream could not be reached".to_owned(),
                )
            }
            ForwardError::Broken(why) => {
                tracing::warn!(error = %why, "the exchange with the upstream broke");
                (
                    StatusCode::BAD_GATEWAY,
                    "upstream-unavailable",
                    "The upstream service is unavailable",
                    "the exchange with the upstream broke before its answer".to_owned(),
                )
            }
            ForwardError::Timeout(d) => (
                StatusCode::GATEWAY_TIMEOUT,
                "upstream-timeout",
                "The upstream service did not answer in time",
                format!("no whole answer within {} ms", d.as_millis()),
            ),
            ForwardError::TooLarge(limit) => (
                StatusCode::BAD_GATEWAY,
                "upstream-response-too-large",
                "The upstream's answer is too large",
                format!("the answer is over {limit} bytes"),
            ),
        };
        let then = if kept {
            tracing::warn!("a forward's outcome is unknown; the key is kept for an operator");
            "the upstream may have acted on the request; this route keeps the key, so retries \
             get outcome-unknown until an operator resolves it (idem keys resolve)"
        } else {
            "nothing was stored; retrying with the same Idempotency-Key forwards the request \
             again with the same key"
        };
        let detail = format!("{what}; {then}");
        let res = idem_http::problem::<Body>(status, slug, title, Some(&detail), None);
        RequestOutcome::NotStored.mark(res)
    }
}

impl Upstream {
    /// A client for `upstream` whose exchanges take at most `timeout`.
    pub fn new(upstream: &HttpBase, timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(512)
            .build(connector);
        Self {
            client,
            authority: upstream.authority.clone(),
            prefix: upstream.prefix.clone(),
            timeout,
        }
    }

    /// Forwards a request whose answer is not stored (an unlisted route,
    /// or no key where it is optional) with `key` as its only
    /// `Idempotency-Key` (none without): the upstream's answer as it came,
    /// at most [`PASS_THROUGH_MAX_ANSWER`] bytes, or 502/504.
    pub async fn pass(&self, parts: &Parts, body: Bytes, key: Option<&HeaderValue>) -> Response {
        match self
            .send_bounded(parts, body, key, PASS_THROUGH_MAX_ANSWER)
            .await
        {
            Ok(answer) => RequestOutcome::Unkeyed.mark(answer.into_response()),
            Err(e) => e.into_response(false),
        }
    }

    /// Forwards, reading at most `max_answer` bytes back.
    pub async fn send_bounded(
        &self,
        parts: &Parts,
        body: Bytes,
        key: Option<&HeaderValue>,
        max_answer: usize,
    ) -> Result<Answer, ForwardError> {
        let req = self.request(parts, body, key)?;
        let exchange = async {
            let res = self.client.request(req).await.map_err(|e| {
                let why = idem_core::ErrorChain(&e).to_string();
                if e.is_connect() {
                    ForwardError::Unreachable(why)
                } else {
                    ForwardError::Broken(why)
                }
            })?;
            let (head, body) = res.into_parts();
            let body = match Limited::new(body, max_answer).collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                    return Err(ForwardError::TooLarge(max_answer));
                }
                Err(e) => return Err(ForwardError::Broken(e.to_string())),
            };
            Ok(Answer {
                status: head.status,
                headers: end_to_end(&head.headers),
                body,
            })
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(answer) => answer,
            Err(_) => Err(ForwardError::Timeout(self.timeout)),
        }
    }

    fn request(
        &self,
        parts: &Parts,
        body: Bytes,
        key: Option<&HeaderValue>,
    ) -> Result<Request<Full<Bytes>>, ForwardError> {
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let uri = format!("http://{}{}{target}", self.authority, self.prefix);
        let mut headers = end_to_end(&parts.headers);
        headers.remove(idem_http::IDEMPOTENCY_KEY);
        if let Some(key) = key {
            headers.insert(idem_http::IDEMPOTENCY_KEY, key.clone());
        }
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip().to_string());
        if let Some(ip) = peer {
            let value = match parts
                .headers
                .get("x-forwarded-for")
                .and_then(|v| v.to_str().ok())
            {
                Some(earlier) => format!("{earlier}, {ip}"),
                None => ip,
            };
            if let Ok(v) = HeaderValue::from_str(&value) {
                headers.insert(HeaderName::from_static("x-forwarded-for"), v);
            }
        }
        if !headers.contains_key("x-forwarded-proto") {
            headers.insert(
                HeaderName::from_static("x-forwarded-proto"),
                HeaderValue::from_static("http"),
            );
        }
        if let Some(host) = parts.headers.get(header::HOST) {
            headers.insert(HeaderName::from_static("x-forwarded-host"), host.clone());
        }
        let mut req = Request::builder()
            .method(parts.method.clone())
            .uri(uri)
            .body(Full::new(body))
            .map_err(|e| ForwardError::Unreachable(format!("cannot build the request: {e}")))?;
        if let Ok(host) = HeaderValue::from_str(&self.authority) {
            headers.insert(header::HOST, host);
        }
        *req.headers_mut() = headers;
        Ok(req)
    }
}

/// The headers without the hop-by-hop ones, and without those the
/// `Connection` header names.
fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .collect();
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n) || named.iter().any(|c| c == n) {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_dropped() {
        let mut h = HeaderMap::new();
        for (n, v) in [
            ("connection", "keep-alive, x-secret-hop"),
            ("keep-alive", "timeout=5"),
            ("x-secret-hop", "1"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("content-type", "application/json"),
            ("retry-after", "3"),
            ("set-cookie", "a=1"),
            ("set-cookie", "b=2"),
        ] {
            h.append(HeaderName::from_static(n), HeaderValue::from_static(v));
        }
        let kept = end_to_end(&h);
        let names: Vec<&str> = kept.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["content-type", "retry-after", "set-cookie"]);
        assert_eq!(kept.get_all("set-cookie").iter().count(), 2);
    }
}
