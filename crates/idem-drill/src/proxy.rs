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
    /// Whether the target had started answering when the proxy cut: the
    /// first request had finished, as far as a client can know.
    pub answered: bool,
    /// How long after the first request bytes the target began answering.
    pub answered_after: Option<Duration>,
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
            let mut sent: Option<tokio::time::Instant> = None;
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
                        log.answered = matches!(read, Ok(n) if n > 0);
                        if log.answered {
                            log.answered_after = sent.map(|t| t.elapsed());
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
