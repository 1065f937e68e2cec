//! The Rust peer of `idem bench`: what a Rust team would put in front of the
//! same payment insert instead of Idem — `axum-idempotent` (direct-key mode,
//! `Idempotency-Key`) over `ruts` sessions in Redis (`RedisStore`, which
//! needs Redis 7.4 or newer for `HEXPIRE`), around the insert of Idem's demo
//! route (`INSERT INTO demo_payments …`, the same statement) in a sqlx
//! PostgreSQL transaction. Its rows carry the tenant `rust-peer`.
//!
//! `axum-idempotent` caches a response in the caller's session, and only in
//! a session that exists: `POST /v1/session` opens one (`Set-Cookie:
//! session=…`) and a client sends that cookie with its payments. A payment
//! without a session runs without idempotency.
//!
//! ```text
//! idem-bench-rust-peer --listen 127.0.0.1:PORT --database-url postgres://… \
//!     --redis-url redis://127.0.0.1:PORT
//! ```
//!
//! It expects `demo_payments` to exist (`idem bench` migrates the demo's
//! schema before it starts the peer). Not a member of the repository's
//! workspace: CI does not build it; `cargo xtask bench` does.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::header::{CONTENT_TYPE, LOCATION};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum_idempotent::{IdempotentLayer, IdempotentOptions};
use fred::prelude::{ClientLike, Config, Pool};
use ruts::store::Ttl;
use ruts::store::redis::RedisStore;
use ruts::{CookieOptions, Session, SessionLayer};
use serde_json::{Value, json};
use sqlx::postgres::{PgPool, PgPoolOptions};
use tower_cookies::CookieManagerLayer;

/// Idem's demo statement (`demo/sql/statements.rs`), verbatim.
const INSERT_PAYMENT: &str = "INSERT INTO demo_payments \
     (tenant_id, id, amount, currency, customer, reference, created_at_ms) \
     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (tenant_id, reference) DO NOTHING RETURNING id";

/// The tenant of the peer's rows (the bench counts them).
const TENANT: &str = "rust-peer";

/// How long a session and a cached answer live (a day: longer than a run).
const TTL_SECS: u64 = 24 * 3600;

/// The header a replay carries: Idem's name, so the bench's wrk script
/// counts both servers' replays the same way (the crate's default is
/// `idempotency-replayed`).
const REPLAYED: &str = "idempotent-replayed";

/// PostgreSQL connections: `idem serve`'s default pool.
const PG_CONNECTIONS: u32 = 16;

/// Redis connections in fred's pool.
const REDIS_CONNECTIONS: usize = 4;

struct Args {
    listen: SocketAddr,
    database_url: String,
    redis_url: String,
}

const USAGE: &str = "usage: idem-bench-rust-peer --listen 127.0.0.1:PORT --database-url postgres://… \
                     --redis-url redis://127.0.0.1:PORT";

fn parse_args(mut args: impl Iterator<Item = String>) -> anyhow::Result<Args> {
    let (mut listen, mut database_url, mut redis_url) = (None, None, None);
    while let Some(flag) = args.next() {
        let slot = match flag.as_str() {
            "--listen" => &mut listen,
            "--database-url" => &mut database_url,
            "--redis-url" => &mut redis_url,
            "-h" | "--help" => bail!("{USAGE}"),
            other => bail!("unknown argument {other:?}; {USAGE}"),
        };
        *slot = Some(
            args.next()
                .with_context(|| format!("{flag} needs a value"))?,
        );
    }
    let listen = listen.context(USAGE)?;
    let listen: SocketAddr = listen
        .parse()
        .with_context(|| format!("--listen {listen:?} is not an address such as 127.0.0.1:8080"))?;
    anyhow::ensure!(
        listen.ip().is_loopback(),
        "--listen {listen}: the peer binds a loopback address only"
    );
    Ok(Args {
        listen,
        database_url: database_url.context(USAGE)?,
        redis_url: redis_url.context(USAGE)?,
    })
}

#[derive(Clone)]
struct App {
    pool: PgPool,
}

