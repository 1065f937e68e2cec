//! The checkout saga, written against `idem-steps` the way a user would:
//! reserve stock (a conditional update, in the transaction that claims the
//! key and creates the run) → charge at the payment provider (a call with a
//! derived `Idempotency-Key`) → send the confirmation through a relay that
//! does not deduplicate (verify-then-send, or at most once) → confirm the
//! order. A declined card or a provider that stays away past the deadline
//! releases the stock and refunds what was charged, each compensation a
//! recorded step with its own key.
//!
//! `order` is what an order is, `saga` the workflow's value, `workflow` its
//! steps, [`settings`] its configuration, `phases` its
//! transactional writes, [`clients`] the provider and the relay, [`routes`]
//! the HTTP API, [`page`] the browser's checkout page.

pub mod clients;
mod order;
pub mod page;
mod phases;
pub mod routes;
mod saga;
pub mod settings;
mod workflow;

pub use order::{MAX_QUANTITY, NewOrder, order_id, order_json, parse_order, run_of, valid_sku};
pub use saga::{Checkout, MailDelivery, OPERATION};
pub use settings::CheckoutConfig;
