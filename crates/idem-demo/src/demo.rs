//! [`Demo`]: what `idem serve` mounts when it serves the demo — the payment
//! routes, the stock routes and, with a checkout configured, the order
//! routes and the recovery of their runs.

use std::time::Duration;

use axum::Router;

use crate::checkout::CheckoutConfig;
use crate::config::DemoConfig;
use crate::store::Store;

/// The demo apps' settings, validated.
#[derive(Debug, Clone)]
pub struct Demo {
    /// The payment, refund, stock and order routes.
    pub routes: DemoConfig,
    /// `--provider-url` and the checkout's other flags; `None`: no orders.
    pub checkout: Option<CheckoutConfig>,
    /// `--respond-within`: how long an order request waits for its run.
    pub respond_within: Duration,
}

impl Demo {
    /// The demo's routes on `store`, whose demo tables exist
    /// ([`DemoSql::migrate_demo`](crate::sql::DemoSql::migrate_demo)). With
    /// a checkout, the recovery of orders whose process died runs in the
    /// background until `stop` completes.
    pub fn router<S: Store>(
        &self,
        store: S,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<Router> {
        let runs = match &self.checkout {
            Some(checkout) => {
                let runs = checkout.runs(store.clone())?;
                tokio::spawn(runs.recovery().run(stop));
                tracing::info!(
                    provider = checkout.provider_url,
                    mail = checkout.mail_url.as_deref().unwrap_or("none"),
                    holder = runs.holder(),
                    "orders enabled at /v1/orders; recovering their runs"
                );
                Some(runs)
            }
            None => None,
        };
        let orders = crate::checkout::routes::router(
            store.clone(),
            runs,
            &self.routes,
            self.respond_within,
        )?;
        Ok(crate::handlers::router(store, &self.routes).merge(orders))
    }
}
