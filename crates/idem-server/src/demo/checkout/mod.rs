//! The checkout saga, written against `idem-steps` the way a user would:
//! reserve stock (a conditional update, in the transaction that claims the
//! key and creates the run) → charge at the payment provider (a call with a
//! derived `Idempotency-Key`) → send the confirmation through a relay that
//! does not deduplicate (verify-then-send, or at most once) → confirm the
//! order. A declined card or a provider that stays away past the deadline
//! releases the stock and refunds what was charged, each compensation a
//! recorded step with its own key.

pub mod clients;
pub mod routes;

use std::time::Duration;

use idem_core::steps::{Failure, RunId, RunStore};
use idem_core::{BoxError, BoxFuture, Completion, Operation, StoredResponse};
use idem_sql::patterns::{PatternExec, StateMachine, Transition, Value};
use idem_steps::{LookupCtx, Run, SendCtx, Stop, UndoCtx, Workflow};
use serde::{Deserialize, Serialize};
use serde_json::{Value as Json, json};

use self::clients::{Charge, Mail, Provider};
use super::{MAX_AMOUNT, now_ms, text_field};

/// The operation orders' keys are scoped to.
pub const OPERATION: &str = "orders.create";

/// The largest quantity of one order.
pub const MAX_QUANTITY: i64 = 1_000_000;

/// How the confirmation goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MailDelivery {
    /// Before sending again after an unknown outcome, ask the relay whether
    /// it has the message.
    Verify,
    /// Never send again after an unknown outcome: wait for an operator.
    AtMostOnce,
}

/// A validated order request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewOrder {
    pub customer: String,
    pub sku: String,
    pub quantity: i64,
    pub amount: i64,
    pub currency: String,
    pub email: String,
}

/// A SKU: 1 to 64 characters of `[A-Za-z0-9._-]`.
pub fn valid_sku(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn valid_email(s: &str) -> bool {
    (3..=254).contains(&s.len())
        && s.split_once('@')
            .is_some_and(|(local, domain)| !local.is_empty() && domain.contains('.'))
        && !s.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// Reads an order request; the error is the problem's detail.
pub fn parse_order(body: &[u8]) -> Result<NewOrder, String> {
    let v: Json =
        serde_json::from_slice(body).map_err(|e| format!("body is not valid JSON: {e}"))?;
    let obj = v.as_object().ok_or("body must be a JSON object")?;
    let int = |name: &str, max: i64| {
        obj.get(name)
            .and_then(Json::as_i64)
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| format!("{name} must be an integer between 1 and {max}"))
    };
    let customer = text_field("customer", obj.get("customer")).map_err(|_| {
        "customer must be a string of 1 to 255 characters without control characters".to_owned()
    })?;
    let sku = obj
        .get("sku")
        .and_then(Json::as_str)
        .filter(|s| valid_sku(s))
        .ok_or("sku must be 1 to 64 characters of A-Z, a-z, 0-9, '.', '_' or '-'")?;
    let currency = obj
        .get("currency")
        .and_then(Json::as_str)
        .filter(|c| c.len() == 3 && c.bytes().all(|b| b.is_ascii_uppercase()))
        .ok_or("currency must be a 3-letter upper-case code such as EUR")?;
    let email = obj
        .get("email")
        .and_then(Json::as_str)
        .filter(|e| valid_email(e))
        .ok_or("email must be an address such as ada@example.com")?;
    Ok(NewOrder {
        customer,
        sku: sku.to_owned(),
        quantity: int("quantity", MAX_QUANTITY)?,
        amount: int("amount", MAX_AMOUNT)?,
        currency: currency.to_owned(),
        email: email.to_owned(),
    })
}

/// The id of the order a run creates: `ord_` and the run's suffix, so the
/// order names its run and every retry names the same order.
pub fn order_id(run: &RunId) -> String {
    format!("ord_{}", run.suffix())
}

/// The run of an order id, if it can be one.
pub fn run_of(order_id: &str) -> Option<RunId> {
    RunId::from_suffix(order_id.strip_prefix("ord_")?).ok()
}

/// What the reserve phase found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Reserved {
    /// Stock reserved and the order created.
    Yes,
    /// Not enough stock: nothing written.
    OutOfStock,
    /// The order exists already (its key expired and the intent came again):
    /// nothing written.
    Exists,
    /// An order with other fields exists under this key (its key expired and
    /// was reused for another order): nothing written.
    Other,
}

/// The checkout workflow.
#[derive(Debug, Clone)]
pub struct Checkout {
    provider: Provider,
    mail: Option<(Mail, MailDelivery)>,
    orders: StateMachine,
}

