//! # Idem webhooks
//!
//! Inbound webhooks are messages from an untrusted edge: late, twice, out of
//! order, sometimes forged. This crate takes them in a fixed order:
//!
//! 1. **body limit** — the HTTP layer reads at most
//!    [`Endpoint::max_body_bytes`] (413 above);
//! 2. **verify** — [`Verifier`] checks the signature over the *raw* bytes, in
//!    constant time, against every secret of the endpoint (rotation), with the
//!    timestamp tolerance in both directions; an empty or truncated signature
//!    never verifies (401, nothing stored). Tell the sender only that it
//!    failed: [`ReceiveError::Signature`] holds the reason for your log, and
//!    the receiver logs it at most once per endpoint every 10 s;
//! 3. **dedupe key** — `(endpoint, delivery id)`, and for GitHub and Shopify
//!    also `(endpoint, body SHA-256)` (see *Content dedupe*);
//! 4. **persist** — [`Receiver::receive`] stores the receipt (raw headers minus
//!    credentials and signatures, raw body) and its inbox record in one
//!    transaction;
//! 5. **answer fast** — 202 for a new delivery, 200 for a duplicate.
//!
//! One exception to 3–5: Slack's `url_verification` handshake (a verified
//! body `{"type":"url_verification","challenge":"…"}` on a `slack` endpoint)
//! is answered `200 {"challenge":"…"}` ([`Received::Challenge`]) and never
//! stored nor forwarded; one without a usable challenge is refused (400,
//! [`ReceiveError::BadChallenge`]).
//!
//! With the `axum` feature, [`route::router`] is that order as an axum route,
//! `POST /webhooks/{endpoint}`, answering errors as problem+json. [`lookup`]
//! finds a stored delivery by any id an operator types.
//!
//! Then a [`Processor`] claims receipts — one claim loop per endpoint, up to
//! [`ProcessorConfig::concurrency`] receipts of an endpoint in flight and
//! the next claimed as soon as one finishes, one at a time per entity —,
//! skips the stale ones, and runs the endpoint's [`WebhookHandler`]: your
//! Rust code, or [`Forward`], which POSTs the body to an upstream with
//! `Idempotency-Key` set to [`idempotency_key`], so a service in any language
//! (one on Idem's HTTP layer, say) applies each delivery once even when a
//! worker forwards it twice. A forward — connect, answer, error body — is
//! bounded by the endpoint's `forward_timeout_secs`, so a stalled upstream
//! holds its own endpoint's slots and never another endpoint's. Failures
//! retry with backoff and end `dead`; an operator can replay a failed or dead
//! receipt; a processed one is never run again. A receipt's `attempts`
//! counts handler runs (the successful one included) and `finished_at` is set
//! once it is processed, stale or dead; a replay resets both. A processor
//! claims only the endpoints it has a handler for: other endpoints' receipts
//! wait, `received`, for a process that has one (or for their retention to
//! end).
//!
//! ```
//! use std::time::Duration;
//! use http::{HeaderMap, HeaderValue};
//! use idem_webhooks::{Scheme, Secret, Verifier, VerifyError};
//!
//! // GitHub's published example.
//! let verifier = Verifier::new(
//!     Scheme::Github,
//!     &[Secret::new("It's a Secret to Everybody")],
//!     Duration::from_secs(300),
//! )?;
//! let mut headers = HeaderMap::new();
//! headers.insert("x-hub-signature-256", HeaderValue::from_static(
//!     "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"));
//! headers.insert("x-github-delivery", HeaderValue::from_static("72d3162e"));
//! let now = 1_700_000_000;
//! assert_eq!(verifier.verify(&headers, b"Hello, World!", now)?.delivery_id, "72d3162e");
//! assert_eq!(verifier.verify(&headers, b"Hello, World?", now), Err(VerifyError::NoMatch));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Delivery ids
//!
//! | scheme | delivery id | fallback when absent |
//! |---|---|---|
//! | `github` | `X-GitHub-Hook-ID:X-GitHub-Delivery` | body SHA-256 |
//! | `stripe` | the event's `id` in the body (`evt_…`) | `t` and body SHA-256 |
//! | `standard` | `webhook-id` or `svix-id` (signed, so always present) | — |
//! | `shopify` | `X-Shopify-Webhook-Id` (or `X-Shopify-Event-Id`) | body SHA-256 |
//! | `slack` | `event_id` in the body (Events API) | timestamp and body SHA-256 |
//!
//! A fallback id makes two byte-identical deliveries (signed at the same
//! second, where the scheme has a timestamp) one delivery.
//!
//! An id longer than [`MAX_DELIVERY_ID_BYTES`] (255) is stored as
//! `sha256:<hex of the id>` ([`bounded_delivery_id`]); a repeat of it is still a
//! duplicate, and operators may look it up by either form. An id or event
//! type read from the body that is empty, longer than 255 bytes or holds a
//! control character (a JSON `\u0000`, say) counts as absent, so the fallback
//! applies; the same holds for the configured `entity_id`.
//!
//! ## Content dedupe (GitHub, Shopify)
//!
//! GitHub's and Shopify's signatures cover the body only: the delivery id
//! header is not signed and there is no signed timestamp, so whoever captured
//! one delivery could resend it under any number of new ids, each looking new.
//! For these two schemes a receipt is therefore also deduplicated on its
//! content — `(endpoint, SHA-256 of the raw body)` — for as long as the first
//! receipt is kept (`retention_hours`): a resend is answered `200` duplicate
//! and has no effect, so holding one delivery cannot multiply its effect.
//!
//! The limit: two genuinely different deliveries with byte-identical bodies
//! on one endpoint (the same event sent by a repository hook and by an
//! organisation hook, say) are treated as one. Stripe, Standard Webhooks and
//! Slack sign the id (or carry it in the signed body) together with a
//! timestamp and are deduplicated on the id only.
//!
//! ## Standard Webhooks and Svix
//!
//! The `standard` scheme reads the specification's `webhook-id`,
//! `webhook-timestamp` and `webhook-signature`, or the same three under
//! Svix's default names, `svix-id`, `svix-timestamp` and `svix-signature`.
//! One set is read whole, never a mix: `webhook-*` when any of its three is
//! present, else `svix-*`. When both are sent, `svix-id` and
//! `svix-timestamp` must repeat the `webhook-*` values (else 401, nothing
//! stored) and only `webhook-signature` is checked, so a receipt never holds
//! an id or time other than the one verified. Secrets are `whsec_<base64>`
//! (or `whpk_<base64>` for `v1a`), with or without the base64 `=` padding.
//!
//! Signature headers (`x-hub-signature*`, `stripe-signature`,
//! `webhook-signature`, `svix-signature`, `x-shopify-hmac-sha256`,
//! `x-slack-signature`) and
//! credentials are never stored with a receipt ([`is_secret_header`]).
//!
//! ## Order awareness
//!
//! An endpoint may name an entity and its version with JSON pointers
//! (`entity_id`, `entity_version`; versions are integers or RFC 3339
//! timestamps). Receipts of one entity are processed one at a time in arrival
//! order, and one whose version is older than the newest applied one is
//! recorded `stale` and not applied.

mod endpoint;
mod forward;
pub mod lookup;
mod processor;
mod receiver;
mod scheme;

#[cfg(feature = "axum")]
pub mod route;

pub use endpoint::{
    Endpoint, EndpointConfig, EndpointError, MAX_BODY_LIMIT, MAX_DELIVERY_ID_BYTES,
    bounded_delivery_id,
};
pub use forward::{Forward, idempotency_key};
pub use lookup::{delivery_forms, find_receipt, replay_receipt};
pub use processor::{HandlerError, Processor, ProcessorConfig, Round, WebhookHandler};
pub use receiver::{
    Counters, DELIVERIES_TOTAL, ReceiveError, Received, Receiver, is_secret_header,
};
pub use scheme::{Scheme, Secret, SecretError, Verified, Verifier, VerifyError};
