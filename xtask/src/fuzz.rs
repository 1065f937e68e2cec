//! `cargo xtask fuzz`, and the short fuzzing `cargo xtask test` ends with.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::shell::{Beside, Result, cargo, run, workspace_root};

/// The targets in `fuzz/fuzz_targets`, each a `[[bin]]` of `fuzz/Cargo.toml`.
pub(crate) const FUZZ_TARGETS: &[&str] =
    &["idempotency_key", "webhook_signature", "canonical_json"];

/// Seconds per target for `cargo xtask fuzz` unless `--secs` says otherwise.
pub(crate) const FUZZ_SECS_DEFAULT: u64 = 180;

/// Seconds per target within `cargo xtask test`; `XTASK_FUZZ_SECS` overrides
/// it, and 0 leaves fuzzing out.
pub(crate) const FUZZ_SECS_IN_TEST: u64 = 20;

pub(crate) const FUZZ_SECS_MAX: u64 = 24 * 3600;

pub(crate) fn fuzz_secs_in_test() -> Result<u64> {
    match std::env::var("XTASK_FUZZ_SECS") {
        Ok(v) => v
            .parse()
            .ok()
            .filter(|s| *s <= FUZZ_SECS_MAX)
            .ok_or_else(|| format!("XTASK_FUZZ_SECS={v:?}: expected 0 to {FUZZ_SECS_MAX}")),
        Err(_) => Ok(FUZZ_SECS_IN_TEST),
    }
}

/// `cargo xtask fuzz [TARGET] [--secs N]`: one target or all, N seconds each.
pub(crate) fn fuzz(args: &[String]) -> Result<()> {
    let mut target = None;
    let mut secs = FUZZ_SECS_DEFAULT;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--secs" => {
                secs = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .filter(|s| (1..=FUZZ_SECS_MAX).contains(s))
                    .ok_or_else(|| format!("--secs takes 1 to {FUZZ_SECS_MAX}"))?;
            }
            "--help" | "-h" => {
                println!(
                    "usage: cargo xtask fuzz [TARGET] [--secs N]\n\ntargets: {}\n\
                     default: every target, {FUZZ_SECS_DEFAULT} s each",
                    FUZZ_TARGETS.join(", ")
                );
                return Ok(());
            }
            t if target.is_none() && FUZZ_TARGETS.contains(&t) => target = Some(t),
            other => {
                return Err(format!(
                    "unknown argument {other:?}; targets: {}",
                    FUZZ_TARGETS.join(", ")
                ));
            }
        }
    }
    match target {
        Some(t) => fuzz_targets(&[t], secs),
        None => fuzz_targets(FUZZ_TARGETS, secs),
    }
}

pub(crate) fn host_triple() -> Result<String> {
    let out = Command::new("rustc")
        .arg("-vV")
        .output()
        .map_err(|e| format!("failed to run rustc -vV: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_owned)
        .ok_or_else(|| "rustc -vV printed no host triple".into())
}

/// Builds the fuzz targets and runs each for `secs` seconds, printing the
/// executions libFuzzer reports.
///
/// The build uses cargo-fuzz's instrumentation flags (SanitizerCoverage for
/// libFuzzer, `--cfg fuzzing`, debug assertions, release mode) without a
/// sanitizer: those flags are all stable, so this works with the one stable
/// toolchain of a fresh machine, needing neither nightly nor an installed
/// `cargo-fuzz`. The code fuzzed is safe Rust (`unsafe_code = "forbid"`),
/// where AddressSanitizer would find little; for it, use
/// `cargo +nightly fuzz run TARGET` in the same directory.
pub(crate) fn fuzz_targets(targets: &[&str], secs: u64) -> Result<()> {
    let fuzz_dir = workspace_root().join("fuzz");
    eprintln!("xtask: building the fuzz targets (release, instrumented)");
    let started = Instant::now();
    let bin_dir = build_fuzz_targets(&fuzz_dir, None)?;
    eprintln!(
        "xtask: fuzz targets built in {} s",
        started.elapsed().as_secs()
    );
    // One target per processor at a time: each is one single-threaded
    // process, and still gets its `secs` of processor time.
    let at_once = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut failed = Vec::new();
    for batch in targets.chunks(at_once) {
        let results: Vec<(&str, Result<()>)> = std::thread::scope(|scope| {
            let runs: Vec<_> = batch
                .iter()
                .map(|t| {
                    let (fuzz_dir, bin_dir) = (&fuzz_dir, &bin_dir);
                    (
                        *t,
                        scope.spawn(move || fuzz_run(fuzz_dir, bin_dir, t, secs)),
                    )
                })
                .collect();
            runs.into_iter()
                .map(|(t, run)| {
                    let r = run
                        .join()
                        .unwrap_or_else(|_| Err("its thread panicked".into()));
                    (t, r)
                })
                .collect()
        });
        for (target, result) in results {
            if let Err(e) = result {
                eprintln!("xtask: fuzz {target}: {e}");
                failed.push(target);
            }
        }
    }
    // A closing line in the form test-result readers know.
    eprintln!(
        "fuzz: {} passed, {} failed",
        targets.len() - failed.len(),
        failed.len()
    );
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("fuzz targets failed: {}", failed.join(", ")))
    }
}

