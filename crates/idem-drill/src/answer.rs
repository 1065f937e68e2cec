//! What an exchange got back: the [`Answer`], and the reader of raw
//! HTTP/1.1 answers (with chunked and gzip bodies) the raw writer needs.

use std::time::Duration;

use bytes::Bytes;
use idem_core::FingerprintSpec;

pub use super::error::MAX_ANSWER_BYTES;
use super::error::SendError;

/// The largest answer head read by the raw writer.
pub(crate) const MAX_HEAD_BYTES: usize = 64 << 10;

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
    /// reorders keys and adds spaces; it is the same answer). Values are
    /// compared as request fingerprints compare them, every digit of every
    /// number (`123…890` and `123…891` are two answers, never one `f64`).
    pub fn same(&self, other: &Answer) -> bool {
        let canonical = |a: &Answer| FingerprintSpec::default().canonical_body(&a.body);
        self.status == other.status
            && (self.body == other.body
                || matches!((canonical(self), canonical(other)), (Some(a), Some(b)) if a == b))
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
    pub(crate) fn decoded(
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
pub(crate) fn complete(raw: &[u8]) -> bool {
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
    fn a_replay_with_another_number_is_another_answer() {
        let answer = |body: &'static str| Answer {
            status: 201,
            headers: vec![("content-type".into(), "application/json".into())],
            body: Bytes::from_static(body.as_bytes()),
            garbled: None,
        };
        let first = answer(r#"{"id":"p_1","amount":123456789012345678901234567890}"#);
        for other in [
            r#"{"id":"p_1","amount":123456789012345678901234567891}"#,
            r#"{"id":"p_1","amount":0.30000000000000001}"#,
        ] {
            assert!(!first.same(&answer(other)), "{other}");
        }
        let exact = answer(r#"{"id":"p_1","amount":0.30000000000000001}"#);
        assert!(!exact.same(&answer(r#"{"id":"p_1","amount":0.3}"#)));
        // The same value written otherwise (a jsonb column's replay) is the
        // same answer.
        for same in [
            r#"{"amount": 123456789012345678901234567890, "id": "p_1"}"#,
            r#"{"amount":1.2345678901234567890123456789e29,"id":"p_1"}"#,
        ] {
            assert!(first.same(&answer(same)), "{same}");
        }
    }
}
