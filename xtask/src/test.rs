//! `cargo xtask test`: provisions the servers, runs the suite, the doc
//! tests, the OTLP build's tests and the fuzz targets, and ends with one
//! verdict line.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::fuzz::{FUZZ_TARGETS, fuzz_secs_in_test, fuzz_targets};
use crate::part::Part;
use crate::servers::{Postgres, Server, start_nats, start_tansu, sweep};
use crate::shell::{Beside, INTERRUPTED, Result, catch_interrupts, run, run_quoting};
use crate::tools::{
    browser_packages, chromium_binary, libfaketime, nats_binary, postgres_bindir, rabbitmq_server,
    tansu_binary, venv,
};

/// The real clients the tests drive (`IDEM_TEST_PYTHON`): for the gateway,
/// requests with urllib3's `Retry` and Stripe's own library; for webhooks,
/// the providers' signing libraries (Svix's, Standard Webhooks', Slack's
/// SDK); for Kafka, Confluent's client (it bundles its own librdkafka).
/// Pinned, so a run tests the clients a previous one did.
pub(crate) const CLIENT_PACKAGES: &[&str] = &[
    "requests==2.34.2",
    "urllib3==2.8.0",
    "stripe==16.1.0",
    "svix==2.9.1",
    "standardwebhooks==1.3.0",
    "slack_sdk==3.48.0",
    "confluent-kafka==2.16.1",
    "pika==1.3.2",
];

/// `cargo xtask test [nextest args]`. Whatever happens, its last line is one
/// verdict: `verdict: PASS (…)` or `verdict: FAIL (…)`, naming each part.
pub(crate) fn test(extra: &[String]) -> ExitCode {
    if extra.iter().any(|a| a == "--help" || a == "-h") {
        println!("{HELP}");
        return ExitCode::SUCCESS;
    }
    let parts = match extra.iter().position(|a| a == "--quick") {
        Some(at) => {
            let mut rest = extra.to_vec();
            rest.remove(at);
            crate::quick::quick(&rest, have_nextest())
        }
        None => suite(extra).unwrap_or_else(|e| vec![Part::failed("setup", e)]),
    };
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

const HELP: &str = "\
usage: cargo xtask test [--quick] [nextest args]

  (no --quick)  provision PostgreSQL 15, NATS, Tansu (Kafka), chromium, libfaketime, the
                browser tests' npm packages and a Python venv of real clients; run the whole suite (tests,
                readme app, doc tests, otlp build, 20 s per fuzz target); stop them;
                3 tests at once per 2 processors (NEXTEST_TEST_THREADS overrides)
  --quick       nothing provisioned, nothing installed: only the tests that need nothing but
                Rust (SQLite files, servers in-process), without IDEM_TEST_* set; a few minutes
                on two cores. The verdict says how many ran and what was left out (the tests
                that need PostgreSQL, NATS, Kafka, Python, Chromium and Node, libfaketime, and the four
                over 30 s; doc tests, readme app, otlp, fuzz)

Other arguments go to `cargo nextest run` (e.g. -E 'test(/webhook/)'; with --quick they
narrow the quick set). Without cargo-nextest, `cargo test` runs instead.
The last line is one verdict: `verdict: PASS (…)` or `verdict: FAIL (…)`.";

