//! # Idem webhooks
//!
//! Inbound webhooks are messages from an untrusted edge: late, twice, out of
//! order, sometimes forged.

mod forward;
mod processor;
mod receiver;
mod scheme;

pub use forward::{Forward, idempotency_key};
pub use processor::{HandleError, Processor, ProcessorConfig, Round, WebhookHandler};
pub use receiver::{
    ConfigError, Counters, Endpoint, EndpointConfig, MAX_BODY_LIMIT, ReceiveError, Received,
    Receiver,
};
pub use scheme::{Scheme, Secret, SecretError, Verified, Verifier, VerifyError};
