//! `cargo xtask test --quick`: the tests that need nothing but Rust — SQLite
//! files and in-process servers — without provisioning anything, in a few
//! minutes on two cores. What it leaves out it names in its verdict.
//!
//! The tests that need a service find it through `IDEM_TEST_*`
//! (`idem-testkit`), and panic when it is not set. The quick run removes
//! those variables from the tests' environment, so a test that needs a
//! service and is not listed in [`LEFT_OUT`] fails the quick run, loudly;
//! none passes without what it tests.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::part::Part;
use crate::shell::{Result, run_quoting};

/// What the quick run leaves out, by what it needs: whole packages, and
/// tests by a part of their name (`module::test`). One list serves nextest
/// (`package(…)`, `test(~…)`) and `cargo test` (`--exclude`, `--skip`).
pub(crate) struct LeftOut {
    /// What those tests need, as the verdict says it.
    pub(crate) needs: &'static str,
    /// Packages all of whose tests need it.
    pub(crate) packages: &'static [&'static str],
    /// Parts of test names.
    pub(crate) names: &'static [&'static str],
}

/// Every test that needs more than Rust, and the few that take over 30 s
/// each on two cores. `cargo xtask test` runs them all.
pub(crate) const LEFT_OUT: &[LeftOut] = &[
    LeftOut {
        needs: "PostgreSQL",
        packages: &["idem-postgres"],
        names: &[
            "postgres",
            "_pg",
            "pg_",
            "fleet_history",
            "lost_commit_acknowledgement_is_outcome_unknown",
            "optimistic_loser_with_an_unstored_answer",
            "silent_database_is_503_within_the_deadline",
            "a_stalled_database_gives_bounded_answers",
            "a_takeover_while_the_first_forward_runs_stores_nothing_transient",
            "claims_on_request_chosen_queues_leave_no_series",
            "readyz_is_ready_at_the_first_probe_after_the_database_returns",
            "a_stock_write_whose_commit_is_not_answered_is_outcome_unknown",
            "a_claim_whose_answer_is_lost_is_given_back_and_forwarded_once_on_retry",
        ],
    },
    LeftOut {
        needs: "NATS",
        packages: &["idem-nats", "example-outbox-relay-inbox"],
        names: &[
            "nats",
            "quorum::relays_and_consumers",
            "drill4_",
            "drill6_",
            "metrics_counters_equal_what_was_sent",
        ],
    },
    LeftOut {
        needs: "Kafka (Tansu)",
        packages: &["idem-kafka"],
        names: &["kafka"],
    },
    LeftOut {
        needs: "RabbitMQ",
        packages: &["idem-rabbitmq"],
        names: &["rabbitmq"],
    },
    LeftOut {
        needs: "Python",
        packages: &["example-webhook-route"],
        names: &[
            "python",
            "provider_libraries::",
            "real_clients::",
            "history_run",
            "tasks_history_fleet",
            "tasks_restart::",
            "drill_workers::",
        ],
    },
    LeftOut {
        needs: "Chromium and Node",
        packages: &[],
        names: &["chromium", "browser"],
    },
    LeftOut {
        needs: "libfaketime",
        packages: &[],
        names: &["clock::checkout_shop_ahead", "clock::gateway_ahead"],
    },
    LeftOut {
        needs: "over 30 s",
        packages: &[],
        names: &[
            "checkout::sqlite::history",
            "drill_peers::a_retry_answered_409_forever",
            "drill_peers::a_409_followed_by_the_first_answer",
            "drill_streamed::a_streamed_answer_is_not_taken",
        ],
    },
];

/// The nextest filterset of the quick run: everything but [`LEFT_OUT`].
pub(crate) fn filterset() -> String {
    let mut parts = Vec::new();
    for l in LEFT_OUT {
        parts.extend(l.packages.iter().map(|p| format!("package({p})")));
        parts.extend(l.names.iter().map(|n| format!("test(~{n})")));
    }
    format!("not ({})", parts.join(" | "))
}

/// `cargo test`'s arguments for the same selection: packages excluded
/// before `--`, names skipped after it.
fn cargo_test_args() -> (Vec<String>, Vec<String>) {
    let mut before = Vec::new();
    let mut after = Vec::new();
    for l in LEFT_OUT {
        for p in l.packages {
            before.extend(["--exclude".to_owned(), (*p).to_owned()]);
        }
        for n in l.names {
            after.extend(["--skip".to_owned(), (*n).to_owned()]);
        }
    }
    (before, after)
}

/// The user's filter expressions (`-E X`, `--filterset X`, `-E=X`) taken
/// out of `extra`: with `--quick` they narrow the quick set, where nextest
/// would add them to it.
fn split_filters(extra: &[String]) -> (Vec<String>, Vec<String>) {
    let (mut filters, mut rest) = (Vec::new(), Vec::new());
    let mut args = extra.iter();
    while let Some(a) = args.next() {
        match a.as_str() {
            "-E" | "--filterset" | "--filter-expr" => {
                if let Some(v) = args.next() {
                    filters.push(v.clone());
                }
            }
            _ => match ["-E=", "--filterset=", "--filter-expr="]
                .iter()
                .find_map(|p| a.strip_prefix(p))
            {
                Some(v) => filters.push(v.to_owned()),
                None => rest.push(a.clone()),
            },
        }
    }
    (filters, rest)
}