/// Builds the fuzz targets as [`fuzz_targets`] does, niced, beside the
/// tests: [`fuzz_targets`] then finds them built.
pub(crate) fn prebuild(beside: &Beside<'_>) -> Result<()> {
    build_fuzz_targets(&workspace_root().join("fuzz"), Some(beside)).map(|_| ())
}

/// Builds every target with cargo-fuzz's instrumentation (see
/// [`fuzz_targets`]); with `background`, niced, beside the tests. The
/// directory of the binaries.
fn build_fuzz_targets(fuzz_dir: &Path, background: Option<&Beside<'_>>) -> Result<PathBuf> {
    let triple = host_triple()?;
    let mut rustflags = String::from(
        "-Cpasses=sancov-module \
         -Cllvm-args=-sanitizer-coverage-level=4 \
         -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
         -Cllvm-args=-sanitizer-coverage-pc-table \
         -Cllvm-args=-sanitizer-coverage-trace-compares \
         -Cllvm-args=-simplifycfg-branch-fold-threshold=0 \
         --cfg fuzzing -Clink-dead-code -Cdebug-assertions -Ccodegen-units=1",
    );
    if triple.contains("-linux-") {
        rustflags.push_str(" -Cllvm-args=-sanitizer-coverage-stack-depth");
    }
    if let Ok(extra) = std::env::var("RUSTFLAGS") {
        rustflags.push(' ');
        rustflags.push_str(&extra);
    }
    // `--target` keeps RUSTFLAGS away from build scripts, as cargo-fuzz does.
    let mut cmd = cargo(background.is_some());
    cmd.args(["build", "--release", "--bins", "--manifest-path"])
        .arg(fuzz_dir.join("Cargo.toml"))
        .args(["--target", &triple])
        .env("RUSTFLAGS", rustflags);
    match background {
        Some(beside) => beside.run(&mut cmd)?,
        None => run(&mut cmd)?,
    }
    Ok(fuzz_dir.join("target").join(&triple).join("release"))
}

/// Runs one target over its committed seeds and a scratch corpus (both under
/// `fuzz/`, the corpus and any crash artifact git-ignored).
pub(crate) fn fuzz_run(fuzz_dir: &Path, bin_dir: &Path, target: &str, secs: u64) -> Result<()> {
    let corpus = fuzz_dir.join("corpus").join(target);
    let artifacts = fuzz_dir.join("artifacts").join(target);
    for dir in [&corpus, &artifacts] {
        std::fs::create_dir_all(dir).map_err(|e| format!("failed to create {dir:?}: {e}"))?;
    }
    let mut cmd = Command::new(bin_dir.join(target));
    cmd.arg(format!("-max_total_time={secs}"))
        .arg("-timeout=10")
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        // libFuzzer adds new inputs to the first directory only.
        .arg(&corpus);
    let seeds = fuzz_dir.join("seeds").join(target);
    if seeds.is_dir() {
        cmd.arg(&seeds);
    }
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("failed to start {cmd:?}: {e}"))?;
    let log = String::from_utf8_lossy(&out.stderr);
    let seed = log
        .lines()
        .find_map(|l| l.split("Seed: ").nth(1))
        .unwrap_or("?");
    if !out.status.success() {
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        for line in tail.into_iter().rev() {
            eprintln!("  {line}");
        }
        return Err(format!(
            "{} (libFuzzer seed {seed}; reproduce with `{} <artifact>` from {})",
            out.status,
            bin_dir.join(target).display(),
            artifacts.display()
        ));
    }
    // "Done 581930 runs in 21 second(s)"
    let done = log
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("Done "))
        .and_then(|l| {
            let mut words = l.split_whitespace();
            let runs = words.next()?.to_owned();
            let secs = words.nth(2)?.to_owned();
            Some((runs, secs))
        });
    match done {
        Some((runs, secs)) => {
            eprintln!("xtask: fuzz {target}: {runs} executions in {secs} s (seed {seed})");
            Ok(())
        }
        None => Err("libFuzzer printed no \"Done N runs\" line".into()),
    }
}
