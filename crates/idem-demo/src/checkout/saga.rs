//! The checkout workflow's own value: its clients and the state machine
//! of orders (the steps are `workflow`'s).

use idem_core::Operation;
use idem_sql::patterns::StateMachine;

use super::clients::{Mail, Provider};

/// The operation orders' keys are scoped to.
pub const OPERATION: &str = "orders.create";

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
    pub(super) provider: Provider,
    pub(super) mail: Option<(Mail, MailDelivery)>,
    pub(super) orders: StateMachine,
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
