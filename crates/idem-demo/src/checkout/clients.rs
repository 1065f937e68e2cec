//! The checkout's clients of other systems: the payment provider (which
//! honours `Idempotency-Key`) and the mail relay (which does not
//! deduplicate), both over [`idem_client`]. Each exchange is one attempt —
//! the run's steps retry, with their own policy and a key derived from the
//! step — bounded in time and in the bytes read, and each failure is
//! classified by what it says about the effect ([`StepError`]): a refused
//! connection certainly did nothing; a timeout, a broken answer or a 5xx may
//! have done it.

use std::time::Duration;

use bytes::Bytes;
use hyper::{Method, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use idem_client::{Client, ClientError, Failure, RetryPolicy};
use idem_steps::StepError;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Answers read, at most.
const MAX_ANSWER_BYTES: usize = 64 << 10;

/// An `http://` base URL and a pooled [`idem_client::Client`] that makes one
/// attempt per exchange, within a timeout.
#[derive(Debug, Clone)]
pub struct Endpoint {
    client: Client<HttpConnector>,
    timeout: Duration,
}

/// Checks a base URL given on the command line: `http://host:port[/path]`.
pub fn base_url(flag: &str, url: &str) -> anyhow::Result<String> {
    idem_gateway::HttpBase::parse(flag, url).map_err(anyhow::Error::msg)?;
    Ok(url.trim_end_matches('/').to_owned())
}

impl Endpoint {
    /// A client of `base` (already checked by [`base_url`]) whose exchanges
    /// each take at most `timeout`, connecting included.
    pub fn new(base: &str, timeout: Duration) -> anyhow::Result<Self> {
        let mut policy = RetryPolicy::no_retries();
        policy.attempt_timeout = timeout;
        policy.deadline = timeout;
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        let client = Client::builder()
            .retry_policy(policy)
            .max_response_body(MAX_ANSWER_BYTES)
            .build_with_connector(base, connector)?;
        Ok(Self { client, timeout })
    }

    /// The base URL.
    pub fn base(&self) -> &str {
        self.client.base_url()
    }

    /// One exchange: the status and at most [`MAX_ANSWER_BYTES`] of the
    /// answer, within the timeout. `key` is the `Idempotency-Key` (without
    /// one, the client draws a fresh key, which a receiver that does not
    /// deduplicate ignores).
    async fn exchange(
        &self,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> Result<(StatusCode, Bytes), StepError> {
        let mut req = self.client.request(method, path);
        if let Some(key) = key {
            req = req.key(key);
        }
        if let Some(v) = &body {
            req = req.json(v);
        }
        match req.send().await {
            Ok(answer) => Ok((answer.status, answer.body)),
            // With one attempt, an answer the client would have retried
            // (429, a 5xx, a 409 in flight) is the exchange's answer: the
            // caller classifies it.
            Err(
                ClientError::DeadlineExceeded {
                    last: Failure::Status(answer),
                    ..
                }
                | ClientError::AttemptsExhausted {
                    last: Failure::Status(answer),
                    ..
                },
            ) => {
                let answer = *answer;
                Ok((answer.status, answer.body))
            }
            Err(e) => Err(self.step_error(e)),
        }
    }

    /// What an exchange without an answer says about its effect.
    fn step_error(&self, e: ClientError) -> StepError {
        let last = match &e {
            ClientError::DeadlineExceeded { last, .. }
            | ClientError::AttemptsExhausted { last, .. } => last,
            ClientError::ResponseTooLarge { .. } => {
                return StepError::Unknown(format!("the answer could not be read: {e}"));
            }
            _ if e.nothing_sent() => {
                return StepError::Permanent(format!("cannot build the request: {e}"));
            }
            _ => return StepError::Unknown(format!("the exchange broke: {e}")),
        };
        match last {
            Failure::Transport(source) => {
                let why = idem_core::ErrorChain(source.as_ref()).to_string();
                let connect = source
                    .downcast_ref::<hyper_util::client::legacy::Error>()
                    .is_some_and(hyper_util::client::legacy::Error::is_connect);
                if connect {
                    // Nothing was sent.
                    StepError::Retry(format!("unreachable: {why}"))
                } else {
                    StepError::Unknown(format!("the exchange broke: {why}"))
                }
            }
            Failure::Timeout { .. } => {
                StepError::Unknown(format!("no complete answer within {:?}", self.timeout))
            }
            other => StepError::Unknown(format!("the exchange failed: {other}")),
        }
    }
}

fn text(bytes: &Bytes) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned()
}

/// What the provider said to a charge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Charge {
    /// Paid: the provider's payment id.
    Paid {
        /// The payment.
        payment_id: String,
    },
    /// The card was declined (`402`).
    Declined,
}

/// The payment provider: the demo payments API of another `idem serve`, or
/// any API with its contract.
#[derive(Debug, Clone)]
pub struct Provider(pub Endpoint);

