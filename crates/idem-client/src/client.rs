//! The client: a base URL, a retry policy, a body limit, a connection pool.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Uri, uri::Scheme};
use http_body_util::Full;
use hyper_util::client::legacy::connect::{Connect, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::{ClientError, RequestBuilder, RetryPolicy};

/// The default limit of a response body: 4 MiB.
pub const DEFAULT_MAX_RESPONSE_BODY: usize = 4 * 1024 * 1024;
/// The largest limit of a response body that may be configured: 1 GiB.
pub const MAX_RESPONSE_BODY_LIMIT: usize = 1024 * 1024 * 1024;

/// A client for one service that speaks the `Idempotency-Key` contract.
///
/// Cheap to clone (the connection pool and the configuration are shared).
/// `C` is the connector: plain HTTP by default; pass a TLS connector (for
/// example `hyper-rustls`'s) to [`ClientBuilder::build_with_connector`] for
/// `https` URLs.
pub struct Client<C = HttpConnector> {
    pub(crate) inner: Arc<Inner<C>>,
}

pub(crate) struct Inner<C> {
    pub(crate) http: hyper_util::client::legacy::Client<C, Full<Bytes>>,
    /// Scheme, authority and path prefix, without a trailing `/`.
    pub(crate) base: String,
    pub(crate) policy: RetryPolicy,
    pub(crate) max_response_body: usize,
}

impl<C> Clone for Client<C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<C> fmt::Debug for Client<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.inner.base)
            .field("policy", &self.inner.policy)
            .field("max_response_body", &self.inner.max_response_body)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A plain-HTTP client for `base_url` with the default [`RetryPolicy`]
    /// and a 4 MiB response body limit.
    ///
    /// Refuses (with [`ClientError::InvalidUrl`]) a URL that is not `http`,
    /// has no host, carries credentials (`user:pass@`), a query or a
    /// fragment; `https` needs a TLS connector
    /// ([`ClientBuilder::build_with_connector`]).
    pub fn new(base_url: &str) -> Result<Self, ClientError> {
        Self::builder().build(base_url)
    }

    /// A builder to set the retry policy and the response body limit.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }
}

impl<C> Client<C>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    /// A request to `path` (which starts with `/` and may carry a query),
    /// appended to the base URL's path.
    ///
    /// The returned builder is one **intent**: it draws its idempotency key
    /// now (a v4 UUID) unless [`RequestBuilder::key`] gives one, and every
    /// attempt of every [`RequestBuilder::send`] on it carries that key.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder<C> {
        RequestBuilder::new(self.clone(), method, path)
    }

    /// `request(Method::POST, path)`.
    pub fn post(&self, path: &str) -> RequestBuilder<C> {
        self.request(Method::POST, path)
    }

    /// `request(Method::PUT, path)`.
    pub fn put(&self, path: &str) -> RequestBuilder<C> {
        self.request(Method::PUT, path)
    }

    /// `request(Method::PATCH, path)`.
    pub fn patch(&self, path: &str) -> RequestBuilder<C> {
        self.request(Method::PATCH, path)
    }

    /// `request(Method::DELETE, path)`.
    pub fn delete(&self, path: &str) -> RequestBuilder<C> {
        self.request(Method::DELETE, path)
    }

    /// The retry policy of every send.
    pub fn policy(&self) -> &RetryPolicy {
        &self.inner.policy
    }

    /// The base URL, without a trailing `/`.
    pub fn base_url(&self) -> &str {
        &self.inner.base
    }
}

/// Configures a [`Client`].
#[derive(Clone, Debug)]
pub struct ClientBuilder {
    policy: RetryPolicy,
    max_response_body: usize,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        Self {
            policy: RetryPolicy::default(),
            max_response_body: DEFAULT_MAX_RESPONSE_BODY,
        }
    }
}

