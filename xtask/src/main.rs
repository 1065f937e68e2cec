//! Developer commands: `cargo xtask test` provisions a throwaway PostgreSQL 15
//! and a NATS server with JetStream on loopback (installing the Debian packages
//! `postgresql-15`, `nats-server`, `chromium` and `libfaketime` when root
//! and they are missing, and the browser tests' npm packages with `npm ci`),
//! runs the whole test suite against them, stops them, and runs each fuzz
//! target briefly; `cargo xtask test --quick` runs only the tests that need
//! nothing but Rust, provisioning nothing. `cargo xtask fuzz [TARGET] [--secs N]` runs the fuzz targets of
//! `fuzz/` for longer. `cargo xtask docs-sync [--fix]` checks (or rewrites)
//! the README's and docs' code blocks that include an example file;
//! `cargo xtask readme-app` builds the README's library example as a new
//! project (also part of `test`). `cargo xtask layout` checks the code's
//! shape (sizes, macros, import circles).

mod bench;
mod docs_sync;
mod fuzz;
mod layout;
mod part;
mod quick;
mod readme_app;
mod servers;
mod shell;
mod test;
mod tools;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  test [nextest args]      provision PostgreSQL 15, NATS, chromium, libfaketime and the npm packages
                           of the browser tests, run the whole suite (tests, browser tests,
                           doc tests, 20 s per fuzz target), stop them; with nextest args (a filter),
                           only those tests
  test --quick             only the tests that need nothing but Rust (SQLite, in-process): nothing
                           provisioned, a few minutes on two cores; the verdict names what it left out
  bench [idem bench args]  the same servers, pgbench, wrk, perf, a Redis and a Python venv for
                           the Powertools peer, then `idem bench` in release mode (5 s a case)
  fuzz [TARGET] [--secs N] run the fuzz targets of fuzz/ (every target, 180 s each, by default)
  docs-sync [--fix]        check that README.md's and docs/*.md's example blocks (a line
                           `<!-- example: PATH[#anchor] -->` before a fence) equal their files;
                           with --fix, rewrite the stale ones
  readme-app               build README.md's library example as a new project outside the workspace
                           (its dependencies resolved afresh), run it, check one order per key
  layout                   check the code's shape: no trait or function written by a macro_rules! in
                           the SQL crates, their macros under 5 % of idem-sql, each SQL backend's src
                           at most 1500 lines, idem-server's src at most 6000 (files 400), library
                           files at most 700, no two modules importing each other (--help: exactly
                           what counts)
  help                     this text";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("test") => return test::test(&args[1..]),
        Some("bench") => bench::bench(&args[1..]),
        Some("fuzz") => fuzz::fuzz(&args[1..]),
        Some("docs-sync") => docs_sync::run(&args[1..], &shell::workspace_root()),
        Some("readme-app") => readme_app::run_cli(&args[1..]),
        Some("layout") => layout::run(&args[1..], &shell::workspace_root()),
        Some("help" | "--help" | "-h") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some(other) => Err(format!("unknown command {other:?}\n\n{USAGE}")),
        None => Err(USAGE.into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}
