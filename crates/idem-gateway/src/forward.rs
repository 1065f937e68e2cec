//! One exchange with the upstream: the request rewritten as a reverse
//! proxy should (hop-by-hop headers dropped, `X-Forwarded-*` set, the key
//! header replaced), over a keep-alive pool, bounded in time and in the
//! bytes read back.
//!
//! - A keyed forward ([`Upstream::forward`]) and a lookup
//!   ([`Upstream::lookup`]) read the answer whole, at most the route's
//!   `max_response_bytes`, and ask for it unencoded (`Accept-Encoding:
//!   identity`); an answer gzip- or deflate-encoded anyway is decoded, so
//!   what is stored — and replayed to any client — is readable.
//! - A pass-through ([`Upstream::pass`]) streams the answer to the client
//!   as it comes: the upstream is read as fast as the client reads, and a
//!   silent upstream ends the answer after the gateway's timeout. Nothing
//!   of it is held beyond the connections' buffers.

use std::io::Read;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, header};
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idem_http::RequestOutcome;
use tokio::time::Sleep;

use crate::config::HttpBase;
use crate::problems;

/// Headers that belong to one connection, never forwarded (RFC 9110 7.6.1).
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
    /// Its end-to-end headers (no `Content-Length`; no `Content-Encoding`
    /// once decoded).
    pub headers: HeaderMap,
    /// Its body, unencoded.
    pub body: Bytes,
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
    /// Whether the request may have reached the upstream.
    pub fn may_have_acted(&self) -> bool {
        !matches!(self, ForwardError::Unreachable(_))
    }

    /// A short reason for operators (stored with an unknown outcome).
    pub fn reason(&self) -> String {
        match self {
            ForwardError::Unreachable(_) => "unreachable".into(),
            ForwardError::Broken(_) => "broken".into(),
            ForwardError::Timeout(_) => "timeout".into(),
            ForwardError::TooLarge(n) => format!("answer over {n} bytes"),
        }
    }

    /// The cause, logged (never sent to the client).
    pub fn log(&self) {
        match self {
            ForwardError::Unreachable(why) => tracing::warn!(error = %why, "upstream unreachable"),
            ForwardError::Broken(why) => {
                tracing::warn!(error = %why, "the exchange with the upstream broke");
            }
            ForwardError::Timeout(d) => {
                tracing::warn!(
                    timeout_ms = d.as_millis() as u64,
                    "the upstream did not answer in time"
                );
            }
            ForwardError::TooLarge(n) => {
                tracing::warn!(limit = n, "the upstream's answer is over the route's limit");
            }
        }
    }

    /// 502 or 504, problem+json, with `then`: what the key's state means
    /// for a retry.
    pub fn into_response(self, then: &str, retry_after: Option<u64>) -> Response {
        self.log();
        let (status, slug, title, what) = match &self {
            ForwardError::Unreachable(_) => (
                StatusCode::BAD_GATEWAY,
                "upstream-unavailable",
                "The upstream service is unavailable",
                "the upstream could not be reached; nothing was sent".to_owned(),
            ),
            ForwardError::Broken(_) => (
                StatusCode::BAD_GATEWAY,
                "upstream-unavailable",
                "The upstream service is unavailable",
                "the exchange with the upstream broke before its answer".to_owned(),
            ),
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
        problems::problem(status, slug, title, &format!("{what}; {then}"), retry_after)
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
    /// or no key where it is optional) with the client's `Idempotency-Key`
    /// when `key` is given: the upstream's answer streamed as it comes, or
    /// 502/504.
    pub async fn pass(&self, parts: &Parts, body: Bytes, key: Option<&HeaderValue>) -> Response {
        let key = key.map(|v| (idem_http::IDEMPOTENCY_KEY, v.clone()));
        let req = match self.request(parts, &parts.method, self.target(parts), body, key, false) {
            Ok(r) => r,
            Err(e) => {
                return RequestOutcome::Unkeyed.mark(e.into_response("nothing was sent", None));
            }
        };
        let head = match tokio::time::timeout(self.timeout, self.client.request(req)).await {
            Ok(Ok(res)) => res,
            Ok(Err(e)) => {
                let e = client_error(&e);
                let then = if e.may_have_acted() {
                    "the upstream may have acted on the request"
                } else {
                    "retrying is safe"
                };
                return RequestOutcome::Unkeyed.mark(e.into_response(then, None));
            }
            Err(_) => {
                let e = ForwardError::Timeout(self.timeout);
                return RequestOutcome::Unkeyed
                    .mark(e.into_response("the upstream may have acted on the request", None));
            }
        };
        let (head, incoming) = head.into_parts();
        let mut res = Response::new(Body::new(Silence::new(incoming, self.timeout)));
        *res.status_mut() = head.status;
        *res.headers_mut() = end_to_end(&head.headers);
        RequestOutcome::Unkeyed.mark(res)
    }

    /// A keyed forward with `key` (the derived one, under the route's
    /// header): the answer read whole, at most `max_answer` bytes.
    pub async fn forward(
        &self,
        parts: &Parts,
        body: Bytes,
        key: (HeaderName, HeaderValue),
        max_answer: usize,
    ) -> Result<Answer, ForwardError> {
        let req = self.request(
            parts,
            &parts.method,
            self.target(parts),
            body,
            Some(key),
            true,
        )?;
        self.exchange(req, max_answer).await
    }

    /// The lookup of a `verify` route: `GET target` with the request's
    /// headers (its credentials, its tenant) but no body, the derived key
    /// under the route's header.
    pub async fn lookup(
        &self,
        parts: &Parts,
        target: &str,
        key: (HeaderName, HeaderValue),
        max_answer: usize,
    ) -> Result<Answer, ForwardError> {
        let mut req = self.request(parts, &Method::GET, target, Bytes::new(), Some(key), true)?;
        for h in [
            header::CONTENT_TYPE,
            header::CONTENT_ENCODING,
            header::CONTENT_LANGUAGE,
        ] {
            req.headers_mut().remove(h);
        }
        self.exchange(req, max_answer).await
    }

    fn target<'p>(&self, parts: &'p Parts) -> &'p str {
        parts.uri.path_and_query().map_or("/", |p| p.as_str())
    }

    async fn exchange(
        &self,
        req: Request<Full<Bytes>>,
        max_answer: usize,
    ) -> Result<Answer, ForwardError> {
        let exchange = async {
            let res = self
                .client
                .request(req)
                .await
                .map_err(|e| client_error(&e))?;
            let (head, body) = res.into_parts();
            let body = read_whole(body, max_answer).await?;
            let mut headers = end_to_end(&head.headers);
            headers.remove(header::CONTENT_LENGTH);
            let body = decoded(&mut headers, body, max_answer)?;
            Ok(Answer {
                status: head.status,
                headers,
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
        method: &Method,
        target: &str,
        body: Bytes,
        key: Option<(HeaderName, HeaderValue)>,
        identity: bool,
    ) -> Result<Request<Full<Bytes>>, ForwardError> {
        let uri = format!("http://{}{}{target}", self.authority, self.prefix);
        let mut headers = end_to_end(&parts.headers);
        for h in [header::HOST, header::CONTENT_LENGTH] {
            headers.remove(h);
        }
        headers.remove(idem_http::IDEMPOTENCY_KEY);
        if let Some((name, value)) = key {
            headers.remove(&name);
            headers.insert(name, value);
        }
        if identity {
            // What is stored is replayed to every client, whatever it
            // accepts: ask for the bytes every client can read.
            headers.insert(
                header::ACCEPT_ENCODING,
                HeaderValue::from_static("identity"),
            );
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
            .method(method.clone())
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

/// The whole body, at most `max` bytes, read into one buffer sized by its
/// `Content-Length` when it has one (no second copy of a large answer).
async fn read_whole(mut body: Incoming, max: usize) -> Result<Bytes, ForwardError> {
    let declared = hyper::body::Body::size_hint(&body).exact().unwrap_or(0);
    if declared > max as u64 {
        return Err(ForwardError::TooLarge(max));
    }
    let mut buf = BytesMut::with_capacity(declared as usize);
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| ForwardError::Broken(idem_core::ErrorChain(&e).to_string()))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > max {
                return Err(ForwardError::TooLarge(max));
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
}

fn client_error(e: &hyper_util::client::legacy::Error) -> ForwardError {
    let why = idem_core::ErrorChain(e).to_string();
    if e.is_connect() {
        ForwardError::Unreachable(why)
    } else {
        ForwardError::Broken(why)
    }
}

/// The body unencoded: a `gzip` (`x-gzip`) or `deflate` answer is decoded,
/// at most `max` bytes, and loses its `Content-Encoding`; any other coding
/// is kept as it came (with its header, so it is replayed labelled).
fn decoded(headers: &mut HeaderMap, body: Bytes, max: usize) -> Result<Bytes, ForwardError> {
    let coding = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase());
    let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    let mut out = Vec::new();
    if body.is_empty() {
        // Nothing to decode (a 204, a HEAD-like answer): nothing is encoded.
        headers.remove(header::CONTENT_ENCODING);
        return Ok(body);
    }
    let read = match coding.as_deref() {
        None | Some("") | Some("identity") => return Ok(body),
        Some("gzip" | "x-gzip") => flate2::read::MultiGzDecoder::new(&body[..])
            .take(limit)
            .read_to_end(&mut out),
        Some("deflate") => {
            // RFC 9110's deflate is zlib; some servers send it raw.
            let zlib = flate2::read::ZlibDecoder::new(&body[..])
                .take(limit)
                .read_to_end(&mut out);
            match zlib {
                Ok(n) => Ok(n),
                Err(_) => {
                    out.clear();
                    flate2::read::DeflateDecoder::new(&body[..])
                        .take(limit)
                        .read_to_end(&mut out)
                }
            }
        }
        Some(_) => return Ok(body),
    };
    match read {
        Ok(n) if n > max => Err(ForwardError::TooLarge(max)),
        Ok(_) => {
            headers.remove(header::CONTENT_ENCODING);
            Ok(Bytes::from(out))
        }
        Err(e) => Err(ForwardError::Broken(format!(
            "the answer's {} body does not decode: {e}",
            coding.unwrap_or_default()
        ))),
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

/// A streamed answer that ends with an error when the upstream sends
/// nothing for `limit`.
struct Silence {
    inner: Incoming,
    limit: Duration,
    timer: Pin<Box<Sleep>>,
}

impl Silence {
    fn new(inner: Incoming, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            timer: Box::pin(tokio::time::sleep(limit)),
        }
    }
}

impl hyper::body::Body for Silence {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                let deadline = tokio::time::Instant::now() + this.limit;
                this.timer.as_mut().reset(deadline);
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => match this.timer.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(format!(
                    "the upstream sent nothing for {} ms",
                    this.limit.as_millis()
                )
                .into()))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

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

    fn gzip(data: &[u8]) -> Bytes {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        Bytes::from(e.finish().unwrap())
    }

    #[test]
    fn gzip_and_deflate_answers_are_stored_decoded_and_bounded() {
        let json = br#"{"id":"pay_1","amount":1000}"#;
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        let body = decoded(&mut h, gzip(json), 1 << 20).unwrap();
        assert_eq!(&body[..], json);
        assert!(
            h.get(header::CONTENT_ENCODING).is_none(),
            "no longer encoded"
        );

        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(json).unwrap();
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_static("deflate"),
        );
        let body = decoded(&mut h, Bytes::from(z.finish().unwrap()), 1 << 20).unwrap();
        assert_eq!(&body[..], json);

        // A bomb: small encoded, large decoded.
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        let bomb = gzip(&vec![b'a'; 4 << 20]);
        assert!(bomb.len() < 64 << 10);
        assert!(matches!(
            decoded(&mut h, bomb, 1 << 20),
            Err(ForwardError::TooLarge(_))
        ));
        // Not gzip at all.
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        assert!(matches!(
            decoded(&mut h, Bytes::from_static(b"plain"), 1 << 20),
            Err(ForwardError::Broken(_))
        ));
        // An empty body is not encoded, whatever it says.
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        assert!(decoded(&mut h, Bytes::new(), 1 << 20).unwrap().is_empty());
        assert!(h.get(header::CONTENT_ENCODING).is_none());
        // A coding the gateway cannot read stays as it came, labelled.
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("br"));
        let body = decoded(&mut h, Bytes::from_static(b"\x0b\x02"), 1 << 20).unwrap();
        assert_eq!(&body[..], b"\x0b\x02");
        assert_eq!(h[header::CONTENT_ENCODING], "br");
    }
}
