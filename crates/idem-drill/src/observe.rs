//! Progress of a run as it goes: the [`Observer`] a caller passes to
//! [`run`](crate::run) ([`Quiet`] for none), and the duration format the
//! report and the evidence use.

use std::time::Duration;

use crate::report::DrillResult;

/// Told about each drill as the run goes (the `idem drill` command draws a
/// progress bar on stderr with it). Every method has an empty default.
pub trait Observer: Send {
    /// The drill `name` starts.
    fn start(&mut self, name: &str) {
        let _ = name;
    }

    /// Drill `index` (from 0) of `total` is done with `result`; see
    /// [`line()`] for the usual one-line summary.
    fn done(&mut self, index: usize, total: usize, result: &DrillResult) {
        let _ = (index, total, result);
    }

    /// Every drill is done; `settled` is the settle pass's line, if it ran.
    fn finish(&mut self, settled: Option<&str>) {
        let _ = settled;
    }

    /// The run stops without a report (the target is unreachable).
    fn abort(&mut self) {}
}

/// An [`Observer`] that shows nothing (for a `cargo test`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Quiet;

impl Observer for Quiet {}

/// `[3/12] concurrency PASS — one effect … (1s)`: drill `index` of `total`
/// in one line, its summary cut at 100 characters.
pub fn line(index: usize, total: usize, r: &DrillResult) -> String {
    let summary = crate::report::truncate(&r.summary, 100);
    format!(
        "[{}/{total}] {} {} — {summary} ({})",
        index + 1,
        r.name,
        r.outcome.label(),
        duration_text(Duration::from_millis(r.elapsed_ms))
    )
}

pub use idem_core::duration_text;
