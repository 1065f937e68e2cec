//! The loopback proxy that loses an answer (`lost-response`,
//! `abandoned-request`).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::error::SendError;

/// What the losing proxy saw.
#[derive(Debug, Clone, Default)]
pub struct ProxyLog {
    /// Request bytes forwarded to the target.
    pub forwarded: usize,
    /// Whether the target's whole answer came (read to its end by the
    /// proxy, none of it passed on): the first request had finished, as
    /// far as a client can know.
    pub answered: bool,
    /// How long after the first request bytes the target began answering.
    pub began_after: Option<Duration>,
    /// How long after the first request bytes its whole answer had come.
    pub answered_after: Option<Duration>,
    /// Whether it cut because the client gave up (before any answer).
    pub gave_up: bool,
}

/// The most of an answer the proxy keeps to find its end.
const MAX_ANSWER: usize = 16 << 20;

/// A proxy on `127.0.0.1:0` in front of `target` for one connection: it
/// forwards the request and drops the client as soon as the target starts
/// answering (or after `wait`), so the client never gets the answer; it
/// reads the answer on to its end (within `wait`) to know whether the
/// target had finished — an answer's head can come long before its body.
/// With `give_up`, it drops both sides that long after the first request
/// bytes if no answer began, as a client whose own timeout fired: the
/// target may still be working on it.
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
            let (mut from_client, mut from_upstream) = ([0u8; 8192], [0u8; 8192]);
            let mut sent: Option<tokio::time::Instant> = None;
            let mut answer = Vec::new();
            loop {
                tokio::select! {
                    read = client.read(&mut from_client) => match read {
                        Ok(n) if n > 0 => {
                            if upstream.write_all(&from_client[..n]).await.is_err() {
                                break;
                            }
                            if log.forwarded == 0 {
                                sent = Some(tokio::time::Instant::now());
                                if let Some(g) = give_up {
                                    patience.as_mut().reset(tokio::time::Instant::now() + g.min(wait));
                                }
                            }
                            log.forwarded += n;
                        }
                        _ => break,
                    },
                    read = upstream.read(&mut from_upstream) => {
                        if let Ok(n @ 1..) = read {
                            log.began_after = sent.map(|t| t.elapsed());
                            answer.extend_from_slice(&from_upstream[..n]);
                        }
                        break;
                    }
                    _ = &mut deadline => break,
                    _ = &mut patience, if give_up.is_some() && log.forwarded > 0 => {
                        log.gave_up = true;
                        break;
                    }
                }
            }
            // The client loses the answer here; the target is read on.
            drop(client);
            if log.began_after.is_some() {
                loop {
                    if whole_answer(&answer, false) {
                        log.answered = true;
                        break;
                    }
                    if answer.len() > MAX_ANSWER {
                        break;
                    }
                    tokio::select! {
                        read = upstream.read(&mut from_upstream) => match read {
                            Ok(n @ 1..) => answer.extend_from_slice(&from_upstream[..n]),
                            Ok(_) => {
                                log.answered = whole_answer(&answer, true);
                                break;
                            }
                            Err(_) => break,
                        },
                        _ = &mut deadline => break,
                    }
                }
                if log.answered {
                    log.answered_after = sent.map(|t| t.elapsed());
                }
            }
            log
        });
        Ok(Self { addr, task })
    }

    /// What it saw, once it has cut.
    pub async fn log(self) -> ProxyLog {
        self.task.await.unwrap_or_default()
    }
}

/// Whether `bytes` hold a whole final HTTP/1.1 answer (interim `1xx` ones
/// skipped): its head, and its body as its framing says — `Content-Length`
/// bytes, chunks to the last one, none for `204` and `304`, or, framed by
/// nothing, up to the connection's end (`eof`: the target closed it).
fn whole_answer(bytes: &[u8], eof: bool) -> bool {
    let mut at = 0;
    loop {
        let Some(end) = find(&bytes[at..], b"\r\n\r\n") else {
            return false;
        };
        let head = String::from_utf8_lossy(&bytes[at..at + end]).to_ascii_lowercase();
        let body = &bytes[at + end + 4..];
        let status: u16 = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
        if (100..200).contains(&status) && status != 101 {
            at += end + 4;
            continue;
        }
        if matches!(status, 204 | 304) {
            return true;
        }
        let header = |name: &str| {
            head.split("\r\n").skip(1).find_map(|line| {
                let (n, v) = line.split_once(':')?;
                (n.trim() == name).then(|| v.trim().to_owned())
            })
        };
        if header("transfer-encoding").is_some_and(|te| te.ends_with("chunked")) {
            return chunks_end(body);
        }
        return match header("content-length").and_then(|l| l.parse::<usize>().ok()) {
            Some(length) => body.len() >= length,
            None => eof,
        };
    }
}

/// Whether a chunked body is whole: its last (empty) chunk and the
/// trailers' end are in `body`.
fn chunks_end(body: &[u8]) -> bool {
    let mut at = 0;
    loop {
        let Some(line) = find(&body[at..], b"\r\n") else {
            return false;
        };
        let size = String::from_utf8_lossy(&body[at..at + line]);
        let size = size.split(';').next().unwrap_or("").trim();
        let Ok(size) = usize::from_str_radix(size, 16) else {
            return false;
        };
        at += line + 2;
        if size == 0 {
            // Trailers, if any, end with an empty line.
            let rest = &body[at..];
            return rest.starts_with(b"\r\n") || find(rest, b"\r\n\r\n").is_some();
        }
        at = match at.checked_add(size + 2) {
            Some(next) if next <= body.len() => next,
            _ => return false,
        };
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_whole_when_its_framing_says_so() {
        let head = b"HTTP/1.1 201 Created\r\ncontent-length: 5\r\n\r\n";
        assert!(!whole_answer(head, false));
        assert!(whole_answer(&[&head[..], b"hello"].concat(), false));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(!whole_answer(chunked, false));
        let part = [&chunked[..], b"5\r\nhello\r\n"].concat();
        assert!(!whole_answer(&part, false));
        assert!(whole_answer(&[&part[..], b"0\r\n\r\n"].concat(), false));
        assert!(whole_answer(
            &[&part[..], b"0;x=1\r\nT: 1\r\n\r\n"].concat(),
            false
        ));
        let interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n";
        assert!(whole_answer(interim, false));
        assert!(!whole_answer(&interim[..25], false));
        let unframed = b"HTTP/1.0 200 OK\r\n\r\nabc";
        assert!(!whole_answer(unframed, false));
        assert!(whole_answer(unframed, true));
        assert!(!whole_answer(
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab",
            true
        ));
    }
}
