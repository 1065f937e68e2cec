//! `POST /v1/payments-baseline`, mounted only by `idem serve
//! --bench-routes`: what `POST /v1/payments` does — the same validation,
//! the same insert, the same answer — in a plain transaction, **without**
//! the idempotency layer. It is what the benchmark measures Idem's cost
//! against, through the same server; a retry of it pays twice, so a real
//! deployment never mounts it.
//!
//! It keeps the bounds of the keyed route: the tenant from the same
//! header, the body limit (413), the handler timeout (503, rolled back). It
//! commits a 2xx answer and rolls back anything else.

use axum::Router;
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::post;
use idem_http::Rejection;

use idem_admin::respond::db_error;

use crate::app::{App, pay};
use crate::sql::DemoSql;

/// The route's path.
pub const PATH: &str = "/v1/payments-baseline";

/// `router` with the route if `on` (`idem serve --bench-routes`) — only
/// on request: it pays without a key.
pub(crate) fn mount<S: DemoSql>(router: Router<App<S>>, on: bool) -> Router<App<S>> {
    match on {
        true => router.route(PATH, post(create::<S>)),
        false => router,
    }
}

async fn create<S: DemoSql>(State(app): State<App<S>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let tenant = match app.tenant.resolve(&parts) {
        Ok(t) => t,
        Err(r) => return r.into_response(),
    };
    let body = match idem_http::read_body(body, app.max_body_bytes).await {
        Ok(b) => b,
        Err(rejection) => return rejection.into_response(),
    };
    let run = async {
        let mut tx = match app.store.begin().await {
            Ok(tx) => tx,
            Err(e) => return db_error(e),
        };
        let res = pay::<S>(&app, &mut tx, &tenant, &body).await;
        if !res.status().is_success() {
            // Nothing of a refused payment commits; a failed rollback
            // commits nothing either.
            let _ = app.store.rollback(tx).await;
            return res;
        }
        match app.store.commit(tx).await {
            Ok(()) => res,
            Err(e) => db_error(e),
        }
    };
    // Dropping the transaction at the deadline rolls it back.
    match tokio::time::timeout(app.handler_timeout, run).await {
        Ok(res) => res,
        Err(_) => Rejection::HandlerTimeout(app.handler_timeout).into_response(),
    }
}
