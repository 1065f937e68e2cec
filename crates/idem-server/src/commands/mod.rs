//! One module per command of the `idem` binary. Each holds its flags (a
//! `clap::Args`) and its `run`; what needs a store is a [`Job`] that
//! [`Db::run`] hands the backend to.
//!
//! [`Job`]: crate::backend::Job
//! [`Db::run`]: crate::backend::Db::run

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

mod args;
pub mod bench;
pub mod checkout;
pub mod consume;
pub mod drill;
mod exit;
pub mod gc;
pub mod keys;
pub mod mail_sink;
pub mod migrate;
pub mod relay;
pub mod serve;
pub mod stats;
pub mod steps;
pub mod tasks;
pub mod upstream;
pub mod webhooks;

pub use args::{ConsumerArgs, DbArgs, SideArgs, StreamArgs};
pub use exit::Exit;

/// The command line.
#[derive(Parser)]
#[command(name = "idem", version, about = "Make duplicate delivery harmless")]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
    /// Log lines as `text` (colours on a terminal) or `json` (one object
    /// per line).
    #[arg(
        long,
        global = true,
        env = "IDEM_LOG_FORMAT",
        value_enum,
        default_value_t
    )]
    pub log_format: crate::logging::LogFormat,
    /// Send traces (a span per request and per message) to this
    /// OpenTelemetry collector over OTLP/HTTP (`http://HOST:4318`; the path
    /// `/v1/traces` is added when none is given). Needs a build with the
    /// `otlp` feature.
    #[arg(long, global = true, env = "IDEM_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

/// Settings of `idem serve` the `[server]` table of `--config` may not hold:
/// the file itself, help, and the benchmark's route (a flag to type each
/// time, never a setting left behind).
const NOT_IN_FILE: &[&str] = &["config", "help", "bench_routes"];

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
        let text = crate::flags::read_file(path)?;
        let defaults = crate::flags::file_defaults(&text, &settings)
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
    /// Serve the demo payments API, or (with --upstream) the gateway in
    /// front of another API.
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
    /// Inspect, resolve and recover multi-step runs (the checkout's orders).
    Steps {
        #[command(subcommand)]
        action: steps::StepsAction,
    },
    /// Inspect polling agents' tasks; retry dead ones, resolve actions
    /// whose outcome was unknown.
    Tasks {
        #[command(subcommand)]
        action: tasks::TasksAction,
    },
    /// Run the demo mail relay (no deduplication) for the checkout tour.
    MailSink(mail_sink::MailSinkArgs),
    /// Show a key's record, and resolve a gateway forward whose outcome is
    /// unknown.
    Keys {
        #[command(subcommand)]
        action: keys::KeysAction,
    },
    /// Check an HTTP API's Idempotency-Key support with failure drills.
    #[command(after_help = drill::drills_help())]
    Drill(Box<drill::DrillArgs>),
    /// Serve a sample payments API that is NOT idempotent (a test and tour tool).
    #[command(
        long_about = "Serve a sample payments API that is deliberately NOT idempotent, in memory: \
    a test and tour tool for `idem drill` and the gateway, never a real service.\n\n\
    Routes: POST /v1/payments (any JSON object; 201 {id, ...fields}), \
    GET /v1/payments?customer=X or ?reference=R ({\"data\":[...]}), GET and PATCH /v1/payments/{id}, \
    GET /_upstream/stats ({\"requests\":N,\"payments\":M}), GET /healthz.\n\n\
    --mode naive ignores Idempotency-Key: every POST is a new payment. \
    --mode check-then-act looks the key up, waits --delay, creates the payment and stores the \
    answer under the key: a later retry is replayed (Idempotent-Replayed: true), concurrent \
    requests with one key each create a payment.\n\n\
    Bounds: bodies up to 1 MiB (413 above); at most 1,000,000 payments and 256 MiB of them \
    (507 upstream-full above; nothing is dropped)."
    )]
    Upstream(upstream::UpstreamArgs),
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
            Command::Steps { action } => action.run().await,
            Command::Tasks { action } => action.run().await,
            Command::MailSink(args) => args.run().await,
            Command::Keys { action } => action.run().await,
            Command::Drill(args) => args.run().await,
            Command::Upstream(args) => args.run().await,
        }
    }
}
