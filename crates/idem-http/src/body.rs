//! Request bodies read within a route's limit, judged first on what they
//! announce: a body whose declared length (`Content-Length`) is over the
//! limit is refused with `413 body-too-large` before any of it is read, so
//! nothing is buffered or reserved for a size the route would refuse anyway.
//!
//! [`read_body`] is how Idem's routes read a body; [`DeclaredLimitLayer`]
//! puts the same first check in front of handlers that read theirs through
//! an extractor (axum's `Bytes` under `DefaultBodyLimit`).

use std::future::{Ready, ready};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::Either;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use idem_core::BoxError;

use crate::problem::Rejection;

/// Whether `body` announces more than `limit` bytes (its declared length,
/// or the least it says it will be). A chunked body announces nothing.
pub fn declared_over<B: Body + ?Sized>(body: &B, limit: usize) -> bool {
    body.size_hint().lower() > limit as u64
}

/// Reads `body` whole, at most `limit` bytes. [`Rejection::BodyTooLarge`]
/// when its declared length is over the limit (nothing read) or as soon as
/// more arrives; [`Rejection::UnreadableBody`] when it breaks off.
pub async fn read_body<B>(body: B, limit: usize) -> Result<Bytes, Rejection>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    if declared_over(&body, limit) {
        return Err(Rejection::BodyTooLarge);
    }
    match Limited::new(body, limit).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(Rejection::BodyTooLarge),
        Err(e) => {
            tracing::debug!(error = %e, "request body could not be read");
            Err(Rejection::UnreadableBody)
        }
    }
}

/// Answers a request whose declared body length is over `limit` with `413
/// body-too-large` before the inner service sees it. For routes that read
/// their body through an extractor; the bound while reading stays the
/// extractor's (axum: `DefaultBodyLimit::max(limit)` beside it).
///
/// ```
/// use axum::{Router, body::Body, http::{Request, StatusCode}, routing::post};
/// use idem_http::DeclaredLimitLayer;
/// use tower::ServiceExt;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let app = Router::new()
///     .route("/notes", post(|body: bytes::Bytes| async move { body.len().to_string() }))
///     .layer(axum::extract::DefaultBodyLimit::max(1024))
///     .layer(DeclaredLimitLayer::new(1024));
/// let big = Request::post("/notes").header("content-length", "4096").body(Body::from(vec![b'x'; 4096]))?;
/// assert_eq!(app.oneshot(big).await?.status(), StatusCode::PAYLOAD_TOO_LARGE);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct DeclaredLimitLayer {
    limit: usize,
}

impl DeclaredLimitLayer {
    /// Bodies declared over `limit` bytes are refused.
    pub fn new(limit: usize) -> Self {
        Self { limit }
    }
}

impl<S> tower::Layer<S> for DeclaredLimitLayer {
    type Service = DeclaredLimit<S>;
    fn layer(&self, inner: S) -> DeclaredLimit<S> {
        DeclaredLimit {
            inner,
            limit: self.limit,
        }
    }
}

/// The service of [`DeclaredLimitLayer`].
#[derive(Debug, Clone)]
pub struct DeclaredLimit<S> {
    inner: S,
    limit: usize,
}

impl<S, B, RB> tower::Service<Request<B>> for DeclaredLimit<S>
where
    S: tower::Service<Request<B>, Response = Response<RB>>,
    B: Body,
    RB: From<Bytes>,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = Either<Ready<Result<Response<RB>, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        if declared_over(req.body(), self.limit) {
            return Either::Left(ready(Ok(Rejection::BodyTooLarge.into_response())));
        }
        Either::Right(self.inner.call(req))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{Full, StreamBody};

    #[tokio::test]
    async fn a_declared_length_over_the_limit_is_refused_unread() {
        let body = Full::new(Bytes::from_static(b"12345"));
        assert!(declared_over(&body, 4));
        assert!(!declared_over(&body, 5));
        assert_eq!(read_body(body, 4).await, Err(Rejection::BodyTooLarge));
        let ok = read_body(Full::new(Bytes::from_static(b"12345")), 5).await;
        assert_eq!(ok, Ok(Bytes::from_static(b"12345")));
    }

    #[tokio::test]
    async fn a_chunked_body_is_cut_while_read() {
        let frames = futures_util::stream::iter(
            [b"abc".as_slice(), b"def".as_slice()]
                .map(|c| Ok::<_, std::io::Error>(http_body::Frame::data(Bytes::from(c)))),
        );
        let body = StreamBody::new(frames);
        assert!(!declared_over(&body, 4), "a chunked body announces nothing");
        assert_eq!(read_body(body, 4).await, Err(Rejection::BodyTooLarge));
    }
}
