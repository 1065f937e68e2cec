//! `idem upstream`: a sample payments API that is deliberately **not**
//! idempotent, for tours, tests and benchmarks (what `idem drill` should
//! fail, and what a gateway should fix). Kept in memory, bounded.
//!
//! - `POST /v1/payments` with a JSON object: a new payment `{id, …fields}`,
//!   `201` with it. In [`Mode::Naive`] the `Idempotency-Key` header is
//!   ignored: every POST is a new effect. In [`Mode::CheckThenAct`] the key
//!   is honoured the naive way — look it up, and if absent wait
//!   `delay`, create, and store the answer under the key — so a later retry
//!   is replayed (`Idempotent-Replayed: true`) but concurrent requests with
//!   one key all create a payment. Neither mode compares the payload. In
//!   naive mode `delay` holds the answer after the payment was created. A
//!   payment is created even when the client hangs up.
//!   The body may be a form (`application/x-www-form-urlencoded`, as
//!   Stripe's clients send): its fields become string fields.
//! - With `lose_first_answer` ([`Upstream::losing_first_answers`]): the
//!   first POST with each `Idempotency-Key` creates its payment and then
//!   the connection is closed without an answer — the seed's first failure
//!   case; a POST without a key is answered.
//! - `GET /v1/payments?customer=X` or `?reference=R` → `{"data":[…]}`, the
//!   payments whose field `customer` (`reference`) is that string — the
//!   lookup a gateway's `verify` route asks; `GET /v1/payments/{id}`;
//!   `PATCH /v1/payments/{id}` merges a JSON object into the payment (not
//!   `id`).
//! - `GET /_upstream/stats` → `{"requests":N,"payments":M}`: the requests
//!   that reached the routes (this one excluded), for tests that count what
//!   a client sent.
//!
//! Bounds: request bodies ≤ 1 MiB (413); at most [`MAX_PAYMENTS`] payments
//! and [`MAX_STORED_BYTES`] of them, beyond which `POST` answers `507`
//! `upstream-full` (nothing is dropped: a test never loses an effect it
//! counts).

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

mod memory;
mod routes;

pub use memory::{MAX_BODY_BYTES, MAX_PAYMENTS, MAX_STORED_BYTES, Mode, Upstream};
use routes::{count, create, list, patch, show, stats};

/// The upstream's routes inside `frame` (`idem upstream` gives the
/// server's: `/healthz` and problem+json errors), every request counted.
pub fn app(up: Upstream, frame: impl FnOnce(Router) -> Router) -> Router {
    let routes = Router::new()
        .route("/v1/payments", post(create).get(list))
        .route("/v1/payments/{id}", get(show).patch(patch))
        .route("/_upstream/stats", get(stats))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(idem_http::DeclaredLimitLayer::new(MAX_BODY_BYTES))
        .with_state(up.clone());
    frame(routes).layer(axum::middleware::from_fn_with_state(up, count))
}

#[cfg(test)]
mod tests;
