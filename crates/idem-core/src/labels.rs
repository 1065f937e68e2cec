//! Metric label values a request chooses, bounded (DESIGN guarantee 16: a
//! metric label never takes an unbounded value from a request).
//!
//! Most labels take their values from configuration or code (an operation,
//! a webhook endpoint, a subscriber, a step): as many as were configured.
//! A label whose value a request names — a task's `queue` — goes through one
//! [`LabelValues`] per label, shared by every metric that carries it:
//!
//! - the caller records a value only for a name that has state (a claim
//!   that got tasks, a queue with tasks in the store), never for a name a
//!   request merely mentions;
//! - at most [`MAX_VALUES`] values are kept at a time; any other value is
//!   recorded as [`OTHER`] (which no valid name spells) and counted in
//!   [`DROPPED_TOTAL`]`{label}`;
//! - a value not recorded for [`FORGET_AFTER`] is forgotten, its place
//!   free for another. `idem`'s exporter drops a counter or histogram
//!   series that has not moved for as long, so its series go too.
//!
//! ```
//! use std::time::Duration;
//! use idem_core::labels::{LabelValues, OTHER};
//!
//! static QUEUES: LabelValues = LabelValues::with_limits("queue", 2, Duration::from_secs(60));
//! assert_eq!(QUEUES.value("mail"), "mail");
//! assert_eq!(QUEUES.value("triage"), "triage");
//! assert_eq!(QUEUES.value("q-3"), OTHER);
//! assert_eq!(QUEUES.value("mail"), "mail");
//! ```

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The value recorded in place of one past the limit. Parentheses are in
/// no queue, endpoint or operation name, so it never merges with a real one.
pub const OTHER: &str = "(other)";

/// The values a label keeps at a time by default.
pub const MAX_VALUES: usize = 500;

/// How long a value is kept after it was last recorded, by default; `idem`
/// drops counter and histogram series idle for as long.
pub const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// The counter of values recorded as [`OTHER`], by `label`.
pub const DROPPED_TOTAL: &str = "idem_metric_label_values_dropped_total";

/// The values one label may take, at most `max` at a time (see the module
/// docs). Cheap to share: put one in a `static` per label.
#[derive(Debug)]
pub struct LabelValues {
    label: &'static str,
    max: usize,
    forget_after: Duration,
    values: Mutex<Kept>,
}

#[derive(Debug)]
struct Kept {
    /// Each kept value and when it was last recorded.
    last: BTreeMap<String, Instant>,
    /// When a value may first be forgotten (the oldest record's time plus
    /// `forget_after`, as of the last sweep): a full label is swept no
    /// sooner, so a flood of new values costs a lookup each.
    sweep_at: Option<Instant>,
}

impl LabelValues {
    /// The values of `label`: [`MAX_VALUES`] at a time, each forgotten
    /// [`FORGET_AFTER`] after its last record.
    pub const fn new(label: &'static str) -> Self {
        Self::with_limits(label, MAX_VALUES, FORGET_AFTER)
    }

    /// The values of `label`, `max` at a time, each forgotten
    /// `forget_after` after its last record.
    pub const fn with_limits(label: &'static str, max: usize, forget_after: Duration) -> Self {
        Self {
            label,
            max,
            forget_after,
            values: Mutex::new(Kept {
                last: BTreeMap::new(),
                sweep_at: None,
            }),
        }
    }

    /// The label's name.
    pub fn label(&self) -> &'static str {
        self.label
    }

    /// What to record for `value` now: `value` itself when it is kept or
    /// there is room for it, [`OTHER`] (counted in [`DROPPED_TOTAL`])
    /// otherwise. Call it only for a name that has state.
    pub fn value(&self, value: &str) -> String {
        self.value_at(value, Instant::now())
    }

    /// [`LabelValues::value`] at `now`.
    pub fn value_at(&self, value: &str, now: Instant) -> String {
        let mut kept = self.values.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(last) = kept.last.get_mut(value) {
            *last = now.max(*last);
            return value.to_owned();
        }
        if kept.last.len() >= self.max && kept.sweep_at.is_none_or(|at| now >= at) {
            let forget_after = self.forget_after;
            kept.last
                .retain(|_, last| now.saturating_duration_since(*last) < forget_after);
            kept.sweep_at = kept
                .last
                .values()
                .min()
                .and_then(|oldest| oldest.checked_add(forget_after));
        }
        if kept.last.len() < self.max {
            kept.last.insert(value.to_owned(), now);
            return value.to_owned();
        }
        drop(kept);
        metrics::counter!(DROPPED_TOTAL, "label" => self.label).increment(1);
        OTHER.to_owned()
    }

    /// How many values are kept now.
    pub fn len(&self) -> usize {
        self.values
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last
            .len()
    }

    /// Whether no value is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_limit_values_are_other_until_one_is_forgotten() {
        let labels = LabelValues::with_limits("queue", 3, Duration::from_secs(10));
        let t0 = Instant::now();
        for q in ["a", "b", "c"] {
            assert_eq!(labels.value_at(q, t0), q);
        }
        assert_eq!(labels.value_at("d", t0), OTHER, "full");
        assert_eq!(labels.len(), 3, "an overflow keeps nothing");
        // `a` and `b` are recorded again: they stay; `c` is forgotten 10 s
        // after its last record, and `d` takes its place.
        let t5 = t0 + Duration::from_secs(5);
        assert_eq!(labels.value_at("a", t5), "a");
        assert_eq!(labels.value_at("b", t5), "b");
        let t10 = t0 + Duration::from_secs(10);
        assert_eq!(labels.value_at("d", t10), "d");
        assert_eq!(labels.value_at("c", t10), OTHER, "c lost its place");
        assert_eq!(labels.value_at("a", t10), "a");
        assert_eq!(labels.len(), 3);
    }

    #[test]
    fn many_values_keep_at_most_the_limit() {
        let labels = LabelValues::new("queue");
        let t0 = Instant::now();
        let kept = (0..20_000)
            .filter(|i| labels.value_at(&format!("q-{i}"), t0) != OTHER)
            .count();
        assert_eq!(kept, MAX_VALUES);
        assert_eq!(labels.len(), MAX_VALUES);
        assert_eq!(labels.value_at("q-0", t0), "q-0", "the first stay");
    }
}
