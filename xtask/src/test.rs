//! `cargo xtask test`: provisions the servers, runs the suite, the doc
//! tests, the OTLP build's tests and the fuzz targets, and ends with one
//! verdict line.

use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;

use crate::fuzz::{FUZZ_TARGETS, fuzz_secs_in_test, fuzz_targets};
use crate::servers::{Postgres, start_nats, sweep};
use crate::shell::{INTERRUPTED, Result, catch_interrupts, run};
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

pub(crate) fn test(extra: &[String]) -> Result<()> {
    if extra.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "usage: cargo xtask test [nextest args]\n\nOther arguments go to `cargo nextest run` (e.g. -E 'test(/webhook/)')."
        );
        return Ok(());
    }
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
    let result = run(&mut cmd);
    if !extra.is_empty() || INTERRUPTED.load(Ordering::SeqCst) {
        // A filtered run is a developer's loop: the doc tests and the fuzz
        // targets belong to the whole suite. An interrupted one stops here.
        if !INTERRUPTED.load(Ordering::SeqCst) {
            eprintln!("xtask: filtered run; doc tests and fuzzing skipped");
        }
        drop(nats);
        drop(pg);
        return result;
    }
    // Doc tests are not run by nextest.
    let docs = if have_nextest {
        run(Command::new("cargo").args(["test", "--workspace", "--doc"]))
    } else {
        Ok(())
    };
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
    drop(nats);
    drop(pg);
    let fuzzing = match fuzz_secs {
        0 => Ok(()),
        secs => fuzz_targets(FUZZ_TARGETS, secs),
    };
    result.and(docs).and(otlp).and(fuzzing)
}