impl Checkout {
    /// Charges at `provider`, confirms through `mail` (or sends nothing).
    pub fn new(provider: Provider, mail: Option<(Mail, MailDelivery)>) -> anyhow::Result<Self> {
        let orders = StateMachine::new("demo_orders", &["tenant_id", "id"], "status")?
            .allow("pending", &["confirmed", "failed"]);
        Ok(Self {
            provider,
            mail,
            orders,
        })
    }

    /// The operation name.
    pub fn operation() -> anyhow::Result<Operation> {
        Ok(Operation::new(OPERATION)?)
    }
}

fn json_answer(status: u16, body: &Json, location: Option<&str>) -> StoredResponse {
    let mut headers = vec![("content-type".to_owned(), "application/json".to_owned())];
    if let Some(l) = location {
        headers.push(("location".into(), l.into()));
    }
    StoredResponse {
        status,
        headers,
        body: body.to_string().into_bytes(),
    }
}

/// A problem document as a stored answer, with the order it concerns.
fn problem_answer(
    status: u16,
    slug: &str,
    title: &str,
    detail: &str,
    order: Option<&str>,
) -> StoredResponse {
    let mut body = json!({
        "type": format!("{}{slug}", idem_http::TYPE_BASE),
        "title": title,
        "status": status,
        "detail": detail,
    });
    if let Some(id) = order {
        body["order"] = id.into();
    }
    StoredResponse {
        status,
        headers: vec![("content-type".into(), "application/problem+json".into())],
        body: body.to_string().into_bytes(),
    }
}

/// A phase's failure as the error its closure returns.
fn fault(what: String) -> BoxError {
    what.into()
}