impl Provider {
    /// `POST /v1/payments` with `key` as `Idempotency-Key`; the order id is
    /// the payment's `reference` (the provider's natural key).
    pub async fn charge(
        &self,
        key: &str,
        customer: &str,
        amount: i64,
        currency: &str,
        order_id: &str,
    ) -> Result<Charge, StepError> {
        let body = json!({"amount": amount, "currency": currency, "customer": customer,
                          "reference": order_id});
        let (status, answer) = self
            .0
            .exchange(Method::POST, "/v1/payments", Some(key), Some(body))
            .await?;
        match status.as_u16() {
            200 | 201 => {
                let v: Value = serde_json::from_slice(&answer).map_err(|e| {
                    StepError::Unknown(format!("the provider's answer is not JSON: {e}"))
                })?;
                match v.get("id").and_then(Value::as_str) {
                    Some(id) if crate::input::valid_id(id) => Ok(Charge::Paid {
                        payment_id: id.to_owned(),
                    }),
                    _ => Err(StepError::Unknown(
                        "the provider's answer has no payment id".into(),
                    )),
                }
            }
            402 => Ok(Charge::Declined),
            s => Err(classify("charge", status, s, &answer)),
        }
    }

    /// Whether a charge for `order_id` happened: `GET
    /// /v1/payments?reference=…` (the order id is the payment's
    /// `reference`). `Some` is the payment; `None` means the provider holds
    /// none *now* — a charge still travelling may land later (the caller
    /// trusts it only after the landing window). Read-only, so any failure
    /// may be retried; a 4xx other than 409/425/429 is for good.
    pub async fn find_charge(&self, order_id: &str) -> Result<Option<Charge>, StepError> {
        if !crate::input::valid_id(order_id) {
            return Err(StepError::Permanent(format!(
                "order id {order_id:?} cannot be looked up"
            )));
        }
        let path = format!("/v1/payments?reference={order_id}");
        let (status, answer) = self.0.exchange(Method::GET, &path, None, None).await?;
        if status != StatusCode::OK {
            return Err(classify("lookup", status, status.as_u16(), &answer));
        }
        let v: Value = serde_json::from_slice(&answer)
            .map_err(|e| StepError::Unknown(format!("the provider's answer is not JSON: {e}")))?;
        let Some(found) = v.get("data").and_then(Value::as_array) else {
            return Err(StepError::Unknown(
                "the provider's answer has no data list".into(),
            ));
        };
        let ours = |p: &&Value| p.get("reference").and_then(Value::as_str) == Some(order_id);
        match found.iter().filter(ours).collect::<Vec<_>>()[..] {
            [] => Ok(None),
            [p] => match p.get("id").and_then(Value::as_str) {
                Some(id) if crate::input::valid_id(id) => Ok(Some(Charge::Paid {
                    payment_id: id.to_owned(),
                })),
                _ => Err(StepError::Unknown(
                    "the provider's payment has no valid id".into(),
                )),
            },
            _ => Err(StepError::Permanent(format!(
                "the provider holds several payments for {order_id}"
            ))),
        }
    }

    /// `POST /v1/payments/{id}/refunds` of `amount`, with its own key.
    pub async fn refund(&self, key: &str, payment_id: &str, amount: i64) -> Result<(), StepError> {
        if !crate::input::valid_id(payment_id) {
            return Err(StepError::Permanent(format!(
                "not a payment id: {payment_id:?}"
            )));
        }
        let path = format!("/v1/payments/{payment_id}/refunds");
        let (status, answer) = self
            .0
            .exchange(
                Method::POST,
                &path,
                Some(key),
                Some(json!({"amount": amount})),
            )
            .await?;
        match status.as_u16() {
            200 | 201 => Ok(()),
            s => Err(classify("refund", status, s, &answer)),
        }
    }
}

/// A failure answer: in flight elsewhere, rate-limited or a server error may
/// pass (a 5xx may also have done the work: its outcome is unknown); any
/// other 4xx will not.
fn classify(what: &str, status: StatusCode, code: u16, answer: &Bytes) -> StepError {
    let message = format!("{what}: the provider answered {status}: {}", text(answer));
    match code {
        409 | 425 | 429 => StepError::Retry(message),
        500..=599 => StepError::Unknown(message),
        _ => StepError::Permanent(message),
    }
}

/// The mail relay: `POST /messages` (`202`, no deduplication) and `GET
/// /messages/{id}` (`200` when it has the id, `404` otherwise).
#[derive(Debug, Clone)]
pub struct Mail(pub Endpoint);

impl Mail {
    /// Sends one message.
    pub async fn send(
        &self,
        id: &str,
        to: &str,
        subject: &str,
        body: &str,
    ) -> Result<(), StepError> {
        let message = json!({"id": id, "to": to, "subject": subject, "body": body});
        let (status, answer) = self
            .0
            .exchange(Method::POST, "/messages", None, Some(message))
            .await?;
        match status.as_u16() {
            200..=299 => Ok(()),
            400..=499 if status != StatusCode::TOO_MANY_REQUESTS => Err(StepError::Permanent(
                format!("the relay refused the message: {status}: {}", text(&answer)),
            )),
            _ => Err(StepError::Unknown(format!(
                "the relay answered {status}: {}",
                text(&answer)
            ))),
        }
    }

    /// Whether the relay accepted a message with this id.
    pub async fn has(&self, id: &str) -> Result<bool, StepError> {
        if !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
        {
            return Err(StepError::Permanent(format!(
                "message id {id:?} cannot be looked up"
            )));
        }
        let (status, answer) = self
            .0
            .exchange(Method::GET, &format!("/messages/{id}"), None, None)
            .await?;
        match status.as_u16() {
            200 => Ok(true),
            404 => Ok(false),
            _ => Err(StepError::Unknown(format!(
                "the relay could not say: {status}: {}",
                text(&answer)
            ))),
        }
    }
}

#[cfg(test)]
mod tests;
