//! One module per command of the `idem` binary. Each holds its flags (a
//! `clap::Args`) and its `run`; what needs a store is a [`Job`] that
//! [`Db::run`] hands the backend to.
//!
//! [`Job`]: crate::backend::Job
//! [`Db::run`]: crate::backend::Db::run

use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

pub mod bench;
pub mod checkout;
pub mod consume;
pub mod drill;
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

/// An error that chooses the process's exit status (`idem drill`: 1 when
/// a drill failed, 2 for bad usage), with the message to print, if any.
#[derive(Debug)]
pub struct Exit {
    /// The exit status.
    pub code: u8,
    /// Printed on stderr as is; `None` when everything was said.
    pub message: Option<String>,
}

impl Exit {
    /// Exit with `code` after printing `message`.
    pub fn new(code: u8, message: String) -> Self {
        Self {
            code,
            message: Some(message),
        }
    }

    /// Exit with `code`, printing nothing more.
    pub fn silent(code: u8) -> Self {
        Self {
            code,
            message: None,
        }
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.message {
            Some(m) => f.write_str(m),
            None => write!(f, "exit status {}", self.code),
        }
    }
}

impl std::error::Error for Exit {}

/// `--database-url`.
#[derive(clap::Args)]
pub struct DbArgs {
    /// `sqlite://PATH` or `postgres://…`. `serve` and `migrate` create a
    /// missing SQLite file; the other commands refuse one.
    #[arg(long, env = "IDEM_DATABASE_URL", default_value = "sqlite://idem.db")]
    pub database_url: String,
    /// Connections in the database pool (1 to 1000; default 16 on
    /// PostgreSQL, 8 on SQLite). On PostgreSQL `idem serve` opens up to
    /// three times this many sessions (the pool, the key transactions, their
    /// read-first step), the other commands up to this many.
    #[arg(long, env = "IDEM_DATABASE_POOL", value_parser = clap::value_parser!(u32).range(1..=1000))]
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

/// How Idem creates its streams (`idem serve`, `idem relay`, `idem consume`).
#[derive(clap::Args, Clone, Copy)]
pub struct StreamArgs {
    /// Copies of each stream Idem creates: 1 on a single NATS server, 3 in
    /// a three-node JetStream cluster (a stream, its duplicate window and
    /// its consumers then survive the loss of a node). Applied when a
    /// stream is created; an existing stream keeps its own (1 to 5).
    #[arg(long, env = "IDEM_NATS_REPLICAS", default_value_t = 1)]
    pub nats_replicas: usize,
}

/// The side listener of `idem relay` and `idem consume` (`/healthz`,
/// `/readyz`, `/metrics`).
#[derive(clap::Args)]
pub struct SideArgs {
    /// Serve `/healthz` (liveness), `/readyz` (database and NATS
    /// reachable) and `/metrics` on this address (IP:PORT). Without it the
    /// process listens on nothing.
    #[arg(long, env = "IDEM_METRICS_LISTEN", value_parser = crate::flags::listen_address)]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The token `/metrics` there needs (as `idem serve`'s admin token);
    /// required when --metrics-listen is not a loopback address, unless
    /// --public-metrics.
    #[arg(long, env = "IDEM_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Serve `/metrics` there without the token.
    #[arg(long, env = "IDEM_PUBLIC_METRICS", num_args = 0..=1, default_value_t = false,
          default_missing_value = "true", action = clap::ArgAction::Set)]
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
    #[arg(long, env = "IDEM_ACK_WAIT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub ack_wait: Duration,
    /// Deliveries before an event that keeps failing is dead-lettered (1 to 100).
    #[arg(long, env = "IDEM_MAX_DELIVER", default_value_t = 5)]
    pub max_deliver: u32,
}