impl<S> Workflow<S> for Checkout
where
    S: RunStore<Tx: PatternExec>,
{
    fn run<'r>(&'r self, run: &'r mut Run<S>) -> BoxFuture<'r, Result<Completion, Stop>> {
        Box::pin(async move {
            let order = match parse_order(run.input()) {
                Ok(o) => o,
                Err(detail) => {
                    return Ok(Completion::failed(problem_answer(
                        400,
                        "invalid-request",
                        "The request is invalid",
                        &detail,
                        None,
                    )));
                }
            };
            let tenant = run.scope().tenant.as_str().to_owned();
            let id = order_id(run.id());
            let created_at = run.record().created_at_ms;

            // 1. Reserve and create the order, with the key's claim.
            let (t, o, i) = (tenant.clone(), order.clone(), id.clone());
            let (rt, ro) = (tenant.clone(), order.clone());
            let reserved = run
                .phase("reserve", move |tx| {
                    Box::pin(async move { reserve(tx, &t, &i, &o, created_at).await })
                })
                .undo("release", move |tx, reserved: Reserved| {
                    let (t, o) = (rt.clone(), ro.clone());
                    Box::pin(async move {
                        if reserved == Reserved::Yes {
                            release(tx, &t, &o).await?;
                        }
                        Ok(())
                    })
                })
                .await?;
            match reserved {
                Reserved::Yes => {}
                Reserved::OutOfStock => {
                    return Ok(Completion::failed(problem_answer(
                        409,
                        "out-of-stock",
                        "Not enough stock",
                        &format!(
                            "fewer than {} of {} are available",
                            order.quantity, order.sku
                        ),
                        None,
                    )));
                }
                Reserved::Exists => {
                    let mut answer = problem_answer(
                        409,
                        "order-exists",
                        "This order exists already",
                        "the order of this intent was created earlier; its key expired since",
                        Some(&id),
                    );
                    answer
                        .headers
                        .push(("location".into(), format!("/v1/orders/{id}")));
                    return Ok(Completion::failed(answer));
                }
                Reserved::Other => {
                    return Ok(Completion::failed(problem_answer(
                        422,
                        "idempotency-key-reused",
                        "Idempotency-Key was used with a different request",
                        "an order with other fields was created with this key earlier; \
                         its key expired since",
                        None,
                    )));
                }
            }

            // 2. Charge, with the key derived from the run and the step. Its
            // refund works from what the charge did: its answer, or — when
            // the answer was lost — the payment the provider holds for the
            // order (a read-only lookup by reference, never a charge).
            let (provider, lookups, refunds) = (
                self.provider.clone(),
                self.provider.clone(),
                self.provider.clone(),
            );
            let (o, i, li, amount) = (order.clone(), id.clone(), id.clone(), order.amount);
            let charge: Charge = run
                .call("charge", move |ctx| {
                    let (provider, o, i) = (provider.clone(), o.clone(), i.clone());
                    async move {
                        provider
                            .charge(ctx.key.as_str(), &o.customer, o.amount, &o.currency, &i)
                            .await
                    }
                })
                .lookup(move |_ctx: LookupCtx| {
                    let (provider, i) = (lookups.clone(), li.clone());
                    async move { provider.find_charge(&i).await }
                })
                .undo("refund", move |ctx: UndoCtx, charge: Charge| {
                    let provider = refunds.clone();
                    async move {
                        match charge {
                            Charge::Paid { payment_id } => {
                                provider.refund(ctx.key.as_str(), &payment_id, amount).await
                            }
                            Charge::Declined => Ok(()),
                        }
                    }
                })
                .await?;
            let payment_id = match charge {
                Charge::Paid { payment_id } => payment_id,
                Charge::Declined => return Err(run.fail("card_declined")),
            };

            // 3. The confirmation: the point of no return.
            if let Some((mail, delivery)) = &self.mail {
                let message_id = format!("confirm-{id}");
                let (m, v) = (mail.clone(), mail.clone());
                let (to, subject) = (order.email.clone(), format!("Order {id} confirmed"));
                let text = format!(
                    "Your order {id} of {} × {} is confirmed; payment {payment_id}.",
                    order.quantity, order.sku
                );
                let send = move |ctx: SendCtx| {
                    let (m, to, subject, text) =
                        (m.clone(), to.clone(), subject.clone(), text.clone());
                    async move { m.send(&ctx.message_id, &to, &subject, &text).await }
                };
                match delivery {
                    MailDelivery::Verify => {
                        let verify = move |ctx: SendCtx| {
                            let v = v.clone();
                            async move { v.has(&ctx.message_id).await }
                        };
                        run.send("confirmation", verify, send)
                            .message_id(message_id)
                            .point_of_no_return()
                            .await?;
                    }
                    MailDelivery::AtMostOnce => {
                        run.send_at_most_once("confirmation", send)
                            .message_id(message_id)
                            .point_of_no_return()
                            .await?;
                    }
                }
            }

            // 4. Confirm: a transition that tells a repeat from a mistake.
            let (t, i, o, p, sm) = (
                tenant,
                id.clone(),
                order.clone(),
                payment_id.clone(),
                self.orders.clone(),
            );
            run.phase("confirm", move |tx| {
                Box::pin(async move { confirm(tx, &sm, &t, &i, &o, &p).await })
            })
            .await?;
            let body = order_json(
                &id,
                "confirmed",
                &order,
                Some(&payment_id),
                None,
                created_at,
            );
            Ok(
                Completion::completed(json_answer(201, &body, Some(&format!("/v1/orders/{id}"))))
                    .with_resource("order", id),
            )
        })
    }

    fn failed<'r>(
        &'r self,
        run: &'r mut Run<S>,
        failure: &'r Failure,
    ) -> BoxFuture<'r, Result<Completion, Stop>> {
        Box::pin(async move {
            let tenant = run.scope().tenant.as_str().to_owned();
            let id = order_id(run.id());
            let reason = match failure.reason.as_str() {
                "card_declined" => "card_declined",
                "deadline" => "payment_unavailable",
                _ => "payment_failed",
            };
            let (t, i, sm) = (tenant, id.clone(), self.orders.clone());
            run.phase("mark-failed", move |tx| {
                Box::pin(async move {
                    let key = [Value::Text(&t), Value::Text(&i)];
                    let set = [
                        ("reason", Value::Text(reason)),
                        ("updated_at_ms", Value::Int(now_ms())),
                    ];
                    match sm.transition(tx, &key, "failed", &set).await? {
                        Transition::Moved | Transition::AlreadyThere | Transition::Missing => {
                            Ok(())
                        }
                        Transition::Illegal { current } => {
                            Err(fault(format!("order {i} is {current}, it cannot fail")))
                        }
                    }
                })
            })
            .await?;
            // The client learns what happened to its order, not the
            // internals of the failure (those are in the run's record).
            let answer = match reason {
                "card_declined" => problem_answer(
                    402,
                    "card-declined",
                    "The card was declined",
                    "the payment provider declined the card; nothing was charged and the stock \
                     was released",
                    Some(&id),
                ),
                "payment_unavailable" => problem_answer(
                    424,
                    "payment-failed",
                    "The payment could not be completed",
                    "the payment provider could not be reached, or did not answer, before the \
                     order's deadline; anything charged was refunded and the stock released",
                    Some(&id),
                ),
                _ => problem_answer(
                    424,
                    "payment-failed",
                    "The payment could not be completed",
                    "the payment provider refused the payment; anything charged was refunded \
                     and the stock released",
                    Some(&id),
                ),
            };
            Ok(Completion::failed(answer))
        })
    }

    fn accepted(&self, run: &RunId) -> StoredResponse {
        let id = order_id(run);
        json_answer(
            202,
            &json!({"id": id, "status": "pending"}),
            Some(&format!("/v1/orders/{id}")),
        )
    }
}

