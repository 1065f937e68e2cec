//! # Idem webhooks
//!
//! Inbound webhooks are messages from an untrusted edge: late, twice, out of
//! order, sometimes forged.

mod scheme;

pub use scheme::{Scheme, Secret, SecretError, Verified, Verifier, VerifyError};