/// Runs the quick set; returns the verdict's parts.
pub(crate) fn quick(extra: &[String], have_nextest: bool) -> Vec<Part> {
    let mut cmd = Command::new("cargo");
    // A test that needs a service must fail here, not find one by chance.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("IDEM_TEST_") {
            cmd.env_remove(&name);
        }
    }
    let needs: Vec<&str> = LEFT_OUT.iter().map(|l| l.needs).collect();
    let packages: Vec<&str> = LEFT_OUT.iter().flat_map(|l| l.packages).copied().collect();
    // nextest counts the tests it skips in the binaries it lists; those of
    // the packages left out whole are not listed, so they are named.
    let why = format!(
        "the tests that need {} (all of {}); the doc tests, readme app, otlp and fuzz \
         (`cargo xtask test` runs them all)",
        needs.join(", "),
        packages.join(", ")
    );
    let part = if have_nextest {
        let (filters, rest) = split_filters(extra);
        let mut set = filterset();
        if !filters.is_empty() {
            set = format!("({set}) & (({}))", filters.join(") | ("));
        }
        cmd.args([
            "nextest",
            "run",
            "--workspace",
            "--no-fail-fast",
            "-E",
            &set,
        ])
        .args(rest);
        let (result, summary) = run_quoting(&mut cmd, " run: ");
        counted("quick (nextest)", result, summary)
    } else {
        eprintln!(
            "xtask: cargo-nextest not found, running `cargo test` (the tests of a binary share \
             one process; `cargo install cargo-nextest` gives each its own, as the full run does)"
        );
        let (before, after) = cargo_test_args();
        cmd.args(["test", "--workspace", "--no-fail-fast", "--tests"])
            .args(before)
            .arg("--")
            .args(after)
            .args(extra);
        let (result, summary) = run_counting(&mut cmd);
        counted("quick (cargo test)", result, Some(summary))
    };
    vec![part, Part::left_out("not run", why)]
}

/// The part of a run that says how many tests ran; a run that ran none
/// fails (a filter that selects nothing, a build that produced nothing).
fn counted(name: &'static str, result: Result<()>, summary: Option<String>) -> Part {
    match summary {
        Some(s) if s.contains(" 0 tests run:") || s.starts_with("0 tests run") => {
            Part::failed(name, format!("no test ran: {s}"))
        }
        Some(s) => Part::of(name, result, Some(s)),
        None => Part::of(
            name,
            result.and(Err("no summary: did it build?".into())),
            None,
        ),
    }
}

/// Runs `cargo test`, passing its output through, and adds up the
/// `test result:` lines of every test binary.
fn run_counting(cmd: &mut Command) -> (Result<()>, String) {
    let mut child = match cmd.stdout(Stdio::piped()).spawn() {
        Ok(c) => c,
        Err(e) => return (Err(format!("failed to start {cmd:?}: {e}")), String::new()),
    };
    let (mut passed, mut failed, mut filtered) = (0u64, 0u64, 0u64);
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(std::io::Result::ok) {
            println!("{line}");
            if let Some(rest) = line.trim().strip_prefix("test result: ") {
                passed += number_before(rest, " passed");
                failed += number_before(rest, " failed");
                filtered += number_before(rest, " filtered out");
            }
        }
    }
    let result = match child.wait() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("cargo test: {s}")),
        Err(e) => Err(e.to_string()),
    };
    let ran = passed + failed;
    (
        result,
        format!("{ran} tests run: {passed} passed, {failed} failed, {filtered} skipped"),
    )
}

/// The number just before `what` in `text` (`"3 passed; 1 failed"`, `" failed"` → 1).
fn number_before(text: &str, what: &str) -> u64 {
    text.find(what)
        .and_then(|end| {
            let head = &text[..end];
            let start = head
                .rfind(|c: char| !c.is_ascii_digit())
                .map_or(0, |i| i + 1);
            head[start..].parse().ok()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filterset_leaves_out_every_listed_package_and_name() {
        let set = filterset();
        assert!(set.starts_with("not ("));
        for l in LEFT_OUT {
            for p in l.packages {
                assert!(set.contains(&format!("package({p})")), "{p}");
            }
            for n in l.names {
                assert!(set.contains(&format!("test(~{n})")), "{n}");
            }
        }
        let (before, after) = cargo_test_args();
        assert!(
            before
                .windows(2)
                .any(|w| w == ["--exclude", "idem-postgres"])
        );
        assert!(after.windows(2).any(|w| w == ["--skip", "postgres"]));
    }

    #[test]
    fn user_filters_narrow_the_quick_set() {
        let args: Vec<String> = [
            "-E",
            "test(/a/)",
            "--filterset=package(b)",
            "name",
            "--no-capture",
        ]
        .map(String::from)
        .to_vec();
        let (filters, rest) = split_filters(&args);
        assert_eq!(filters, ["test(/a/)", "package(b)"]);
        assert_eq!(rest, ["name", "--no-capture"]);
    }

    #[test]
    fn cargo_tests_counts_are_read_from_its_result_lines() {
        let line =
            "ok. 12 passed; 1 failed; 0 ignored; 0 measured; 30 filtered out; finished in 0.1s";
        assert_eq!(number_before(line, " passed"), 12);
        assert_eq!(number_before(line, " failed"), 1);
        assert_eq!(number_before(line, " filtered out"), 30);
        assert_eq!(number_before("nothing", " passed"), 0);
    }
}
