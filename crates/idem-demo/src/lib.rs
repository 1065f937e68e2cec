//! The demo apps `idem serve` mounts, written with the library the way a
//! user would write theirs: the payments API ([`handlers`], ordinary
//! generic Rust over [`sql::DemoSql`], which each backend implements), its
//! ledger consumer ([`Ledger`]), the checkout ([`checkout`]: orders that
//! call a payment provider and a mail relay, run as steps), and two
//! programs of the tours: the sample upstream that is not idempotent
//! ([`upstream`], `idem upstream`) and the mail relay ([`mail_sink`],
//! `idem mail-sink`).
//!
//! The one entry point of `idem serve` is [`Demo::router`]: the payment
//! routes, the stock and order routes, and the checkout's recovery.
//!
//! Modules import downwards only: this file declares and re-exports;
//! `app` holds the state the payment routes and the benchmark's
//! `baseline` share.
#![allow(missing_docs)]
// Demo handlers return early with a ready `Response` as their error; it is built
// once per rejected request, so its size does not matter.
#![allow(clippy::result_large_err)]

mod app;
mod baseline;
pub mod checkout;
pub mod config;
mod demo;
pub mod events;
pub mod handlers;
pub mod input;
mod ledger;
pub mod mail_sink;
pub mod output;
pub mod sql;
pub mod store;
pub mod upstream;

pub use baseline::PATH as BASELINE_PATH;
pub use config::DemoConfig;
pub use demo::Demo;
pub use events::{Event, PAYMENT_CREATED, PAYMENT_REFUNDED, decode_event, event_message};
pub use handlers::{router, router_with_clock};
pub use input::{MAX_AMOUNT, valid_id, valid_text};
pub use ledger::Ledger;
pub use sql::migrations::{POSTGRES_MIGRATIONS, SQLITE_MIGRATIONS};
pub use sql::{DemoSql, PaymentRow, RefundRow};
pub use store::Store;
