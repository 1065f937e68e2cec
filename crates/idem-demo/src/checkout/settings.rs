//! The checkout's settings, and the runs and workflow they make.

use std::time::Duration;

use idem_core::steps::RunStore;
use idem_sql::patterns::PatternExec;

use super::clients::{self, Mail, Provider};
use super::saga::{Checkout, MailDelivery};

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
