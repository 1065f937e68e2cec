//! The benchmarks' own HTTP client: a bare keep-alive hyper client, one
//! request per call, no retry, no deadline, no generated key.
//!
//! Not `idem-client`: a load client must send exactly the requests it is
//! told to (a retry would hide a failure the case must report, and count
//! two requests as one operation), and add nothing to the cost it measures
//! (no key generation, no backoff bookkeeping). `idem-client` is what a
//! caller of an idempotent API should use; here the figures are the point.

/// A pooled plain-HTTP client with a fixed request body type.
pub type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    http_body_util::Full<bytes::Bytes>,
>;

/// A client that keeps connections alive between requests.
pub fn client() -> Client {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}

/// One `POST` with a small JSON body; anything but `201` is an error.
pub async fn post(
    client: Client,
    addr: std::net::SocketAddr,
    path: &'static str,
    key: Option<String>,
) -> anyhow::Result<()> {
    use http_body_util::BodyExt;
    let mut req = axum::http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/json");
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    let req = req.body(http_body_util::Full::new(bytes::Bytes::from_static(
        br#"{"amount":100,"currency":"EUR"}"#,
    )))?;
    let res = client.request(req).await?;
    let status = res.status();
    res.into_body().collect().await?;
    anyhow::ensure!(status == 201, "{path} answered {status}");
    Ok(())
}

/// Sends `req` on a fresh client and reads its body to the end: the status
/// and whether the answer says it is a replay (`Idempotent-Replayed: true`).
pub async fn status_and_replay(
    req: axum::http::Request<http_body_util::Full<bytes::Bytes>>,
) -> anyhow::Result<(u16, bool)> {
    use http_body_util::BodyExt;
    let res = client().request(req).await?;
    let status = res.status().as_u16();
    let replayed = res
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    res.into_body().collect().await?;
    Ok((status, replayed))
}
