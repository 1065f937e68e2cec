//! A run's results and their three forms: a table, JSON, JUnit XML.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;
use serde_json::json;

/// How one drill ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// The property holds.
    Pass,
    /// A contract failure — a second effect, a retry that did not get the
    /// first answer, another payload accepted under a used key, a 5xx where
    /// a retry should replay: exit status 1.
    Fail,
    /// A convention finding — the status chosen for a refusal, byte-level
    /// fingerprints, a bad key accepted, server errors under a race with
    /// one effect: no duplicate effect, exit status 0 unless `--strict`.
    Warn,
    /// Not run (an option not given, the budget used up, the baseline
    /// failed) or not applicable; the summary says why.
    Skip,
    /// An informational drill: what happened, never a failure.
    Info,
}

impl Outcome {
    /// How bad it is: `Fail` over `Warn` over the rest (the worst round of
    /// a drill decides it).
    pub fn severity(self) -> u8 {
        match self {
            Outcome::Fail => 3,
            Outcome::Warn => 2,
            Outcome::Pass => 1,
            Outcome::Skip | Outcome::Info => 0,
        }
    }

    /// `PASS`, `FAIL`, `WARN`, `SKIP`, `INFO`.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Pass => "PASS",
            Outcome::Fail => "FAIL",
            Outcome::Warn => "WARN",
            Outcome::Skip => "SKIP",
            Outcome::Info => "INFO",
        }
    }
}

/// One drill's result.
#[derive(Debug, Clone, Serialize)]
pub struct DrillResult {
    /// The drill's name (`lost-response`, …).
    pub name: &'static str,
    /// How it ended.
    pub outcome: Outcome,
    /// One line: why.
    pub summary: String,
    /// What was seen: statuses, bodies (truncated), effect counts.
    pub evidence: Vec<String>,
    /// The effects counted for the drill's case, when counted (for a drill
    /// of several rounds, the worst round's).
    pub effects: Option<u64>,
    /// For a drill run in rounds (every contract drill but `baseline`):
    /// every round, each with fresh keys; the worst decides the outcome.
    pub rounds: Option<Rounds>,
    /// How long it took.
    pub elapsed_ms: u64,
}

/// The rounds a drill's verdict rests on.
#[derive(Debug, Clone, Serialize)]
pub struct Rounds {
    /// Rounds run (samples).
    pub run: u32,
    /// Rounds that failed.
    pub failed: u32,
    /// Rounds with a warning (and no failure).
    pub warned: u32,
    /// Each round, in order.
    pub each: Vec<Round>,
}

/// One round of a drill.
#[derive(Debug, Clone, Serialize)]
pub struct Round {
    /// The `{unique}` value of the round, so its effects can be looked up.
    pub unique: String,
    /// How it ended.
    pub outcome: Outcome,
    /// Why, in one line.
    pub summary: String,
    /// The effects counted for it.
    pub effects: Option<u64>,
}

/// A whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The target, as given.
    pub target: String,
    /// The request under test, `METHOD /path`.
    pub request: String,
    /// One result per drill, in the order run.
    pub drills: Vec<DrillResult>,
    /// Requests sent to the target (the proxy's included).
    pub requests_sent: u64,
    /// `--max-requests`.
    pub max_requests: Option<u64>,
    /// How long the run took.
    pub elapsed_ms: u64,
    /// `--strict`: convention warnings fail the run too.
    pub strict: bool,
    /// What counting every case again after `--settle` found, if done.
    pub settled: Option<String>,
}

/// The drills without which there is no verdict on the contract.
pub const CORE_DRILLS: &[&str] = &[
    "baseline",
    "lost-response",
    "abandoned-request",
    "concurrency",
];

impl Report {
    /// How many drills ended with `outcome`.
    pub fn count(&self, outcome: Outcome) -> usize {
        self.drills.iter().filter(|d| d.outcome == outcome).count()
    }

