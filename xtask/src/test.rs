//! `cargo xtask test`: provisions the servers, runs the suite, the doc
//! tests, the OTLP build's tests and the fuzz targets, and ends with one
//! verdict line.

use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::Ordering;

use crate::fuzz::{FUZZ_TARGETS, fuzz_secs_in_test, fuzz_targets};
use crate::servers::{Postgres, start_nats, sweep};
use crate::shell::{INTERRUPTED, Result, catch_interrupts, run, run_quoting};
use crate::tools::{browser_packages, chromium_binary, libfaketime, nats_binary, venv};

/// The real clients the tests drive (`IDEM_TEST_PYTHON`): for the gateway,
/// requests with urllib3's `Retry` and Stripe's own library; for webhooks,
/// the providers' signing libraries (Svix's, Standard Webhooks', Slack's
/// SDK). Pinned, so a run tests the clients a previous one did.
pub(crate) const CLIENT_PACKAGES: &[&str] = &[
    "requests==2.34.2",
    "urllib3==2.8.0",
    "stripe==16.1.0",
    "svix==2.9.1",
    "standardwebhooks==1.3.0",
    "slack_sdk==3.48.0",
];

/// `cargo xtask test [nextest args]`. Whatever happens, its last line is one
/// verdict: `verdict: PASS (…)` or `verdict: FAIL (…)`, naming each part.
pub(crate) fn test(extra: &[String]) -> ExitCode {
    if extra.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "usage: cargo xtask test [nextest args]\n\n\
             Other arguments go to `cargo nextest run` (e.g. -E 'test(/webhook/)')."
        );
        return ExitCode::SUCCESS;
    }
    let parts = suite(extra).unwrap_or_else(|e| vec![Part::failed("setup", e)]);
    let passed = parts.iter().all(|p| p.passed);
    let said: Vec<String> = parts.iter().map(Part::to_string).collect();
    println!(
        "verdict: {} ({})",
        if passed { "PASS" } else { "FAIL" },
        said.join("; ")
    );
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// What the verdict says when a filtered run selected no test.
fn no_match(extra: &[String]) -> String {
    format!(
        "no test matched the filter {} (filters are substrings of test names; \
         a crate: -E 'package(NAME)')",
        extra.join(" ")
    )
}

/// One part of the run, as the verdict names it.
struct Part {
    name: &'static str,
    passed: bool,
    said: String,
}

impl Part {
    fn of(name: &'static str, result: Result<()>, summary: Option<String>) -> Self {
        match result {
            Ok(()) => Self {
                name,
                passed: true,
                said: summary.unwrap_or_else(|| "ok".into()),
            },
            Err(e) => Self::failed(name, summary.unwrap_or(e)),
        }
    }

    fn failed(name: &'static str, said: String) -> Self {
        Self {
            name,
            passed: false,
            said,
        }
    }

    fn skipped(name: &'static str, why: &str) -> Self {
        Self {
            name,
            passed: true,
            said: format!("skipped, {why}"),
        }
    }
}

impl std::fmt::Display for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mark = if self.passed { "" } else { "FAILED " };
        write!(f, "{}: {mark}{}", self.name, self.said)
    }
}

/// Provisions, runs every part, stops the servers; an error is a failure
/// to provision.
fn suite(extra: &[String]) -> Result<Vec<Part>> {
    // Checked before the suite, not after six minutes of it.
    let fuzz_secs = fuzz_secs_in_test()?;
    catch_interrupts();
    let root = std::env::temp_dir().join("idem-xtask");
    sweep(&root);
    let pg = Postgres::start(&root)?;
    eprintln!("xtask: PostgreSQL 15 on 127.0.0.1:{}", pg.port);
    let nats_bin = nats_binary()?;
    let nats = start_nats(&root, &nats_bin)?;
    eprintln!("xtask: nats-server with JetStream on {}", nats.url());
    let have_nextest = Command::new("cargo")
        .args(["nextest", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    let chromium = chromium_binary()?;
    let faketime = libfaketime()?;
    browser_packages()?;
    let python = venv("test-clients", CLIENT_PACKAGES, "the real HTTP clients")?;
    let mut cmd = Command::new("cargo");
    if have_nextest {
        cmd.args(["nextest", "run", "--workspace", "--no-fail-fast"]);
    } else {
        cmd.args(["test", "--workspace", "--no-fail-fast"]);
    }
    cmd.args(extra)
        .env("IDEM_TEST_POSTGRES_URL", pg.url())
        .env("IDEM_TEST_NATS_URL", nats.url())
        .env("IDEM_TEST_NATS_SERVER", &nats_bin)
        .env("IDEM_TEST_CHROMIUM", &chromium)
        .env("IDEM_TEST_PYTHON", &python)
        .env("IDEM_TEST_LIBFAKETIME", &faketime);
    // nextest's last line says how many tests ran, passed, failed.
    let (result, summary) = run_quoting(
        &mut cmd,
        if have_nextest {
            " run: "
        } else {
            "test result:"
        },
    );
    let runner = if have_nextest {
        "nextest"
    } else {
        "cargo test"
    };
    let mut parts = vec![match summary {
        // nextest refuses a run that selects nothing; say why in plain words.
        Some(s) if !extra.is_empty() && s.contains(" 0 tests run:") => {
            Part::failed(runner, no_match(extra))
        }
        summary => Part::of(runner, result, summary),
    }];
    if INTERRUPTED.load(Ordering::SeqCst) {
        parts.push(Part::failed("run", "interrupted; servers stopped".into()));
        return Ok(parts);
    }
    if !extra.is_empty() {
        // A filtered run is a developer's loop: the doc tests and the fuzz
        // targets belong to the whole suite.
        parts.push(Part::skipped(
            "readme app, doc tests, otlp, fuzz",
            "filtered run",
        ));
        return Ok(parts);
    }
    // The README's library section, literally, in a new project.
    let root = crate::shell::workspace_root();
    parts.push(match crate::readme_app::readme_app(&root) {
        Ok(said) => Part::of("readme app", Ok(()), Some(said)),
        Err(e) => Part::failed("readme app", e),
    });
    // Doc tests are not run by nextest.
    if have_nextest {
        let docs = run(Command::new("cargo").args(["test", "--workspace", "--doc"]));
        parts.push(Part::of("doc tests", docs, None));
    }
    // The trace exporter is a feature of its own: its tests need a build
    // with it (and the plain build tests that it is refused without).
    let otlp = run(Command::new("cargo")
        .args([
            "test",
            "-p",
            "idem-server",
            "--features",
            "otlp",
            "--test",
            "it",
            "otlp",
        ])
        .env("IDEM_TEST_POSTGRES_URL", pg.url())
        .env("IDEM_TEST_NATS_URL", nats.url())
        .env("IDEM_TEST_NATS_SERVER", &nats_bin));
    parts.push(Part::of("otlp", otlp, None));
    drop(nats);
    drop(pg);
    parts.push(match fuzz_secs {
        0 => Part::skipped("fuzz", "XTASK_FUZZ_SECS=0"),
        secs => Part::of(
            "fuzz",
            fuzz_targets(FUZZ_TARGETS, secs),
            Some(format!("{} targets, {secs} s each", FUZZ_TARGETS.len())),
        ),
    });
    Ok(parts)
}
