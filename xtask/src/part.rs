//! One part of a test run, as its verdict line names it.

use crate::shell::Result;

/// One part of the run, as the verdict names it.
pub(crate) struct Part {
    name: &'static str,
    pub(crate) passed: bool,
    said: String,
}

impl Part {
    pub(crate) fn of(name: &'static str, result: Result<()>, summary: Option<String>) -> Self {
        match result {
            Ok(()) => Self {
                name,
                passed: true,
                said: summary.unwrap_or_else(|| "ok".into()),
            },
            Err(e) => Self::failed(name, summary.unwrap_or(e)),
        }
    }

    pub(crate) fn failed(name: &'static str, said: String) -> Self {
        Self {
            name,
            passed: false,
            said,
        }
    }

    /// A part not run on purpose, saying what and why.
    pub(crate) fn left_out(name: &'static str, said: String) -> Self {
        Self {
            name,
            passed: true,
            said,
        }
    }

    pub(crate) fn skipped(name: &'static str, why: &str) -> Self {
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
