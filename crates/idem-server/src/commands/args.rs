//! Flags several commands share: the database, the streams, the side
//! listener of `idem relay` and `idem consume`, the ledger consumer.

use std::time::Duration;

/// `--database-url`.
#[derive(clap::Args)]
pub struct DbArgs {
    /// `sqlite://PATH` or `postgres://…`. `serve` and `migrate` create a
    /// missing SQLite file; the other commands refuse one.
    #[arg(
        long,
        env = "IDEM_DATABASE_URL",
        default_value = "sqlite://idem.db",
        help_heading = "Database"
    )]
    pub database_url: String,
    /// Connections in the database pool (1 to 1000; default 16 on
    /// PostgreSQL, 8 on SQLite). On PostgreSQL `idem serve` opens up to
    /// three times this many sessions (the pool, the key transactions, their
    /// read-first step), the other commands up to this many.
    #[arg(long, env = "IDEM_DATABASE_POOL", value_parser = clap::value_parser!(u32).range(1..=1000), help_heading = "Database")]
    pub database_pool: Option<u32>,
}

impl DbArgs {
    /// [`Db::open`](crate::backend::Db::open) with these settings.
    pub async fn open(&self) -> anyhow::Result<crate::backend::Db> {
        crate::backend::Db::open_with(&self.database_url, self.database_pool).await
    }

    /// [`Db::open_existing`](crate::backend::Db::open_existing) with these settings.
    pub async fn open_existing(&self) -> anyhow::Result<crate::backend::Db> {
        crate::backend::Db::open_existing_with(&self.database_url, self.database_pool).await
    }
}

/// The broker (`idem serve`, `idem relay`, `idem consume`).
#[derive(clap::Args, Clone)]
pub struct BrokerArgs {
    /// The broker events go through: nats://HOST:4222 (NATS JetStream; a
    /// comma-separated list for a cluster), amqp://USER:PASS@HOST:5672/VHOST
    /// or amqps://… (RabbitMQ), kafka://HOST:9092[,HOST:9092] (Kafka).
    /// `--nats-url` and IDEM_NATS_URL are older names of it.
    #[arg(
        long = "broker-url",
        visible_alias = "nats-url",
        env = "IDEM_BROKER_URL",
        help_heading = "Events"
    )]
    pub broker_url: Option<String>,
}

impl BrokerArgs {
    /// The broker, checked; `IDEM_NATS_URL` when neither the flag nor
    /// `IDEM_BROKER_URL` is set.
    pub fn url(&self) -> anyhow::Result<Option<crate::messaging::BrokerUrl>> {
        let url = self
            .broker_url
            .clone()
            .or_else(|| std::env::var("IDEM_NATS_URL").ok());
        url.map(|u| crate::messaging::parse_url(&u, "--broker-url"))
            .transpose()
    }

    /// The broker, which this command cannot run without.
    pub fn required(&self) -> anyhow::Result<crate::messaging::BrokerUrl> {
        self.url()?
            .ok_or_else(|| anyhow::anyhow!("--broker-url (or IDEM_BROKER_URL) is required"))
    }
}

/// How Idem creates its streams (`idem serve`, `idem relay`, `idem consume`).
#[derive(clap::Args, Clone, Copy)]
pub struct StreamArgs {
    /// Copies of each stream Idem creates: 1 on a single NATS server, 3 in
    /// a three-node JetStream cluster (a stream, its duplicate window and
    /// its consumers then survive the loss of a node). Applied when a
    /// stream is created; an existing stream keeps its own (1 to 5).
    #[arg(
        long,
        env = "IDEM_NATS_REPLICAS",
        default_value_t = 1,
        help_heading = "Events"
    )]
    pub nats_replicas: usize,
}

/// The side listener of `idem relay` and `idem consume` (`/healthz`,
/// `/readyz`, `/metrics`).
#[derive(clap::Args)]
pub struct SideArgs {
    /// Serve `/healthz` (liveness), `/readyz` (database and NATS
    /// reachable) and `/metrics` on this address (IP:PORT). Without it the
    /// process listens on nothing.
    #[arg(long, env = "IDEM_METRICS_LISTEN", value_parser = crate::flags::listen_address,
          help_heading = "Listening")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The token `/metrics` there needs (as `idem serve`'s admin token);
    /// required when --metrics-listen is not a loopback address, unless
    /// --public-metrics.
    #[arg(
        long,
        env = "IDEM_ADMIN_TOKEN",
        hide_env_values = true,
        help_heading = "Admin"
    )]
    pub admin_token: Option<String>,
    /// Serve `/metrics` there without the token.
    #[arg(long, env = "IDEM_PUBLIC_METRICS", num_args = 0..=1, default_value_t = false,
          default_missing_value = "true", action = clap::ArgAction::Set, help_heading = "Admin")]
    pub public_metrics: bool,
}

impl SideArgs {
    /// Validated.
    pub fn listener(&self) -> anyhow::Result<Option<crate::probe::SideListener>> {
        crate::probe::SideListener::from_flags(
            self.metrics_listen,
            self.admin_token.as_deref(),
            self.public_metrics,
        )
    }
}

/// The ledger consumer's flags (`idem consume`, `idem serve --consume`).
#[derive(clap::Args)]
pub struct ConsumerArgs {
    /// Redelivery of an unacknowledged event after this long (1s to 12h).
    #[arg(long, env = "IDEM_ACK_WAIT", default_value = "30s", value_parser = humantime::parse_duration, help_heading = "Events")]
    pub ack_wait: Duration,
    /// Deliveries before an event that keeps failing is dead-lettered (1 to 100).
    #[arg(
        long,
        env = "IDEM_MAX_DELIVER",
        default_value_t = 5,
        help_heading = "Events"
    )]
    pub max_deliver: u32,
}
