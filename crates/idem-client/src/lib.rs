//! # idem-client: the retrying half of the Idempotency-Key contract
//!
//! A server that speaks the contract (Idem's `IdempotencyLayer`, `idem
//! serve`, or any API that honours `Idempotency-Key`) makes a retry
//! harmless *if the retry carries the same key*. This crate is the client
//! that does that:
//!
//! - [`Client`] holds a base URL, a [`RetryPolicy`] and a response body
//!   limit; [`Client::request`] starts a [`RequestBuilder`], which is one
//!   **intent** with one key: generated once (a v4 UUID) or given with
//!   [`RequestBuilder::key`];
//! - [`RequestBuilder::send`] sends it, and retries **with the same key** on
//!   connection errors, attempt timeouts, `409` in flight, `429` and `5xx`,
//!   after an exponential backoff with full jitter that is never shorter
//!   than the server's `Retry-After`; any other answer, a `4xx` included, is
//!   final and never retried;
//! - one total deadline bounds the attempts and the waits between them;
//! - the final [`Answer`] says whether it was a replay
//!   (`Idempotent-Replayed: true`) and how many attempts it took; a
//!   [`ClientError`] says whether anything was sent and carries the key, so
//!   the intent can be sent again later and get its outcome.
//!
//! ```
//! # use std::convert::Infallible;
//! # use std::sync::Arc;
//! # use std::sync::atomic::{AtomicU32, Ordering};
//! # use bytes::Bytes;
//! # use http_body_util::Full;
//! # use hyper::{Request, Response, body::Incoming, service::service_fn};
//! # use hyper_util::rt::TokioIo;
//! use std::time::Duration;
//! use idem_client::{Client, RetryPolicy};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # // A server whose first answer is lost: it says 503 once, then 201.
//! # let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! # let addr = listener.local_addr()?;
//! # let calls = Arc::new(AtomicU32::new(0));
//! # tokio::spawn(async move {
//! #     while let Ok((stream, _)) = listener.accept().await {
//! #         let calls = calls.clone();
//! #         let service = service_fn(move |req: Request<Incoming>| {
//! #             let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
//! #             assert!(req.headers().contains_key("idempotency-key"));
//! #             async move {
//! #                 let mut res = Response::new(Full::new(Bytes::from_static(b"{\"id\":42}")));
//! #                 if first {
//! #                     *res.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
//! #                 } else {
//! #                     *res.status_mut() = hyper::StatusCode::CREATED;
//! #                     res.headers_mut().insert("idempotent-replayed", hyper::header::HeaderValue::from_static("true"));
//! #                 }
//! #                 Ok::<_, Infallible>(res)
//! #             }
//! #         });
//! #         tokio::spawn(hyper::server::conn::http1::Builder::new()
//! #             .serve_connection(TokioIo::new(stream), service));
//! #     }
//! # });
//! # let base_url = format!("http://{addr}");
//! let mut policy = RetryPolicy::default();
//! policy.deadline = Duration::from_secs(10);
//! let client = Client::builder().retry_policy(policy).build(&base_url)?;
//!
//! // One intent, one key: every attempt of this send carries it.
//! let order = client
//!     .post("/v1/orders")
//!     .key("order-2024-0042")
//!     .json(&serde_json::json!({ "sku": "tea", "qty": 2 }));
//! let answer = order.send().await?;
//!
//! assert_eq!(answer.status, 201);
//! assert_eq!(answer.attempts, 2); // a 503, then the answer
//! assert!(answer.replayed);       // the server had it already
//! assert_eq!(answer.key, "order-2024-0042");
//! # Ok(())
//! # }
//! ```
//!
//! ## What is retried
//!
//! | outcome | retried? |
//! |---|---|
//! | connection refused, reset or closed before a complete answer | yes |
//! | no complete answer within `attempt_timeout` | yes |
//! | `429 Too Many Requests`, any `5xx` (`503` outcome-unknown included) | yes |
//! | `409` with `Retry-After`, or whose problem `type` ends in `in-flight` | yes |
//! | any other `409` (a business conflict) | no: returned |
//! | every other `1xx`–`4xx` | no: returned as an [`Answer`] |
//! | a body over `max_response_body` | no: [`ClientError::ResponseTooLarge`] |
//!
//! Redirects are not followed: a `3xx` is returned. The wait before attempt
//! *n+1* is drawn uniformly in `0..=min(max_backoff, initial_backoff ×
//! 2^(n-1))` and raised to the answer's `Retry-After` (delta-seconds or an
//! HTTP-date) if that is longer. If the wait would end at or after the
//! deadline, the send stops at once with [`ClientError::DeadlineExceeded`]
//! rather than sleep to no purpose. Idem's `409 needs-attention` also comes
//! with a `Retry-After`: it is retried until the deadline, and the error
//! keeps the last answer ([`Failure::answer`]).
//!
//! ## TLS
//!
//! [`Client::new`] speaks plain HTTP and refuses `https` URLs rather than
//! send in clear. For HTTPS, pass a TLS connector (any
//! `hyper_util::client::legacy::connect::Connect`, e.g. `hyper-rustls`) to
//! [`ClientBuilder::build_with_connector`].

mod client;
mod error;
mod key;
mod policy;
mod request;

pub use client::{Client, ClientBuilder, DEFAULT_MAX_RESPONSE_BODY, MAX_RESPONSE_BODY_LIMIT};
pub use error::{ClientError, Failure};
pub use key::MAX_KEY_LEN;
pub use policy::{DEADLINE_LIMIT, MAX_ATTEMPTS_LIMIT, RetryPolicy};
pub use request::{Answer, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, RequestBuilder};

/// The request method [`Client::request`] takes (`http::Method`), so a
/// caller needs no `http` dependency of its own.
pub use http::Method;
