//! A real HTTP server on 127.0.0.1:0 whose answers each test scripts, and
//! which records every request it receives.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use idem_client::{Client, RetryPolicy};

/// What the server does with one request.
#[derive(Clone, Debug)]
pub enum Action {
    /// Answer with this status, these headers and this body.
    Respond(u16, Vec<(&'static str, String)>, Bytes),
    /// Close the connection without answering.
    Drop,
    /// Never answer (within any test's time).
    Hang,
}

pub fn status(code: u16) -> Action {
    Action::Respond(code, vec![], Bytes::new())
}

pub fn respond(code: u16, headers: &[(&'static str, &str)], body: &'static str) -> Action {
    Action::Respond(
        code,
        headers.iter().map(|(k, v)| (*k, v.to_string())).collect(),
        Bytes::from_static(body.as_bytes()),
    )
}

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub at: Instant,
    pub method: String,
    pub path: String,
    pub key: Option<String>,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

pub struct Server {
    pub url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    /// Starts a server that answers request number `n` (0-based, counted
    /// over all connections) with `script(n)`.
    pub async fn start(script: impl Fn(usize) -> Action + Send + Sync + 'static) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(script);
        let recorder = seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let script = script.clone();
                let seen = recorder.clone();
                let service = service_fn(move |req: Request<Incoming>| {
                    let script = script.clone();
                    let seen = seen.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        let n = {
                            let mut seen = seen.lock().unwrap();
                            seen.push(Seen {
                                at: Instant::now(),
                                method: parts.method.to_string(),
                                path: parts.uri.to_string(),
                                key: parts
                                    .headers
                                    .get("idempotency-key")
                                    .map(|v| v.to_str().unwrap().to_owned()),
                                headers: parts.headers.clone(),
                                body,
                            });
                            seen.len() - 1
                        };
                        match script(n) {
                            Action::Respond(code, headers, body) => {
                                let mut res = Response::new(Full::new(body));
                                *res.status_mut() = StatusCode::from_u16(code).unwrap();
                                for (k, v) in headers {
                                    res.headers_mut().append(
                                        HeaderName::from_static(k),
                                        HeaderValue::from_str(&v).unwrap(),
                                    );
                                }
                                Ok(res)
                            }
                            // An error from the service makes hyper close
                            // the connection without writing an answer.
                            Action::Drop => Err(std::io::Error::other("dropped on purpose")),
                            Action::Hang => {
                                tokio::time::sleep(Duration::from_secs(3600)).await;
                                Err(std::io::Error::other("hung"))
                            }
                        }
                    }
                });
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Server { url, seen }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn keys(&self) -> Vec<String> {
        self.seen().into_iter().map(|s| s.key.unwrap()).collect()
    }
}

/// A policy fast enough for tests: short waits, a generous deadline.
pub fn fast_policy(max_attempts: u32) -> RetryPolicy {
    let mut p = RetryPolicy::default();
    p.max_attempts = max_attempts;
    p.initial_backoff = Duration::from_millis(5);
    p.max_backoff = Duration::from_millis(20);
    p.deadline = Duration::from_secs(20);
    p.attempt_timeout = Duration::from_secs(5);
    p
}

pub fn client(server: &Server, policy: RetryPolicy) -> Client {
    Client::builder()
        .retry_policy(policy)
        .build(&server.url)
        .unwrap()
}
