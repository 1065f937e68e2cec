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
use tokio::net::{TcpListener, TcpStream};

use super::config::DrillConfig;

/// The largest answer body read.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;
/// The largest answer head read by the raw writer.
const MAX_HEAD_BYTES: usize = 64 << 10;

/// What one request got back.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// Header names (lower case) and values.
    pub headers: Vec<(String, String)>,
    /// The body, at most [`MAX_ANSWER_BYTES`], decoded when its
    /// `Content-Encoding` is gzip (the drills send `Accept-Encoding: gzip`
    /// as real clients do).
    pub body: Bytes,
    /// Why the body is not what its headers say, if it is not: a gzip
    /// body that does not decode, or gzip bytes without `Content-Encoding`
    /// (a replay that lost the header).
    pub garbled: Option<String>,
}

/// The replay headers in use, the usual one first. Any other header whose
/// name holds both `idempoten` and `replay` counts too (not `Replay-Nonce`,
/// which is another thing).
pub const REPLAY_HEADERS: &[&str] = &[
    "idempotent-replayed",
    "idempotency-replayed",
    "x-idempotent-replayed",
    "x-idempotency-replayed",
    "idempotency-replay",
    "x-idempotency-replay",
];

impl Answer {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The replay header it carries, if any (`Idempotent-Replayed`, or a
    /// variant: see [`REPLAY_HEADERS`]), name and value.
    pub fn replay_header(&self) -> Option<(&str, &str)> {
        REPLAY_HEADERS
            .iter()
            .find_map(|name| self.header(name).map(|v| (*name, v)))
            .or_else(|| {
                self.headers
                    .iter()
                    .find(|(n, _)| n.contains("idempoten") && n.contains("replay"))
                    .map(|(n, v)| (n.as_str(), v.as_str()))
            })
    }

    /// Whether it is marked as a replay (a replay header saying `true`,
    /// `1` or `yes`).
    pub fn replayed(&self) -> bool {
        self.replay_header().is_some_and(|(_, v)| {
            ["true", "1", "yes"]
                .iter()
                .any(|t| v.trim().eq_ignore_ascii_case(t))
        })
    }

    /// A 2xx.
    pub fn success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The same status and (decoded) body bytes.
    /// The same status and body: the same bytes, or the same JSON value
    /// written another way (a replay re-serialised from a `jsonb` column
    /// reorders keys and adds spaces; it is the same answer).
    pub fn same(&self, other: &Answer) -> bool {
        self.status == other.status
            && (self.body == other.body
                || matches!((self.json(), other.json()), (Some(a), Some(b)) if a == b))
    }

    /// When a client may send the request again unchanged: `409` (the
    /// first still in flight), `425`, `429` and `503`, after the pause of a
    /// `Retry-After` in seconds if there is one (at most `cap`).
    pub fn try_again_after(&self, cap: Duration) -> Option<Option<Duration>> {
        matches!(self.status, 409 | 425 | 429 | 503).then(|| {
            self.header("retry-after")
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(|s| Duration::from_secs(s).min(cap))
        })
    }

    /// `201 replayed {"id":…}` (the body truncated), for evidence.
    pub fn brief(&self) -> String {
        let body = if self.body.is_empty() {
            "(no body)".to_owned()
        } else {
            super::report::truncate(&String::from_utf8_lossy(&self.body), 160)
        };
        format!(
            "{}{} {body}{}",
            self.status,
            if self.replayed() { " replayed" } else { "" },
            self.garbled
                .as_deref()
                .map(|g| format!(" [{g}]"))
                .unwrap_or_default()
        )
    }

    /// The body as JSON, if it is.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// `--max-requests` is used up; nothing was sent.
    #[error("the request budget (--max-requests) is used up")]
    Budget,
    /// No connection to the target.
    #[error("cannot connect to {addr}: {reason}")]
    Connect {
        /// Where.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The exchange took longer than `--timeout`.
    #[error("no complete answer within {0}")]
    Timeout(String),
    /// The connection broke, or the answer was not HTTP.
    #[error("{0}")]
    Transport(String),
    /// The answer body is over [`MAX_ANSWER_BYTES`].
    #[error("the answer is over {MAX_ANSWER_BYTES} bytes")]
    TooLarge,
}

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

/// Reads a whole HTTP/1.1 answer (the connection closed after it).
pub fn parse_answer(raw: &[u8]) -> Result<Answer, SendError> {
    let bad = |why: &str| SendError::Transport(format!("not an HTTP answer: {why}"));
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of head"))?;
    if end > MAX_HEAD_BYTES {
        return Err(bad("head over 64 KiB"));
    }
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .filter(|l| l.starts_with("HTTP/1."))
        .and_then(|l| l.get(9..12))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| bad("no status line"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| {
            let (n, v) = l.split_once(':')?;
            Some((n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        })
        .collect();
    let rest = &raw[end + 4..];
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
    let body = if chunked {
        dechunk(rest).ok_or_else(|| bad("broken chunked body"))?
    } else {
        match headers.iter().find(|(n, _)| n == "content-length") {
            Some((_, v)) => {
                let len: usize = v.parse().map_err(|_| bad("bad Content-Length"))?;
                rest.get(..len)
                    .ok_or_else(|| bad("body shorter than Content-Length"))?
                    .to_vec()
            }
            None => rest.to_vec(),
        }
    };
    if body.len() > MAX_ANSWER_BYTES {
        return Err(SendError::TooLarge);
    }
    Answer::decoded(status, headers, Bytes::from(body))
}

impl Answer {
    /// The answer with its body decoded as its `Content-Encoding` says
    /// (gzip; other codings are kept as sent), and what is wrong with it.
    fn decoded(
        status: u16,
        headers: Vec<(String, String)>,
        body: Bytes,
    ) -> Result<Answer, SendError> {
        let coding = headers
            .iter()
            .find(|(n, _)| n == "content-encoding")
            .map(|(_, v)| v.trim().to_ascii_lowercase());
        let gzip_file = headers.iter().any(|(n, v)| {
            n == "content-type" && {
                let v = v.to_ascii_lowercase();
                v.contains("gzip") || v.starts_with("application/octet-stream")
            }
        });
        let gzip_bytes = body.starts_with(&[0x1f, 0x8b]) && !gzip_file;
        let (body, garbled) = match coding.as_deref() {
            Some("gzip" | "x-gzip") => match gunzip(&body)? {
                Some(plain) if plain.starts_with(&[0x1f, 0x8b]) && !gzip_file => (
                    plain,
                    Some("gzip twice: decoded once, the body is still gzip".to_owned()),
                ),
                Some(plain) => (plain, None),
                None => (
                    body,
                    Some("Content-Encoding: gzip but the body is not gzip".to_owned()),
                ),
            },
            None | Some("identity") if gzip_bytes => (
                body,
                Some(
                    "gzip bytes without Content-Encoding: a client cannot read this body"
                        .to_owned(),
                ),
            ),
            _ => (body, None),
        };
        Ok(Answer {
            status,
            headers,
            body,
            garbled,
        })
    }
}

/// `body` gunzipped, at most [`MAX_ANSWER_BYTES`] of it; `None` when it is
/// not gzip.
fn gunzip(body: &[u8]) -> Result<Option<Bytes>, SendError> {
    use std::io::Read;
    let mut out = Vec::new();
    let limit = MAX_ANSWER_BYTES as u64 + 1;
    match flate2::read::GzDecoder::new(body)
        .take(limit)
        .read_to_end(&mut out)
    {
        Ok(_) if out.len() > MAX_ANSWER_BYTES => Err(SendError::TooLarge),
        Ok(_) => Ok(Some(Bytes::from(out))),
        Err(_) => Ok(None),
    }
}

/// Whether `raw` holds a whole answer whose end its head states (a
/// `Content-Length`, or chunks); one without either ends with the
/// connection.
fn complete(raw: &[u8]) -> bool {
    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let rest = &raw[end + 4..];
    let mut length = None;
    for line in head.split("\r\n").skip(1) {
        match line.split_once(':') {
            Some((n, v)) if n.trim() == "transfer-encoding" && v.contains("chunked") => {
                return dechunk(rest).is_some();
            }
            Some((n, v)) if n.trim() == "content-length" => length = v.trim().parse::<usize>().ok(),
            _ => {}
        }
    }
    length.is_some_and(|len| rest.len() >= len)
}

fn dechunk(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&rest[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        if size > MAX_ANSWER_BYTES.saturating_sub(out.len()) + 1 {
            return None;
        }
        out.extend_from_slice(rest.get(..size)?);
        rest = rest.get(size + 2..)?;
    }
}

/// What the losing proxy saw.
#[derive(Debug, Clone, Default)]
pub struct ProxyLog {
    /// Request bytes forwarded to the target.
    pub forwarded: usize,
    /// Whether the target had started answering when the proxy cut.
    pub answered: bool,
    /// Whether it cut because the client gave up (before any answer).
    pub gave_up: bool,
}

/// A proxy on `127.0.0.1:0` in front of `target` for one connection: it
/// forwards the request, and drops both sides as soon as the target starts
/// answering (or after `wait`), so the client never gets the answer. With
/// `give_up`, it also drops both sides that long after the first request
/// bytes, as a client whose own timeout fired: the target may still be
/// working on it.
pub struct LosingProxy {
    /// Where the client connects.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<ProxyLog>,
}

impl LosingProxy {
    /// Starts it.
    pub async fn start(
        target: SocketAddr,
        wait: Duration,
        give_up: Option<Duration>,
    ) -> Result<Self, SendError> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| SendError::Transport(format!("cannot start the proxy: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| SendError::Transport(format!("cannot start the proxy: {e}")))?;
        let task = tokio::spawn(async move {
            let mut log = ProxyLog::default();
            let Ok(Ok((mut client, _))) = tokio::time::timeout(wait, listener.accept()).await
            else {
                return log;
            };
            let Ok(Ok(mut upstream)) = tokio::time::timeout(wait, TcpStream::connect(target)).await
            else {
                return log;
            };
            let deadline = tokio::time::sleep(wait);
            tokio::pin!(deadline);
            let patience = tokio::time::sleep(wait);
            tokio::pin!(patience);
            let (mut from_client, mut from_upstream) = ([0u8; 8192], [0u8; 1024]);
            loop {
                tokio::select! {
                    read = client.read(&mut from_client) => match read {
                        Ok(n) if n > 0 => {
                            if upstream.write_all(&from_client[..n]).await.is_err() {
                                break;
                            }
                            if log.forwarded == 0
                                && let Some(g) = give_up
                            {
                                patience.as_mut().reset(tokio::time::Instant::now() + g.min(wait));
                            }
                            log.forwarded += n;
                        }
                        _ => break,
                    },
                    read = upstream.read(&mut from_upstream) => {
                        log.answered = matches!(read, Ok(n) if n > 0);
                        break;
                    }
                    _ = &mut deadline => break,
                    _ = &mut patience, if give_up.is_some() && log.forwarded > 0 => {
                        log.gave_up = true;
                        break;
                    }
                }
            }
            // Both sides dropped here: the answer is lost.
            log
        });
        Ok(Self { addr, task })
    }

    /// What it saw, once it has cut.
    pub async fn log(self) -> ProxyLog {
        self.task.await.unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_answers_parse_with_length_or_chunks() {
        let a = parse_answer(
            b"HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\nIdempotent-Replayed: true\r\n\r\n{}",
        )
        .unwrap();
        assert_eq!(
            (a.status, &a.body[..], a.replayed()),
            (400, &b"{}"[..], true)
        );
        let c = parse_answer(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(&c.body[..], b"abcde");
        assert!(parse_answer(b"garbage").is_err());
        let v = parse_answer(
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nIdempotency-Replayed: True\r\n\r\n",
        )
        .unwrap();
        assert_eq!(v.replay_header(), Some(("idempotency-replayed", "True")));
        assert!(v.replayed(), "a variant of the header");
        assert!(parse_answer(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab").is_err());
    }

    #[test]
    fn gzip_answers_are_decoded_and_lost_encodings_seen() {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(b"{\"id\":1}").unwrap();
        let gz = gz.finish().unwrap();
        let head = |coding: &str| {
            let mut h = vec![("content-type".to_owned(), "application/json".to_owned())];
            if !coding.is_empty() {
                h.push(("content-encoding".to_owned(), coding.to_owned()));
            }
            h
        };
        let a = Answer::decoded(200, head("gzip"), Bytes::from(gz.clone())).unwrap();
        assert_eq!(
            (&a.body[..], a.garbled.is_none()),
            (&b"{\"id\":1}"[..], true)
        );
        let lost = Answer::decoded(200, head(""), Bytes::from(gz)).unwrap();
        assert!(lost.garbled.is_some(), "gzip bytes without the header");
        assert!(!lost.same(&a));
        let wrong = Answer::decoded(200, head("gzip"), Bytes::from_static(b"{}")).unwrap();
        assert!(wrong.garbled.is_some());
        let plain = Answer::decoded(200, head(""), Bytes::from_static(b"{}")).unwrap();
        assert!(plain.garbled.is_none());
    }

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
