//! The checkout demo's flags, shared by `idem serve` (which runs orders)
//! and `idem steps recover` (which resumes their runs), and their check:
//! each duration within its range, the URLs well formed, the mail flags
//! only with what they need.

use std::time::Duration;

/// The checkout's flags (`idem serve`, `idem steps recover`).
#[derive(clap::Args, Clone)]
pub struct CheckoutArgs {
    /// The payment provider of the checkout demo (`http://HOST:PORT[/PREFIX]`:
    /// the demo payments API of another `idem serve`). Enables `/v1/orders` and
    /// the recovery of their runs.
    #[arg(long, env = "IDEM_PROVIDER_URL", help_heading = "Demo")]
    pub provider_url: Option<String>,
    /// The mail relay order confirmations go through (`http://HOST:PORT[/PREFIX]`,
    /// `POST /messages` and `GET /messages/{id}`, such as `idem mail-sink`).
    /// Without it no confirmation is sent.
    #[arg(long, env = "IDEM_MAIL_URL", help_heading = "Demo")]
    pub mail_url: Option<String>,
    /// How confirmations go out (needs --mail-url): `verify` (the default)
    /// asks the relay before sending again after an unknown outcome;
    /// `at-most-once` never sends again and waits for an operator (`idem
    /// steps resolve`).
    #[arg(long, env = "IDEM_MAIL_DELIVERY", value_enum, help_heading = "Demo")]
    pub mail_delivery: Option<idem_demo::checkout::MailDelivery>,
    /// How long a run's lease holds without a heartbeat: a run whose
    /// process died is resumed this long after (1s to 1h).
    #[arg(long, env = "IDEM_RUN_LEASE", default_value = "10s", value_parser = humantime::parse_duration, help_heading = "Demo")]
    pub run_lease: Duration,
    /// From an order's start: after it, a provider that still fails makes
    /// the order compensate (refund, release) and fail (1s to 30days).
    #[arg(long, env = "IDEM_ORDER_DEADLINE", default_value = "60s", value_parser = humantime::parse_duration, help_heading = "Demo")]
    pub order_deadline: Duration,
    /// The longest one exchange with the provider or the relay may take;
    /// past it its outcome is unknown and it is retried with the same key
    /// (100ms to 5min).
    #[arg(long, env = "IDEM_CALL_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration, help_heading = "Demo")]
    pub call_timeout: Duration,
    /// After a charge's last attempt and its call timeout, how long a
    /// request of it may still land at the provider (the network, the
    /// provider's own request timeout): a failing order's refund trusts the
    /// provider's "no such payment" only after it (0s to 1h).
    #[arg(long, env = "IDEM_LANDING_MARGIN", default_value = "2m", value_parser = humantime::parse_duration, help_heading = "Demo")]
    pub landing_margin: Duration,
    /// Runs executed at once by this process (1 to 10000).
    #[arg(
        long,
        env = "IDEM_MAX_RUNS",
        default_value_t = 64,
        help_heading = "Demo"
    )]
    pub max_runs: usize,
}

impl CheckoutArgs {
    /// The checkout's settings from these flags; `None` without `--provider-url`.
    pub fn config(&self) -> anyhow::Result<Option<idem_demo::checkout::CheckoutConfig>> {
        use crate::flags::{check, within};
        use idem_demo::checkout::clients::base_url;
        use idem_demo::checkout::{CheckoutConfig, MailDelivery};
        let args = self;
        let hour = Duration::from_secs(3600);
        let lease = check(within(
            "--run-lease",
            args.run_lease,
            Duration::from_secs(1),
            hour,
        ))?;
        let deadline = check(within(
            "--order-deadline",
            args.order_deadline,
            Duration::from_secs(1),
            Duration::from_secs(30 * 24 * 3600),
        ))?;
        let call_timeout = check(within(
            "--call-timeout",
            args.call_timeout,
            Duration::from_millis(100),
            Duration::from_secs(300),
        ))?;
        let landing_margin = check(within(
            "--landing-margin",
            args.landing_margin,
            Duration::ZERO,
            hour,
        ))?;
        if !(1..=10_000).contains(&args.max_runs) {
            anyhow::bail!(
                "--max-runs must be between 1 and 10000, got {}",
                args.max_runs
            );
        }
        let mail_url = match &args.mail_url {
            Some(url) => Some(base_url("--mail-url", url)?),
            None => None,
        };
        if args.mail_delivery.is_some() && mail_url.is_none() {
            anyhow::bail!("--mail-delivery needs --mail-url: it says how confirmations go out");
        }
        let Some(provider) = &args.provider_url else {
            if mail_url.is_some() {
                anyhow::bail!("--mail-url needs --provider-url: confirmations are sent for orders");
            }
            return Ok(None);
        };
        Ok(Some(CheckoutConfig {
            provider_url: base_url("--provider-url", provider)?,
            mail_url,
            mail_delivery: args.mail_delivery.unwrap_or(MailDelivery::Verify),
            lease,
            deadline,
            call_timeout,
            landing_margin,
            max_runs: args.max_runs,
        }))
    }
}
