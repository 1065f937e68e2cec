//! One module per command of the `idem` binary. Each holds its flags (a
//! `clap::Args`) and its `run`; what needs a store is a [`Job`] that
//! [`Db::run`] hands the backend to.
//!
//! [`Job`]: crate::backend::Job
//! [`Db::run`]: crate::backend::Db::run

use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

pub mod bench;
pub mod consume;
pub mod gc;
pub mod migrate;
pub mod relay;
pub mod serve;
pub mod stats;
pub mod webhooks;

/// The command line.
#[derive(Parser)]
#[command(name = "idem", version, about = "Make duplicate delivery harmless")]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Settings of `idem serve` the `[server]` table of `--config` may not hold:
/// the file itself, and help.
const NOT_IN_FILE: &[&str] = &["config", "help"];

impl Cli {
    /// Parses the command line (exiting on `--help` and on bad flags). For
    /// `idem serve --config FILE`, the settings in the file's `[server]`
    /// table become the flags' defaults first, so the order of precedence
    /// is: flags, environment, file, built-in defaults.
    pub fn load() -> anyhow::Result<Cli> {
        let matches = Cli::command().get_matches();
        let path = matches
            .subcommand_matches("serve")
            .and_then(|m| m.get_one::<std::path::PathBuf>("config"));
        let Some(path) = path else {
            return Ok(Cli::from_arg_matches(&matches)?);
        };
        let serve = Cli::command();
        let settings: Vec<&str> = serve
            .find_subcommand("serve")
            .into_iter()
            .flat_map(|c| c.get_arguments())
            .map(|a| a.get_id().as_str())
            .filter(|id| !NOT_IN_FILE.contains(id))
            .collect();
        let text = crate::config::read_file(path)?;
        let defaults = crate::config::file_defaults(&text, &settings)
            .map_err(|e| anyhow::anyhow!("invalid configuration in {}: {e:#}", path.display()))?;
        let command = Cli::command().mut_subcommand("serve", |mut c| {
            for (id, value) in defaults {
                // Parsed once per run: the default must outlive the parser.
                let value: &'static str = Box::leak(value.into_boxed_str());
                c = c.mut_arg(id, |a| a.default_value(value));
            }
            c
        });
        // The command line parsed once without the file's values, so an
        // error now is one of them: say so, and where.
        let matches = command.try_get_matches().map_err(|e| {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            anyhow::anyhow!(
                "invalid configuration in {} ([server]): {}",
                path.display(),
                first.strip_prefix("error: ").unwrap_or(first)
            )
        })?;
        let mut cli = Cli::from_arg_matches(&matches)?;
        // The webhook tables come from the same read: a file edited in
        // between cannot give the server one version and the webhooks another.
        if let Command::Serve(args) = &mut cli.command {
            args.file_text = Some(text);
        }
        Ok(cli)
    }
}

/// The commands.
#[derive(Subcommand)]
pub enum Command {
    /// Serve the demo payments API.
    Serve(Box<serve::ServeArgs>),
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
    /// Delete expired key, inbox and receipt records and old sent outbox
    /// messages once, and print how many of each.
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
    /// `sqlite://PATH` or `postgres://…`. `serve` and `migrate` create a
    /// missing SQLite file; the other commands refuse one.
    #[arg(long, env = "IDEM_DATABASE_URL", default_value = "sqlite://idem.db")]
    pub database_url: String,
}

/// The ledger consumer's flags (`idem consume`, `idem serve --consume`).
#[derive(clap::Args)]
pub struct ConsumerArgs {
    /// Redelivery of an unacknowledged event after this long (1s to 12h).
    #[arg(long, env = "IDEM_ACK_WAIT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub ack_wait: Duration,
    /// Deliveries before an event that keeps failing is dead-lettered (1 to 100).
    #[arg(long, env = "IDEM_MAX_DELIVER", default_value_t = 5)]
    pub max_deliver: u32,
}