fn main() -> std::process::ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("idem-bench-rust-peer: {e:#}");
            return std::process::ExitCode::from(2);
        }
    };
    let run = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting tokio")
        .and_then(|rt| rt.block_on(serve(args)));
    match run {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("idem-bench-rust-peer: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let pool = PgPoolOptions::new()
        .max_connections(PG_CONNECTIONS)
        .connect(&args.database_url)
        .await
        .context("connecting to PostgreSQL (--database-url)")?;
    let config = Config::from_url(&args.redis_url)
        .with_context(|| format!("--redis-url {:?} is not a Redis URL", args.redis_url))?;
    let redis = Pool::new(config, None, None, None, REDIS_CONNECTIONS)
        .context("building the Redis pool")?;
    redis
        .init()
        .await
        .context("connecting to Redis (--redis-url)")?;
    let version = redis_version(&redis).await?;
    let store = Arc::new(
        RedisStore::new(Arc::new(redis))
            .await
            .context("loading ruts' scripts into Redis")?,
    );
    let options = IdempotentOptions::default()
        .use_idempotency_key_header(Some("Idempotency-Key"), true)
        .replay_header_name(REPLAYED)
        .expire_after(TTL_SECS as i64);
    let cookies = CookieOptions::build()
        .name("session")
        .path("/")
        .max_age(TTL_SECS);
    let payments = Router::new()
        .route("/v1/payments", post(pay))
        .layer(IdempotentLayer::<RedisStore<Pool>>::new(options));
    let app = Router::new()
        .route("/v1/session", post(open_session))
        .merge(payments)
        .layer(SessionLayer::new(store).with_cookie_options(cookies))
        .layer(CookieManagerLayer::new())
        .with_state(App { pool });
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    println!(
        "listening on {} (axum-idempotent 0.6.0, ruts 0.13.0 RedisStore, redis-server {version})",
        args.listen
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .context("serving")
}

/// The server's version; ruts' `RedisStore` needs 7.4 or newer.
async fn redis_version(redis: &Pool) -> anyhow::Result<String> {
    let info: String = redis
        .next()
        .info(Some(fred::types::InfoKind::Server))
        .await
        .context("INFO server")?;
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map(|v| v.trim().to_owned())
        .context("INFO server has no redis_version")?;
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    anyhow::ensure!(
        (major, minor) >= (7, 4),
        "redis-server {version}: ruts' RedisStore needs 7.4 or newer (HEXPIRE)"
    );
    Ok(version)
}

/// Opens a session: the cookie a client sends with its payments.
async fn open_session(session: Session<RedisStore<Pool>>) -> Response {
    let Ok(ttl) = Ttl::new(TTL_SECS as i64) else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "bad session TTL").into_response();
    };
    match session.set("client", &"bench", ttl, None).await {
        Ok(()) => StatusCode::CREATED.into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("session store: {e}"),
        )
            .into_response(),
    }
}

fn problem(status: StatusCode, detail: &str) -> Response {
    (
        status,
        [(CONTENT_TYPE, "application/problem+json")],
        json!({ "status": status.as_u16(), "detail": detail }).to_string(),
    )
        .into_response()
}

/// What the demo checks: a positive integer amount, a 3-letter currency,
/// a customer.
fn parse_payment(body: &[u8]) -> Result<(i64, String, String), Response> {
    let bad = |d: &str| problem(StatusCode::BAD_REQUEST, d);
    let v: Value = serde_json::from_slice(body).map_err(|_| bad("body is not valid JSON"))?;
    let amount = v
        .get("amount")
        .and_then(Value::as_i64)
        .filter(|a| *a > 0)
        .ok_or_else(|| bad("amount must be a positive integer"))?;
    let currency = v
        .get("currency")
        .and_then(Value::as_str)
        .filter(|c| c.len() == 3 && c.bytes().all(|b| b.is_ascii_uppercase()))
        .ok_or_else(|| bad("currency must be a 3-letter upper-case code"))?;
    let customer = v
        .get("customer")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty() && c.len() <= 200)
        .ok_or_else(|| bad("customer must be a non-empty string"))?;
    Ok((amount, currency.to_owned(), customer.to_owned()))
}

/// `POST /v1/payments`: the demo's insert in one transaction, 201 with the
/// payment.
async fn pay(State(app): State<App>, body: Bytes) -> Response {
    let (amount, currency, customer) = match parse_payment(&body) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let id = format!("pay_{}", uuid::Uuid::new_v4().simple());
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let run = async {
        let mut tx = app.pool.begin().await?;
        let inserted: Option<String> = sqlx::query_scalar(INSERT_PAYMENT)
            .bind(TENANT)
            .bind(&id)
            .bind(amount)
            .bind(&currency)
            .bind(&customer)
            .bind(None::<String>)
            .bind(now_ms)
            .fetch_optional(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok::<_, sqlx::Error>(inserted)
    };
    match run.await {
        Ok(Some(_)) => {}
        Ok(None) => return problem(StatusCode::CONFLICT, "the payment was not inserted"),
        Err(e) => return problem(StatusCode::SERVICE_UNAVAILABLE, &format!("database: {e}")),
    }
    let body = json!({
        "id": id,
        "amount": amount,
        "currency": currency,
        "customer": customer,
        "reference": null,
        "amount_refunded": 0,
        "created_at_ms": now_ms,
    })
    .to_string();
    let mut res = (
        StatusCode::CREATED,
        [(CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response();
    if let Ok(location) = HeaderValue::try_from(format!("/v1/payments/{id}")) {
        res.headers_mut().insert(LOCATION, location);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> anyhow::Result<Args> {
        parse_args(s.split_whitespace().map(str::to_owned))
    }

    #[test]
    fn arguments_parse_and_refuse() {
        let a =
            args("--listen 127.0.0.1:9 --database-url postgres://x --redis-url redis://y").unwrap();
        assert_eq!(a.listen.port(), 9);
        assert!(args("--listen 0.0.0.0:9 --database-url a --redis-url b").is_err());
        assert!(args("--listen nope --database-url a --redis-url b").is_err());
        assert!(args("--listen 127.0.0.1:9 --database-url a").is_err());
        assert!(args("--listen").is_err());
        assert!(args("--bogus 1").is_err());
    }
}
