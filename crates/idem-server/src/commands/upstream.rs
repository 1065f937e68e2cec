//! `idem upstream`: the sample non-idempotent payments API
//! ([`idem_demo::upstream`]).

use std::net::SocketAddr;
use std::time::Duration;

use crate::flags as config;
use crate::shutdown::{self, stopped};
use axum::Router;
use idem_demo::upstream::{Mode, Upstream};
use idem_httpd::{self as http_server, Limits};

/// The pause between lookup and write in check-then-act mode when
/// `--delay` is not given: wide enough that concurrent retries all miss.
const CHECK_THEN_ACT_DELAY: Duration = Duration::from_millis(50);
/// The longest `--delay`.
const MAX_DELAY: Duration = Duration::from_secs(60);

/// `idem upstream`'s flags.
#[derive(clap::Args)]
pub struct UpstreamArgs {
    /// Address to listen on (IP:PORT or HOST:PORT).
    #[arg(long, default_value = "127.0.0.1:9000", value_parser = config::listen_address)]
    listen: SocketAddr,
    /// How `Idempotency-Key` is treated: `naive` ignores it,
    /// `check-then-act` looks it up before writing (racy on purpose).
    #[arg(long, value_enum, default_value = "naive")]
    mode: Mode,
    /// check-then-act: the pause between the key lookup and the write
    /// (default 50ms); naive: how long an answer waits after its payment
    /// was created (default 0s; a slow answer to lose). At most 60s.
    #[arg(long, value_parser = humantime::parse_duration)]
    delay: Option<Duration>,
    /// The first POST with each Idempotency-Key creates its payment, then
    /// the connection is closed without an answer (a lost answer, for the
    /// gateway tour); retries with the key are answered.
    #[arg(long)]
    lose_first_answer: bool,
}

impl UpstreamArgs {
    /// Serves until Ctrl-C or SIGTERM.
    pub async fn run(self) -> anyhow::Result<()> {
        let delay = match (self.mode, self.delay) {
            (_, Some(d)) if d > MAX_DELAY => anyhow::bail!("--delay must be at most 60s"),
            (_, Some(d)) => d,
            (Mode::CheckThenAct, None) => CHECK_THEN_ACT_DELAY,
            (Mode::Naive, None) => Duration::ZERO,
        };
        let (listener, bound) = http_server::bind(self.listen).await?;
        tracing::info!(listen = %bound, mode = ?self.mode, delay = %idem_core::duration_text(delay),
            lose_first_answer = self.lose_first_answer,
            "sample upstream (NOT idempotent): POST/GET /v1/payments, GET/PATCH /v1/payments/{{id}}");
        let shutdown = shutdown::on_signal();
        let upstream = if self.lose_first_answer {
            Upstream::losing_first_answers(self.mode, delay)
        } else {
            Upstream::new(self.mode, delay)
        };
        let app = app(upstream);
        http_server::serve(listener, app, Limits::default(), stopped(shutdown)).await;
        Ok(())
    }
}

/// The sample upstream inside the server's frame (`/healthz`, every error
/// as problem+json; no admin token, so no admin routes).
pub fn app(upstream: Upstream) -> Router {
    idem_demo::upstream::app(upstream, |routes| {
        crate::routes::service(
            routes,
            crate::admin::Auth::new(None, Default::default(), Default::default()),
            None,
        )
    })
}
