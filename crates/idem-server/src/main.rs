//! `idem`: the Idem server.
//!
//! - `idem serve` — the demo payments API on the Idem HTTP layer, with
//!   periodic GC of expired key records; with `--nats-url`, payment events go
//!   through the outbox to NATS (and with `--consume`, into the ledger).
//! - `idem relay` — the outbox relay alone; `idem consume` — the ledger
//!   consumer alone.
//! - `idem migrate`, `idem gc`, `idem stats`, `idem webhooks`, `idem bench`.
//!
//! This file parses and dispatches; each command is a module of
//! [`idem_server::commands`].

use std::process::ExitCode;

use idem_server::commands::Cli;

/// mimalloc instead of the system's allocator: a request allocates some
/// hundred small blocks, and glibc's malloc and free took a fifth of the
/// server's instructions per request (callgrind, `idem serve` on
/// PostgreSQL); mimalloc's thread-local free lists take a fraction of it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = match Cli::load() {
        Ok(cli) => cli,
        Err(e) => {
            eprintln!("error: {}", idem_core::ErrorChain(e.as_ref()));
            return ExitCode::FAILURE;
        }
    };
    let _logs = match idem_server::logging::init(cli.log_format, cli.otlp_endpoint.as_deref()) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("error: {}", idem_core::ErrorChain(e.as_ref()));
            return ExitCode::FAILURE;
        }
    };
    let threads = match idem_server::flags::worker_threads(std::env::var_os("TOKIO_WORKER_THREADS"))
    {
        Ok(threads) => threads,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        builder.worker_threads(n);
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: failed to start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli.command.run()) {
        Ok(()) => ExitCode::SUCCESS,
        // One line, whatever RUST_BACKTRACE says: these are the operator's
        // errors (a bad flag, an unreachable database), not the program's.
        Err(e) => match e.downcast_ref::<idem_server::commands::Exit>() {
            Some(exit) => {
                if let Some(message) = &exit.message {
                    eprintln!("{message}");
                }
                ExitCode::from(exit.code)
            }
            None => {
                eprintln!("error: {}", idem_core::ErrorChain(e.as_ref()));
                ExitCode::FAILURE
            }
        },
    }
}