/// Stock reserved and the order created, or why not.
async fn reserve<E: PatternExec + ?Sized>(
    tx: &mut E,
    tenant: &str,
    id: &str,
    o: &NewOrder,
    created_at_ms: i64,
) -> Result<Reserved, BoxError> {
    // The order's columns as `$1`..`$8`, for the comparison and the insert.
    let order = [
        Value::Text(tenant),
        Value::Text(id),
        Value::Text(&o.customer),
        Value::Text(&o.sku),
        Value::Int(o.quantity),
        Value::Int(o.amount),
        Value::Text(&o.currency),
        Value::Text(&o.email),
    ];
    let exists = tx
        .fetch_text(
            "SELECT CASE WHEN customer = $3 AND sku = $4 AND quantity = $5 AND amount = $6 \
             AND currency = $7 AND email = $8 THEN 'same' ELSE 'other' END \
             FROM demo_orders WHERE tenant_id = $1 AND id = $2",
            &order,
        )
        .await?;
    match exists.as_deref() {
        Some("same") => return Ok(Reserved::Exists),
        Some(_) => return Ok(Reserved::Other),
        None => {}
    }
    let now = now_ms();
    let moved = tx
        .fetch_int(
            "UPDATE demo_inventory SET available = available - $3, reserved = reserved + $3, \
             version = version + 1, updated_at_ms = $4 \
             WHERE tenant_id = $1 AND sku = $2 AND available >= $3 RETURNING available",
            &[
                Value::Text(tenant),
                Value::Text(&o.sku),
                Value::Int(o.quantity),
                Value::Int(now),
            ],
        )
        .await?;
    if moved.is_none() {
        return Ok(Reserved::OutOfStock);
    }
    tx.execute(
        "INSERT INTO demo_orders (tenant_id, id, customer, sku, quantity, amount, currency, email, \
         status, created_at_ms, updated_at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'pending', $9, $9)",
        &[&order[..], &[Value::Int(created_at_ms)]].concat(),
    )
    .await?;
    Ok(Reserved::Yes)
}

/// The compensation of `reserve`: the reserved quantity is available again.
async fn release<E: PatternExec + ?Sized>(
    tx: &mut E,
    tenant: &str,
    o: &NewOrder,
) -> Result<(), BoxError> {
    let n = tx
        .execute(
            "UPDATE demo_inventory SET available = available + $3, reserved = reserved - $3, \
             version = version + 1, updated_at_ms = $4 \
             WHERE tenant_id = $1 AND sku = $2 AND reserved >= $3",
            &[
                Value::Text(tenant),
                Value::Text(&o.sku),
                Value::Int(o.quantity),
                Value::Int(now_ms()),
            ],
        )
        .await?;
    if n != 1 {
        return Err(fault(format!(
            "{} of {} are not reserved",
            o.quantity, o.sku
        )));
    }
    Ok(())
}

/// The order confirmed and its reserved stock taken out.
async fn confirm<E: PatternExec + ?Sized>(
    tx: &mut E,
    orders: &StateMachine,
    tenant: &str,
    id: &str,
    o: &NewOrder,
    payment_id: &str,
) -> Result<(), BoxError> {
    let key = [Value::Text(tenant), Value::Text(id)];
    let set = [
        ("payment_id", Value::Text(payment_id)),
        ("updated_at_ms", Value::Int(now_ms())),
    ];
    match orders.transition(tx, &key, "confirmed", &set).await? {
        Transition::Moved => {}
        Transition::AlreadyThere => return Ok(()),
        Transition::Illegal { current } => {
            return Err(fault(format!(
                "order {id} is {current}, it cannot be confirmed"
            )));
        }
        Transition::Missing => return Err(fault(format!("order {id} is missing"))),
    }
    let n = tx
        .execute(
            "UPDATE demo_inventory SET reserved = reserved - $3, version = version + 1, \
             updated_at_ms = $4 WHERE tenant_id = $1 AND sku = $2 AND reserved >= $3",
            &[
                Value::Text(tenant),
                Value::Text(&o.sku),
                Value::Int(o.quantity),
                Value::Int(now_ms()),
            ],
        )
        .await?;
    if n != 1 {
        return Err(fault(format!(
            "{} of {} are not reserved",
            o.quantity, o.sku
        )));
    }
    Ok(())
}