    /// Whether the run fails (exit status 1): a contract failure, or with
    /// `--strict` a convention warning too.
    pub fn failed(&self) -> bool {
        self.count(Outcome::Fail) > 0
            || !self.unchecked().is_empty()
            || (self.strict && self.count(Outcome::Warn) > 0)
    }

    /// The core drills that were skipped (the budget ran out): without
    /// them the run says nothing about the contract, and is no PASS.
    pub fn unchecked(&self) -> Vec<&'static str> {
        self.drills
            .iter()
            .filter(|d| CORE_DRILLS.contains(&d.name) && d.outcome == Outcome::Skip)
            .map(|d| d.name)
            .collect()
    }

    /// `fail`, `incomplete` (a core drill not run), `warn` (convention
    /// findings only) or `pass`.
    pub fn result(&self) -> &'static str {
        if self.count(Outcome::Fail) > 0 {
            "fail"
        } else if !self.unchecked().is_empty() {
            "incomplete"
        } else if self.failed() {
            "fail"
        } else if self.count(Outcome::Warn) > 0 {
            "warn"
        } else {
            "pass"
        }
    }

    /// The result of drill `name`.
    pub fn drill(&self, name: &str) -> Option<&DrillResult> {
        self.drills.iter().find(|d| d.name == name)
    }

    /// `N drills: …`.
    pub fn totals(&self) -> String {
        format!(
            "{} drills: {} pass, {} fail, {} warn, {} skip, {} info; {} requests sent{}",
            self.drills.len(),
            self.count(Outcome::Pass),
            self.count(Outcome::Fail),
            self.count(Outcome::Warn),
            self.count(Outcome::Skip),
            self.count(Outcome::Info),
            self.requests_sent,
            self.max_requests
                .map(|m| format!(" (--max-requests {m})"))
                .unwrap_or_default()
        )
    }

    /// The report as a table: a row per drill, the evidence indented below.
    pub fn table(&self) -> String {
        let width = self
            .drills
            .iter()
            .map(|d| d.name.len())
            .max()
            .unwrap_or(5)
            .max(5);
        let mut out = format!(
            "idem drill {} — {}\n\n{:width$}  RESULT  EVIDENCE\n",
            self.target, self.request, "DRILL"
        );
        for d in &self.drills {
            let _ = writeln!(
                out,
                "{:width$}  {:6}  {}",
                d.name,
                d.outcome.label(),
                printable(&d.summary)
            );
            for e in &d.evidence {
                let _ = writeln!(out, "{:width$}          {}", "", printable(e));
            }
        }
        if let Some(settled) = &self.settled {
            let _ = writeln!(out, "\n{}", printable(settled));
        }
        let _ = writeln!(out, "\n{}", self.totals());
        let _ = writeln!(out, "{}", self.verdict());
        out
    }

    /// The last line of the table: what the exit status means.
    pub fn verdict(&self) -> String {
        let (fail, warn) = (self.count(Outcome::Fail), self.count(Outcome::Warn));
        if let Some(b) = self
            .drill("baseline")
            .filter(|b| b.outcome == Outcome::Fail)
        {
            return format!(
                "verdict: FAIL — the baseline failed, so nothing else was checked: {}",
                b.summary
            );
        }
        let unchecked = self.unchecked();
        if fail == 0 && !unchecked.is_empty() {
            return format!(
                "verdict: INCOMPLETE — {} not run, or not all its rounds (the request budget ran out): no verdict on the contract",
                unchecked.join(", ")
            );
        }
        match (fail, warn) {
            (0, 0) => "verdict: PASS — every contract property held".into(),
            (0, w) if self.strict => format!(
                "verdict: FAIL (--strict) — no contract failure, {w} convention warning{}",
                plural(w)
            ),
            (0, w) => format!(
                "verdict: PASS with {w} convention warning{} — no duplicate effect, no lost answer (--strict fails on warnings)",
                plural(w)
            ),
            (f, _) => format!(
                "verdict: FAIL — {f} contract failure{} (duplicate effects, lost or changed answers, another payload accepted, or no answer)",
                plural(f)
            ),
        }
    }

    /// The report as JSON: `target`, `request`, `result` (`pass`, `warn`
    /// — convention findings only — or `fail`), `strict`, `counts` per
    /// outcome, `requests_sent`, `max_requests`, `elapsed_ms` and `drills`
    /// (`name`, `outcome`, `summary`, `evidence`, `effects`, `rounds`,
    /// `elapsed_ms`).
    pub fn json(&self) -> serde_json::Value {
        json!({
            "target": self.target,
            "request": self.request,
            "result": self.result(),
            "strict": self.strict,
            "settled": self.settled,
            "counts": {
                "pass": self.count(Outcome::Pass),
                "fail": self.count(Outcome::Fail),
                "warn": self.count(Outcome::Warn),
                "skip": self.count(Outcome::Skip),
                "info": self.count(Outcome::Info),
            },
            "requests_sent": self.requests_sent,
            "max_requests": self.max_requests,
            "elapsed_ms": self.elapsed_ms,
            "drills": self.drills,
        })
    }

    /// The report as JUnit XML: a test case per drill; FAIL is a
    /// `<failure>` (and WARN too with `--strict`), SKIP `<skipped>`, the
    /// evidence in `<system-out>`.
    pub fn junit(&self) -> String {
        let failing = |o: Outcome| o == Outcome::Fail || (self.strict && o == Outcome::Warn);
        let failures = self.drills.iter().filter(|d| failing(d.outcome)).count();
        let secs = |ms: u64| format!("{:.3}", Duration::from_millis(ms).as_secs_f64());
        let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let _ = writeln!(
            out,
            "<testsuites name=\"idem drill\" tests=\"{}\" failures=\"{}\" skipped=\"{}\" errors=\"0\" time=\"{}\">",
            self.drills.len(),
            failures,
            self.count(Outcome::Skip),
            secs(self.elapsed_ms)
        );
        let _ = writeln!(
            out,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" skipped=\"{}\" errors=\"0\" time=\"{}\">",
            xml(&format!("idem drill {} {}", self.target, self.request)),
            self.drills.len(),
            failures,
            self.count(Outcome::Skip),
            secs(self.elapsed_ms)
        );
        for d in &self.drills {
            let _ = writeln!(
                out,
                "    <testcase classname=\"idem.drill\" name=\"{}\" time=\"{}\">",
                xml(d.name),
                secs(d.elapsed_ms)
            );
            let evidence = xml(&d.evidence.join("\n"));
            match d.outcome {
                o if failing(o) => {
                    let _ = writeln!(
                        out,
                        "      <failure message=\"{}\" type=\"{}\">{evidence}</failure>",
                        xml(&d.summary),
                        if o == Outcome::Fail {
                            "contract"
                        } else {
                            "convention"
                        }
                    );
                }
                Outcome::Skip => {
                    let _ = writeln!(out, "      <skipped message=\"{}\"/>", xml(&d.summary));
                }
                _ => {}
            }
            let _ = writeln!(
                out,
                "      <system-out>{}: {}\n{evidence}</system-out>",
                d.outcome.label(),
                xml(&d.summary)
            );
            out.push_str("    </testcase>\n");
        }
        out.push_str("  </testsuite>\n</testsuites>\n");
        out
    }
}

/// `text` escaped for XML text and attribute values; characters XML 1.0
/// cannot hold at all (most control characters) become `\u{…}` text.
pub fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// Control characters shown as escapes, so a body cannot move the
/// terminal's cursor.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// `s` after a count other than one.
pub fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// At most `max` characters of `text`, with `…` when cut.
pub fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_escapes_markup_quotes_and_control_characters() {
        assert_eq!(
            xml("a<b>&\"c'\u{1}\td"),
            "a&lt;b&gt;&amp;&quot;c&apos;\\u{1}\td"
        );
        assert_eq!(truncate("abcdef", 3), "abc…");
        assert_eq!(truncate("abc", 3), "abc");
        assert_eq!(printable("a\u{1b}[2J"), "a\\u{1b}[2J");
    }
}