impl ClientBuilder {
    /// The retry policy (checked by [`build`](Self::build)).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The largest response body read, in bytes (default 4 MiB, at most
    /// 1 GiB); a larger one ends the send with
    /// [`ClientError::ResponseTooLarge`].
    pub fn max_response_body(mut self, bytes: usize) -> Self {
        self.max_response_body = bytes;
        self
    }

    /// A plain-HTTP client for `base_url` (see [`Client::new`] for what is
    /// refused).
    pub fn build(self, base_url: &str) -> Result<Client, ClientError> {
        let base = parse_base(base_url)?;
        if base.https {
            return Err(ClientError::InvalidUrl {
                url: base_url.into(),
                reason: "https needs a TLS connector: use ClientBuilder::build_with_connector",
            });
        }
        self.build_with_connector(base_url, HttpConnector::new())
    }

    /// A client for `base_url` (`http` or `https`) that opens connections
    /// with `connector`, for example a TLS connector.
    pub fn build_with_connector<C>(
        self,
        base_url: &str,
        connector: C,
    ) -> Result<Client<C>, ClientError>
    where
        C: Connect + Clone + Send + Sync + 'static,
    {
        self.policy.validate()?;
        if self.max_response_body > MAX_RESPONSE_BODY_LIMIT {
            return Err(ClientError::InvalidPolicy {
                field: "max_response_body",
                reason: "must be at most 1 GiB",
            });
        }
        let base = parse_base(base_url)?;
        // The timer lets the pool drop connections idle for longer than its
        // idle timeout (90 s) instead of keeping them until the server
        // closes them.
        let http = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .build(connector);
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                base: base.base,
                policy: self.policy,
                max_response_body: self.max_response_body,
            }),
        })
    }
}

struct Base {
    base: String,
    https: bool,
}

fn parse_base(url: &str) -> Result<Base, ClientError> {
    let invalid = |reason| ClientError::InvalidUrl {
        // Never echo a password back into logs.
        url: if url.contains('@') {
            "[redacted]".into()
        } else {
            url.into()
        },
        reason,
    };
    if url.contains('#') {
        return Err(invalid("a fragment is not allowed"));
    }
    let uri: Uri = url
        .parse()
        .map_err(|_| invalid("not an absolute http(s) URL"))?;
    let https = match uri.scheme() {
        Some(s) if *s == Scheme::HTTP => false,
        Some(s) if *s == Scheme::HTTPS => true,
        Some(_) => return Err(invalid("the scheme must be http or https")),
        None => return Err(invalid("not an absolute http(s) URL")),
    };
    let Some(authority) = uri.authority() else {
        return Err(invalid("no host"));
    };
    if authority.as_str().contains('@') {
        return Err(invalid(
            "credentials in the URL are refused (they end up in logs): send an Authorization header",
        ));
    }
    if authority.host().is_empty() {
        return Err(invalid("no host"));
    }
    if uri.query().is_some() {
        return Err(invalid("a query is not allowed in the base URL"));
    }
    let scheme = if https { "https" } else { "http" };
    let path = uri.path().trim_end_matches('/');
    Ok(Base {
        base: format!("{scheme}://{authority}{path}"),
        https,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        let ok = |u: &str| parse_base(u).map(|b| b.base).unwrap();
        assert_eq!(ok("http://127.0.0.1:8080"), "http://127.0.0.1:8080");
        assert_eq!(ok("http://h/"), "http://h");
        assert_eq!(ok("HTTP://h/api/v1/"), "http://h/api/v1");
        assert!(parse_base("https://h").unwrap().https);
        for bad in [
            "ftp://h/",
            "h:80",
            "/just/a/path",
            "http://user:pw@h/",
            "http://token@h/",
            "http://h/?a=1",
            "http://h/#top",
            "",
            "not a url",
        ] {
            assert!(
                matches!(parse_base(bad), Err(ClientError::InvalidUrl { .. })),
                "{bad:?} accepted"
            );
        }
        let Err(ClientError::InvalidUrl { url, .. }) = parse_base("http://u:secret@h/") else {
            panic!("credentials accepted")
        };
        assert!(!url.contains("secret"));
    }
}
