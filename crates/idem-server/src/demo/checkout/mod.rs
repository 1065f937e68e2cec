//! The checkout saga, written against `idem-steps` the way a user would:
//! reserve stock (a conditional update, in the transaction that claims the
//! key and creates the run) → charge at the payment provider (a call with a
//! derived `Idempotency-Key`) → send the confirmation through a relay that
//! does not deduplicate (verify-then-send, or at most once) → confirm the
//! order. A declined card or a provider that stays away past the deadline
//! releases the stock and refunds what was charged, each compensation a
//! recorded step with its own key.
//!
//! `order` is what an order is, `workflow` the saga, `phases` its
//! transactional writes, [`clients`] the provider and the relay, [`routes`]
//! the HTTP API, [`page`] the browser's checkout page.

pub mod clients;
mod order;
pub mod page;
mod phases;
pub mod routes;
mod workflow;

use std::time::Duration;

use idem_core::Operation;
use idem_core::steps::RunStore;
use idem_sql::patterns::{PatternExec, StateMachine};

use self::clients::{Mail, Provider};
pub use self::order::{NewOrder, order_id, order_json, parse_order, run_of, valid_sku};

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
            &self.provider_url,
            self.call_timeout,
        )?);
        let mail = match &self.mail_url {
            Some(url) => Some((
                Mail(clients::Endpoint::new(url, self.call_timeout)?),
                self.mail_delivery,
            )),
            None => None,
        };
        Checkout::new(provider, mail)
    }
}