/// An order as the API shows it.
pub fn order_json(
    id: &str,
    status: &str,
    o: &NewOrder,
    payment_id: Option<&str>,
    reason: Option<&str>,
    created_at_ms: i64,
) -> Json {
    let mut v = json!({
        "id": id, "status": status, "customer": o.customer, "sku": o.sku,
        "quantity": o.quantity, "amount": o.amount, "currency": o.currency,
        "payment_id": payment_id, "created_at": crate::respond::rfc3339(created_at_ms),
    });
    if let Some(r) = reason {
        v["reason"] = r.into();
    }
    v
}

/// The settings of the checkout routes and workflow.
#[derive(Debug, Clone)]
pub struct CheckoutConfig {
    /// `--provider-url`.
    pub provider_url: String,
    /// `--mail-url`.
    pub mail_url: Option<String>,
    /// `--mail-delivery`.
    pub mail_delivery: MailDelivery,
    /// `--run-lease`.
    pub lease: Duration,
    /// `--order-deadline`.
    pub deadline: Duration,
    /// `--call-timeout`: one exchange with the provider or the relay.
    pub call_timeout: Duration,
    /// `--landing-margin`: how long after a charge's call timeout a request
    /// of it may still land at the provider.
    pub landing_margin: Duration,
    /// `--max-runs`.
    pub max_runs: usize,
}

impl CheckoutConfig {
    /// The executor of orders' runs on `store`, the checkout registered.
    pub fn runs<S: RunStore<Tx: PatternExec>>(
        &self,
        store: S,
    ) -> anyhow::Result<idem_steps::Runs<S>> {
        let config = idem_steps::RunsConfig {
            lease: self.lease,
            max_concurrent: self.max_runs,
            // The clients bound each exchange; this bounds a call whose
            // client hangs anyway.
            call_timeout: self.call_timeout + Duration::from_secs(1),
            landing_margin: self.landing_margin,
            ..idem_steps::RunsConfig::default()
        };
        let policy = idem_steps::WorkflowPolicy {
            deadline: self.deadline,
        };
        Ok(idem_steps::Runs::builder(store)
            .config(config)
            .workflow(Checkout::operation()?, self.workflow()?, policy)
            .build()?)
    }

    /// The workflow with its clients.
    pub fn workflow(&self) -> anyhow::Result<Checkout> {
        let provider = Provider(clients::Endpoint::new(
            self.provider_url.clone(),
            self.call_timeout,
        ));
        let mail = self.mail_url.as_ref().map(|url| {
            (
                Mail(clients::Endpoint::new(url.clone(), self.call_timeout)),
                self.mail_delivery,
            )
        });
        Checkout::new(provider, mail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_are_validated() {
        let good = br#"{"customer":"cus_1","sku":"tee-m","quantity":2,"amount":3000,"currency":"EUR","email":"ada@example.com"}"#;
        let o = parse_order(good).unwrap();
        assert_eq!((o.quantity, o.amount, o.sku.as_str()), (2, 3000, "tee-m"));
        for (bad, says) in [
            (&br#"{"customer":"c","sku":"a b","quantity":1,"amount":1,"currency":"EUR","email":"a@b.c"}"#[..], "sku"),
            (br#"{"customer":"c","sku":"a","quantity":0,"amount":1,"currency":"EUR","email":"a@b.c"}"#, "quantity"),
            (br#"{"customer":"c","sku":"a","quantity":1,"amount":1,"currency":"eur","email":"a@b.c"}"#, "currency"),
            (br#"{"customer":"c","sku":"a","quantity":1,"amount":1,"currency":"EUR","email":"nope"}"#, "email"),
            (br#"{"customer":"","sku":"a","quantity":1,"amount":1,"currency":"EUR","email":"a@b.c"}"#, "customer"),
            (br#"[1]"#, "object"),
            (b"{", "JSON"),
        ] {
            let e = parse_order(bad).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn order_ids_name_their_run() {
        let run = RunId::parse("run_0123456789abcdef0123456789abcdef").unwrap();
        let id = order_id(&run);
        assert_eq!(id, "ord_0123456789abcdef0123456789abcdef");
        assert_eq!(run_of(&id), Some(run));
        assert_eq!(run_of("ord_x"), None);
        assert_eq!(run_of("pay_0123456789abcdef0123456789abcdef"), None);
    }
}
