//! The state the payment routes share ([`crate::handlers`], under the
//! idempotency layer, and [`crate::baseline`], without it) and the one
//! thing both do: [`pay`].

use std::time::Duration;

use axum::http::header::{CONTENT_TYPE, LOCATION};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use idem_admin::respond::{db_error, internal};
use idem_core::{ResourceRef, Tenant};
use idem_http::TenantSource;
use idem_outbox::Outbox;

use crate::events::{Event, event_message};
use crate::input::{new_id, now_ms, parse_payment, valid_id};
use crate::output::PaymentOut;
use crate::sql::{DemoSql, PaymentKey, PaymentRow};

/// Customers whose id starts with this get `402 card-declined`.
pub const DECLINED_CUSTOMERS: &str = "cus_decline";

pub(crate) struct App<S> {
    pub(crate) store: S,
    // Shared: axum clones the state for every request.
    pub(crate) tenant: std::sync::Arc<TenantSource>,
    /// Where events go, when they are on.
    pub(crate) outbox: Option<Outbox<S>>,
    pub(crate) read_timeout: Duration,
    /// The routes without the layer (the baseline) bound their body and
    /// their time as the layer does.
    pub(crate) max_body_bytes: usize,
    pub(crate) handler_timeout: Duration,
}

// Not derived: a derive would ask `S: Clone` of the state twice over.
impl<S: Clone> Clone for App<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            tenant: self.tenant.clone(),
            outbox: self.outbox.clone(),
            read_timeout: self.read_timeout,
            max_body_bytes: self.max_body_bytes,
            handler_timeout: self.handler_timeout,
        }
    }
}

pub(crate) fn no_payment() -> Response {
    idem_admin::respond::not_found("No such payment")
}

/// Writes the event to the outbox in the request's transaction, when
/// events are on (else it is not even made).
pub(crate) async fn emit<S: DemoSql>(
    app: &App<S>,
    tx: &mut S::Tx,
    event: impl FnOnce() -> Event,
) -> Result<(), Response> {
    let Some(outbox) = &app.outbox else {
        return Ok(());
    };
    let message = event_message(&event()).map_err(internal)?;
    outbox
        .enqueue(tx, &message)
        .await
        .map(drop)
        .map_err(db_error)
}

/// A read route's tenant, once every id in its path could be one the demo
/// issued (anything else cannot exist: 404 without asking the database).
pub(crate) fn read_request<S>(
    app: &App<S>,
    headers: &HeaderMap,
    ids: &[&str],
) -> Result<Tenant, Response> {
    let mut parts = axum::http::Request::new(()).into_parts().0;
    parts.headers = headers.clone();
    let tenant = app.tenant.resolve(&parts).map_err(|r| r.into_response())?;
    if !ids.iter().all(|id| valid_id(id)) {
        return Err(no_payment());
    }
    Ok(tenant)
}

fn payment_answer(status: StatusCode, row: &PaymentRow) -> Response {
    let body = match serde_json::to_vec(&PaymentOut::of(row)) {
        Ok(body) => body,
        Err(e) => return internal(e),
    };
    let mut res = (status, [(CONTENT_TYPE, "application/json")], body).into_response();
    if let Ok(location) = HeaderValue::try_from(format!("/v1/payments/{}", row.0)) {
        res.headers_mut().insert(LOCATION, location);
    }
    res.extensions_mut().insert(ResourceRef {
        kind: "payment".into(),
        id: row.0.clone(),
    });
    res
}

/// What `POST /v1/payments` does in the request's transaction `tx`: the
/// validation, the insert, the event, the answer. The baseline route
/// ([`crate::baseline`]) does the same in a plain transaction.
pub(crate) async fn pay<S: DemoSql>(
    app: &App<S>,
    tx: &mut S::Tx,
    tenant: &Tenant,
    body: &Bytes,
) -> Response {
    let p = match parse_payment(body) {
        Ok(p) => p,
        Err(r) => return r,
    };
    // Stripe-style test cards: these customers' cards are declined. A 402
    // is a business answer: stored with the key and replayed, nothing paid.
    if p.customer.starts_with(DECLINED_CUSTOMERS) {
        return idem_http::problem(
            StatusCode::PAYMENT_REQUIRED,
            "card-declined",
            "The card was declined",
            Some(
                "customers whose id starts with cus_decline are declined (a test rule of the demo)",
            ),
            None,
        );
    }
    let row: PaymentRow = (
        new_id("pay"),
        p.amount,
        p.currency,
        p.customer,
        p.reference,
        0,
        now_ms(),
    );
    match S::insert_payment(tx, tenant.as_str(), &row).await {
        Ok(true) => {
            let event = || Event::Created {
                tenant: tenant.to_string(),
                payment_id: row.0.clone(),
                amount: row.1,
            };
            if let Err(r) = emit(app, tx, event).await {
                return r;
            }
            payment_answer(StatusCode::CREATED, &row)
        }
        // The business natural key: this reference was used before.
        Ok(false) => {
            let Some(reference) = row.4.as_deref() else {
                return internal("a payment without a reference conflicted");
            };
            match S::payment_in(tx, tenant.as_str(), PaymentKey::Reference, reference).await {
                Ok(Some(old)) if old.1 == row.1 && old.2 == row.2 && old.3 == row.3 => {
                    payment_answer(StatusCode::OK, &old)
                }
                Ok(Some(old)) => idem_http::problem(
                    StatusCode::CONFLICT,
                    "reference-conflict",
                    "This reference belongs to a different payment",
                    Some(&format!("payment {}", old.0)),
                    None,
                ),
                Ok(None) => internal("the conflicting payment is gone"),
                Err(e) => db_error(e),
            }
        }
        Err(e) => db_error(e),
    }
}
