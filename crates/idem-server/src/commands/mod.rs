//! One module per command of the `idem` binary. Each holds its flags (a
//! `clap::Args`) and its `run`; what needs a store is a [`Job`] that
//! [`Db::run`] hands the backend to.
//!
//! [`Job`]: crate::backend::Job
//! [`Db::run`]: crate::backend::Db::run

use std::time::Duration;

use clap::Subcommand;

pub mod bench;
pub mod consume;
pub mod gc;
pub mod migrate;
pub mod relay;
pub mod serve;
pub mod stats;
pub mod webhooks;

/// The commands.
#[derive(Subcommand)]
pub enum Command {
    /// Serve the demo payments API.
    Serve(serve::ServeArgs),
    /// Inspect and replay stored webhook deliveries.
    Webhooks {
        #[command(subcommand)]
        action: webhooks::WebhookAction,
    },
    /// Relay the outbox to NATS JetStream (one per SQLite file; any number on PostgreSQL).
    Relay(relay::RelayArgs),
    /// Apply payment events to the ledger through the inbox.
    Consume(consume::ConsumeArgs),
    /// Apply migrations and exit.
    Migrate(DbArgs),
    /// Benchmark against plain baselines (prints markdown tables).
    Bench(bench::BenchArgs),
    /// Delete expired key records once and print how many.
    Gc(DbArgs),
    /// Print the outbox lag figures as JSON.
    Stats(DbArgs),
}

impl Command {
    /// Runs the command to its end.
    pub async fn run(self) -> anyhow::Result<()> {
        match self {
            Command::Serve(args) => args.run().await,
            Command::Webhooks { action } => action.run().await,
            Command::Relay(args) => args.run().await,
            Command::Consume(args) => args.run().await,
            Command::Migrate(db) => migrate::run(db).await,
            Command::Bench(args) => args.run().await,
            Command::Gc(db) => gc::run(db).await,
            Command::Stats(db) => stats::run(db).await,
        }
    }
}

/// `--database-url`.
#[derive(clap::Args)]
pub struct DbArgs {
    /// `sqlite://PATH` (the file is created if missing) or `postgres://…`.
    #[arg(long, env = "IDEM_DATABASE_URL", default_value = "sqlite://idem.db")]
    pub database_url: String,
}

/// The ledger consumer's flags (`idem consume`, `idem serve --consume`).
#[derive(clap::Args)]
pub struct ConsumerArgs {
    /// Redelivery of an unacknowledged event after this long.
    #[arg(long, env = "IDEM_ACK_WAIT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub ack_wait: Duration,
    /// Deliveries before an event that keeps failing is dead-lettered (1 to 100).
    #[arg(long, env = "IDEM_MAX_DELIVER", default_value_t = 5)]
    pub max_deliver: u32,
}
