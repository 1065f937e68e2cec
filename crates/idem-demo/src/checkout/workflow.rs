//! The saga itself: [`Checkout`]'s [`Workflow`] — reserve, charge, confirm
//! by mail, confirm — and what the client is told when it fails.

use idem_core::steps::{Failure, RunId, RunStore};
use idem_core::{BoxFuture, Completion, StoredResponse};
use idem_sql::patterns::{PatternExec, Transition, Value};
use idem_steps::{LookupCtx, Run, SendCtx, Stop, UndoCtx, Workflow};
use serde_json::{Value as Json, json};

use super::clients::Charge;
use super::order::{order_id, order_json, parse_order};
use super::phases::{Reserved, confirm, fault, release, reserve};
use super::saga::{Checkout, MailDelivery};
use crate::input::now_ms;

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
