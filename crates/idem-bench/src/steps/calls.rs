//! The two calls of the benchmarked run — a charge at the provider, a
//! message through the relay — over `idem-client`, one attempt each: a
//! failure goes back to the step, which says what it means (nothing sent:
//! retry; anything else: the outcome is unknown). The same calls serve the
//! unrecorded baseline, so both rows pay for one client.

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::Method;
use idem_client::{Client, ClientError, RetryPolicy};
use idem_steps::StepError;
use serde_json::{Value, json};

/// A client of `addr` that tries once, within `timeout`.
fn client(addr: SocketAddr, timeout: Duration) -> anyhow::Result<Client> {
    let mut policy = RetryPolicy::no_retries();
    policy.attempt_timeout = timeout;
    policy.deadline = timeout;
    Ok(Client::builder()
        .retry_policy(policy)
        .build(&format!("http://{addr}"))?)
}

fn failed(e: ClientError) -> StepError {
    if e.nothing_sent() {
        StepError::Retry(e.to_string())
    } else {
        StepError::Unknown(e.to_string())
    }
}

/// The provider: `POST /v1/payments` under the step's key.
#[derive(Clone)]
pub struct Provider(Client);

impl Provider {
    /// A client of the provider at `addr`.
    pub fn new(addr: SocketAddr, timeout: Duration) -> anyhow::Result<Self> {
        client(addr, timeout).map(Self)
    }

    /// Charges 100 EUR for `order_id`; the payment's id.
    pub async fn charge(&self, key: &str, order_id: &str) -> Result<String, StepError> {
        let body = json!({"amount": 100, "currency": "EUR", "customer": "cus_bench",
                          "reference": order_id});
        let answer = self
            .0
            .post("/v1/payments")
            .key(key)
            .json(&body)
            .send()
            .await
            .map_err(failed)?;
        if answer.status != 201 {
            return Err(StepError::Unknown(format!(
                "the provider answered {}",
                answer.status
            )));
        }
        let v: Value = answer
            .json()
            .map_err(|e| StepError::Unknown(format!("the provider's answer is not JSON: {e}")))?;
        match v.get("id").and_then(Value::as_str) {
            Some(id) => Ok(id.to_owned()),
            None => Err(StepError::Unknown("the answer has no payment id".into())),
        }
    }
}

/// The relay: `POST /messages` (no deduplication) and `GET /messages/{id}`.
#[derive(Clone)]
pub struct Relay(Client);

impl Relay {
    /// A client of the relay at `addr`.
    pub fn new(addr: SocketAddr, timeout: Duration) -> anyhow::Result<Self> {
        client(addr, timeout).map(Self)
    }

    /// Sends the message `id`.
    pub async fn send(&self, id: &str) -> Result<(), StepError> {
        let message = json!({"id": id, "to": "a@b.c", "subject": "s", "body": "b"});
        let answer = self
            .0
            .post("/messages")
            .json(&message)
            .send()
            .await
            .map_err(failed)?;
        match answer.status.is_success() {
            true => Ok(()),
            false => Err(StepError::Unknown(format!(
                "the relay answered {}",
                answer.status
            ))),
        }
    }

    /// Whether the relay has the message `id`.
    pub async fn has(&self, id: &str) -> Result<bool, StepError> {
        let answer = self
            .0
            .request(Method::GET, &format!("/messages/{id}"))
            .send()
            .await
            .map_err(failed)?;
        match answer.status.as_u16() {
            200 => Ok(true),
            404 => Ok(false),
            s => Err(StepError::Unknown(format!("the relay could not say: {s}"))),
        }
    }
}
