//! `idem mail-sink`: the demo mail relay of the checkout tour.

use std::net::SocketAddr;

use crate::flags as config;
use crate::shutdown::{self, stopped};
use idem_demo::mail_sink::{Sink, router};
use idem_httpd::{self as http_server, Limits};

/// `idem mail-sink`'s flags.
#[derive(clap::Args)]
pub struct MailSinkArgs {
    /// Address to listen on (IP:PORT or HOST:PORT).
    #[arg(long, env = "IDEM_MAIL_SINK_LISTEN", default_value = "127.0.0.1:8025", value_parser = config::listen_address)]
    listen: SocketAddr,
    /// How long a request's body may take to arrive whole (1s to 1h); a
    /// message whose client stalls longer is dropped with 408, never
    /// accepted late.
    #[arg(long, env = "IDEM_MAIL_SINK_BODY_READ_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    body_read_timeout: std::time::Duration,
}

impl MailSinkArgs {
    /// Serves until Ctrl-C or SIGTERM.
    pub async fn run(self) -> anyhow::Result<()> {
        let limits = Limits {
            body_read_timeout: self.body_read_timeout,
            ..Limits::default()
        };
        limits.validate(1 << 20).map_err(anyhow::Error::msg)?;
        let (listener, bound) = http_server::bind(self.listen).await?;
        let app = crate::routes::service(
            router(Sink::default()),
            crate::admin::Auth::new(None, Default::default(), Default::default()),
            None,
        );
        tracing::info!(listen = %bound, "demo mail relay: POST /messages, GET /messages/{{id}}, GET /messages");
        let shutdown = shutdown::on_signal();
        http_server::serve(listener, app, limits, stopped(shutdown)).await;
        Ok(())
    }
}
