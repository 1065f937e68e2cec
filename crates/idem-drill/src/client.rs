//! How the drills talk to the target: well-formed requests through hyper,
//! malformed ones through a small HTTP/1.1 writer of its own, and the
//! loopback proxy that loses an answer. Every exchange is bounded (time and
//! bytes), and every request is counted against the budget first.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::http::{HeaderName, HeaderValue, Method, Request, header};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::answer::{Answer, MAX_ANSWER_BYTES, MAX_HEAD_BYTES, complete, parse_answer};
use super::config::DrillConfig;
use super::error::SendError;

/// The hard cap on requests sent.
#[derive(Debug)]
pub struct Budget {
    max: Option<u64>,
    sent: AtomicU64,
}

impl Budget {
    /// A budget of `max` requests (`None`: unbounded).
    pub fn new(max: Option<u64>) -> Self {
        Self {
            max,
            sent: AtomicU64::new(0),
        }
    }

    /// Takes `n` requests at once, or none.
    pub fn take(&self, n: u64) -> Result<(), SendError> {
        self.sent
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |sent| match self.max {
                Some(max) if sent + n > max => None,
                _ => Some(sent + n),
            })
            .map(drop)
            .map_err(|_| SendError::Budget)
    }

    /// Requests sent (or taken) so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }

    /// Requests left (`None`: unbounded).
    pub fn left(&self) -> Option<u64> {
        self.max.map(|m| m.saturating_sub(self.sent()))
    }
}

/// The `Idempotency-Key` of a well-formed request.
#[derive(Debug, Clone, Copy)]
pub enum Key<'a> {
    /// No header.
    None,
    /// One header with this value.
    One(&'a str),
}

/// The drills' client: the target, the shared headers, the timeout and the
/// budget.
#[derive(Debug, Clone)]
pub struct Client {
    authority: String,
    prefix: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    timeout: Duration,
    budget: Arc<Budget>,
}

async fn within<T>(
    timeout: Duration,
    f: impl Future<Output = Result<T, SendError>>,
) -> Result<T, SendError> {
    tokio::time::timeout(timeout, f)
        .await
        .unwrap_or_else(|_| Err(SendError::Timeout(idem_core::duration_text(timeout))))
}