/// Whether `cargo nextest` is installed.
fn have_nextest() -> bool {
    Command::new("cargo")
        .args(["nextest", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// What the verdict says when a filtered run selected no test.
fn no_match(extra: &[String]) -> String {
    format!(
        "no test matched the filter {} (filters are substrings of test names; \
         a crate: -E 'package(NAME)')",
        extra.join(" ")
    )
}

/// What the tests are run against: the servers (stopped when dropped) and
/// the tools, by path.
struct Provisioned {
    pg: Postgres,
    nats: Server,
    nats_bin: PathBuf,
    rabbitmq: PathBuf,
    tansu: Server,
    tansu_bin: PathBuf,
    chromium: PathBuf,
    faketime: PathBuf,
    python: PathBuf,
}

/// Starts the servers and finds the tools (found or installed before:
/// quick here). Run while the tests compile: it is mostly waiting (initdb,
/// npm, pip), the build mostly computing (a fresh clone's venv alone is
/// about 25 s).
fn provision(root: &Path) -> Result<Provisioned> {
    let pg = Postgres::start(root)?;
    eprintln!("xtask: PostgreSQL 15 on 127.0.0.1:{}", pg.port);
    let nats_bin = nats_binary()?;
    let nats = start_nats(root, &nats_bin)?;
    eprintln!("xtask: nats-server with JetStream on {}", nats.url());
    let rabbitmq = rabbitmq_server()?;
    let tansu_bin = tansu_binary()?;
    let tansu = start_tansu(root, &tansu_bin)?;
    eprintln!("xtask: tansu (Kafka protocol) on 127.0.0.1:{}", tansu.port);
    let chromium = chromium_binary()?;
    let faketime = libfaketime()?;
    browser_packages()?;
    let python = venv("test-clients", CLIENT_PACKAGES, "the real HTTP clients")?;
    Ok(Provisioned {
        pg,
        nats,
        nats_bin,
        rabbitmq,
        tansu,
        tansu_bin,
        chromium,
        faketime,
        python,
    })
}

/// The test command, nextest's or cargo's, with the arguments given.
fn test_command(have_nextest: bool, extra: &[String]) -> Command {
    let mut cmd = Command::new("cargo");
    if have_nextest {
        cmd.args(["nextest", "run", "--workspace", "--no-fail-fast"]);
    } else {
        cmd.args(["test", "--workspace", "--no-fail-fast"]);
    }
    cmd.args(extra);
    cmd
}

/// nextest's setting of how many tests run at once.
const TEST_THREADS: &str = "NEXTEST_TEST_THREADS";

/// Tests at once unless `NEXTEST_TEST_THREADS` says otherwise: half as many
/// again as processors (3 on two cores). Most tests spend their time
/// waiting on servers, timeouts and pauses (one per processor left them
/// about half idle); the fleet's history runs alone
/// (`.config/nextest.toml`).
fn test_threads() -> usize {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    n + n.div_ceil(2)
}

/// Builds what [`test_command`] without arguments runs, running nothing.
fn build_command(have_nextest: bool) -> Command {
    let mut cmd = Command::new("cargo");
    if have_nextest {
        cmd.args(["nextest", "run", "--workspace", "--no-run"]);
    } else {
        cmd.args(["test", "--workspace", "--no-run"]);
    }
    cmd
}

/// `XTASK_BACKGROUND_BUILDS=0` builds the README app and the fuzz targets
/// after the tests, as parts of their own, instead of beside them.
const BACKGROUND_BUILDS: &str = "XTASK_BACKGROUND_BUILDS";

/// Builds beside the tests, stopped by [`Background::finish`].
struct Background {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Background {
    /// Stops what is still building (the parts after the tests build the
    /// rest in their turn, at the usual priority, from what was finished:
    /// on a machine busy with other work a niced build may not have got far)
    /// and waits for it.
    fn finish(self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.thread.join();
    }
}

/// Starts building the README app and (with `fuzz`) the fuzz targets, niced,
/// their output in `target/xtask-background.log`; `None` when
/// `XTASK_BACKGROUND_BUILDS=0` or the log cannot be made.
fn background_builds(fuzz: bool) -> Option<Background> {
    if std::env::var(BACKGROUND_BUILDS).is_ok_and(|v| v == "0") {
        return None;
    }
    let root = crate::shell::workspace_root();
    let path = root.join("target/xtask-background.log");
    let log = std::fs::File::create(&path)
        .map_err(|e| eprintln!("xtask: no background builds ({}: {e})", path.display()))
        .ok()?;
    eprintln!(
        "xtask: building the README app{} beside the tests (nice 19; {BACKGROUND_BUILDS}=0 \
         not to), output in {}",
        if fuzz { " and the fuzz targets" } else { "" },
        path.display()
    );
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let beside = Beside {
                log: &log,
                stop: &stop,
            };
            let said = |what: &str, r: Result<()>| match r {
                Ok(()) => eprintln!("xtask: {what} built beside the tests"),
                Err(e) => eprintln!("xtask: {what} not built beside the tests ({e})"),
            };
            said(
                "the README app",
                crate::readme_app::prebuild(&root, &beside),
            );
            if fuzz {
                said("the fuzz targets", crate::fuzz::prebuild(&beside));
            }
        })
    };
    Some(Background { stop, thread })
}

/// Provisions, runs every part, stops the servers; an error is a failure
/// to provision.
fn suite(extra: &[String]) -> Result<Vec<Part>> {
    // Checked before the suite, not after six minutes of it.
    let fuzz_secs = fuzz_secs_in_test()?;
    catch_interrupts();
    let root = std::env::temp_dir().join("idem-xtask");
    sweep(&root);
    let have_nextest = have_nextest();
    let runner = if have_nextest {
        "nextest"
    } else {
        "cargo test"
    };
    // A missing server or tool is said (or, as root, installed) before the
    // build, not after it; found, these are quick.
    postgres_bindir()?;
    nats_binary()?;
    rabbitmq_server()?;
    // Tansu is not looked for here: a first `cargo install` of it (about
    // ten minutes) runs in the provisioning below, beside the build.
    chromium_binary()?;
    libfaketime()?;
    // The servers and tools are made ready while the whole suite compiles;
    // the run below then finds it built. (A run with arguments, which may
    // be ones `--no-run` refuses, builds in the run itself.)
    let provisioning = {
        let root = root.clone();
        std::thread::spawn(move || provision(&root))
    };
    let built = if extra.is_empty() {
        run(&mut build_command(have_nextest))
    } else {
        Ok(())
    };
    let p = provisioning
        .join()
        .map_err(|_| "provisioning the servers panicked".to_owned())??;
    if let Err(e) = built {
        return Ok(vec![Part::failed(
            runner,
            format!("the tests did not build ({e}; above)"),
        )]);
    }
    if INTERRUPTED.load(Ordering::SeqCst) {
        return Ok(vec![Part::failed(
            "run",
            "interrupted; servers stopped".into(),
        )]);
    }
    let Provisioned {
        pg,
        nats,
        nats_bin,
        rabbitmq,
        tansu,
        tansu_bin,
        chromium,
        faketime,
        python,
    } = p;
    let mut cmd = test_command(have_nextest, extra);
    if have_nextest && std::env::var_os(TEST_THREADS).is_none() {
        cmd.env(TEST_THREADS, test_threads().to_string());
    }
    cmd.env("IDEM_TEST_POSTGRES_URL", pg.url())
        .env("IDEM_TEST_NATS_URL", nats.url())
        .env("IDEM_TEST_NATS_SERVER", &nats_bin)
        .env("IDEM_TEST_RABBITMQ_SERVER", &rabbitmq)
        .env(
            "IDEM_TEST_KAFKA_URL",
            format!("kafka://127.0.0.1:{}", tansu.port),
        )
        .env("IDEM_TEST_TANSU", &tansu_bin)
        .env("IDEM_TEST_CHROMIUM", &chromium)
        .env("IDEM_TEST_PYTHON", &python)
        .env("IDEM_TEST_LIBFAKETIME", &faketime);
    // The whole suite's later parts build in projects and target
    // directories of their own: built now, niced, in the processor time the
    // tests (mostly waiting on servers, timeouts and pauses) leave free.
    let background = if extra.is_empty() {
        background_builds(fuzz_secs > 0)
    } else {
        None
    };
    // nextest's last line says how many tests ran, passed, failed.
    let (result, summary) = run_quoting(
        &mut cmd,
        if have_nextest {
            " run: "
        } else {
            "test result:"
        },
    );
    if let Some(builds) = background {
        // A failed build is built again below, where its errors are shown.
        builds.finish();
    }
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
    drop(tansu);
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