/// A connection ready to carry one request (the concurrency drill opens
/// them all before sending any).
pub struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl Client {
    /// The client of `config`, counting against `budget`.
    pub fn new(config: &DrillConfig, budget: Arc<Budget>) -> Self {
        Self {
            authority: config.target.authority.clone(),
            prefix: config.target.prefix.clone(),
            headers: config.headers.clone(),
            timeout: config.timeout,
            budget,
        }
    }

    /// The budget.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// The timeout of one exchange.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The target's first address.
    pub async fn resolve(&self) -> Result<SocketAddr, SendError> {
        let connect = |reason: String| SendError::Connect {
            addr: self.authority.clone(),
            reason,
        };
        let mut addrs = within(self.timeout, async {
            tokio::net::lookup_host(&self.authority)
                .await
                .map_err(|e| connect(e.to_string()))
        })
        .await?;
        addrs
            .next()
            .ok_or_else(|| connect("the name resolves to no address".into()))
    }

    async fn tcp(&self, addr: SocketAddr) -> Result<TcpStream, SendError> {
        within(self.timeout, async {
            TcpStream::connect(addr)
                .await
                .map_err(|e| SendError::Connect {
                    addr: self.authority.clone(),
                    reason: e.to_string(),
                })
        })
        .await
    }

    /// Opens a connection to `addr` (the target's, or the proxy's).
    pub async fn open(&self, addr: SocketAddr) -> Result<Conn, SendError> {
        let stream = self.tcp(addr).await?;
        let (sender, conn) = within(self.timeout, async {
            hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| SendError::Transport(e.to_string()))
        })
        .await?;
        // The connection task ends when the sender is dropped or the peer
        // closes; the bound is for a peer that does neither.
        let limit = self.timeout * 3;
        tokio::spawn(async move {
            let _ = tokio::time::timeout(limit, conn).await;
        });
        Ok(Conn { sender })
    }

    /// The full path of `path` under the target's prefix.
    pub fn path(&self, path: &str) -> String {
        format!("{}{path}", self.prefix)
    }

    /// Sends one well-formed request on `conn`, counted against the budget.
    pub async fn send_on(
        &self,
        conn: Conn,
        method: &Method,
        path: &str,
        key: Key<'_>,
        body: Option<&str>,
    ) -> Result<Answer, SendError> {
        self.budget.take(1)?;
        self.send_prepaid(conn, method, path, key, body).await
    }

    /// Sends one well-formed request on `conn` that the caller already took
    /// from the budget ([`Budget::take`]).
    pub async fn send_prepaid(
        &self,
        mut conn: Conn,
        method: &Method,
        path: &str,
        key: Key<'_>,
        body: Option<&str>,
    ) -> Result<Answer, SendError> {
        let mut req = Request::builder()
            .method(method.clone())
            .uri(self.path(path))
            .header(header::HOST, &self.authority);
        for (n, v) in &self.headers {
            req = req.header(n, v);
        }
        if let Key::One(k) = key {
            req = req.header("idempotency-key", k);
        }
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        if !self
            .headers
            .iter()
            .any(|(n, _)| n == header::ACCEPT_ENCODING)
        {
            req = req.header(header::ACCEPT_ENCODING, "gzip");
        }
        let body = Bytes::from(body.unwrap_or_default().to_owned());
        let req = req
            .body(Full::new(body))
            .map_err(|e| SendError::Transport(format!("cannot build the request: {e}")))?;
        within(self.timeout, async {
            let res = conn
                .sender
                .send_request(req)
                .await
                .map_err(|e| SendError::Transport(error_text(&e)))?;
            let (parts, body) = res.into_parts();
            let body = Limited::new(body, MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| {
                    if e.downcast_ref::<http_body_util::LengthLimitError>()
                        .is_some()
                    {
                        SendError::TooLarge
                    } else {
                        SendError::Transport(e.to_string())
                    }
                })?
                .to_bytes();
            let headers = parts
                .headers
                .iter()
                .map(|(n, v)| {
                    (
                        n.as_str().to_owned(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect();
            Answer::decoded(parts.status.as_u16(), headers, body)
        })
        .await
    }

    /// Sends one well-formed request to the target on a new connection.
    pub async fn send(
        &self,
        method: &Method,
        path: &str,
        key: Key<'_>,
        body: Option<&str>,
    ) -> Result<Answer, SendError> {
        if self.budget.left() == Some(0) {
            return Err(SendError::Budget);
        }
        let addr = self.resolve().await?;
        self.send_via(addr, method, path, key, body).await
    }

    /// Sends one well-formed request to `addr` (the proxy) on a new connection.
    pub async fn send_via(
        &self,
        addr: SocketAddr,
        method: &Method,
        path: &str,
        key: Key<'_>,
        body: Option<&str>,
    ) -> Result<Answer, SendError> {
        let conn = self.open(addr).await?;
        self.send_on(conn, method, path, key, body).await
    }

    /// Sends a request with `key_lines` (raw header lines, each without
    /// CRLF, bytes as given) in place of a well-formed key, written byte
    /// by byte, and reads the answer to the connection's end.
    pub async fn send_raw(
        &self,
        method: &Method,
        path: &str,
        key_lines: &[Vec<u8>],
        body: Option<&str>,
    ) -> Result<Answer, SendError> {
        let mut req = Vec::new();
        req.extend_from_slice(
            format!(
                "{method} {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
                self.path(path),
                self.authority
            )
            .as_bytes(),
        );
        for (n, v) in &self.headers {
            req.extend_from_slice(n.as_str().as_bytes());
            req.extend_from_slice(b": ");
            req.extend_from_slice(v.as_bytes());
            req.extend_from_slice(b"\r\n");
        }
        for line in key_lines {
            req.extend_from_slice(line);
            req.extend_from_slice(b"\r\n");
        }
        let body = body.unwrap_or_default();
        if !body.is_empty() {
            req.extend_from_slice(b"Content-Type: application/json\r\n");
        }
        req.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
        req.extend_from_slice(body.as_bytes());
        if self.budget.left() == Some(0) {
            return Err(SendError::Budget);
        }
        let addr = self.resolve().await?;
        let mut stream = self.tcp(addr).await?;
        self.budget.take(1)?;
        let raw = within(self.timeout, async {
            stream
                .write_all(&req)
                .await
                .map_err(|e| SendError::Transport(e.to_string()))?;
            // Read to the answer's end: its Content-Length, its last chunk,
            // or the connection's close, whichever the answer says; a peer
            // that keeps the connection open after a whole answer is fine.
            let mut raw = Vec::new();
            let limit = MAX_HEAD_BYTES + MAX_ANSWER_BYTES + 1;
            let mut buf = [0u8; 8192];
            while raw.len() < limit && !complete(&raw) {
                let n = stream
                    .read(&mut buf)
                    .await
                    .map_err(|e| SendError::Transport(e.to_string()))?;
                if n == 0 {
                    break;
                }
                raw.extend_from_slice(&buf[..n]);
            }
            Ok(raw)
        })
        .await?;
        parse_answer(&raw)
    }
}

fn error_text(e: &hyper::Error) -> String {
    use std::error::Error;
    match e.source() {
        Some(s) => format!("{e}: {s}"),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_never_exceeded() {
        let b = Budget::new(Some(3));
        assert!(b.take(2).is_ok());
        assert!(b.take(2).is_err(), "all or nothing");
        assert!(b.take(1).is_ok());
        assert!(b.take(1).is_err());
        assert_eq!(b.sent(), 3);
    }
}
