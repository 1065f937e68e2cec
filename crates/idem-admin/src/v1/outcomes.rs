//! The request outcomes of this process over the last hour, per minute: an
//! in-memory ring fed by [`track`] from each response's
//! [`RequestOutcome`], read by the overview.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use idem_http::RequestOutcome;

/// How many minutes the ring keeps.
pub const WINDOW_MINUTES: usize = 60;

#[derive(Debug, Clone, Default)]
struct Slot {
    /// Unix minute this slot counts; a slot of an older minute is stale.
    minute: i64,
    counts: BTreeMap<&'static str, u64>,
}

/// Counts of outcomes per minute for the last [`WINDOW_MINUTES`] minutes.
#[derive(Debug)]
pub struct OutcomeRing {
    slots: Mutex<Vec<Slot>>,
}

impl Default for OutcomeRing {
    fn default() -> Self {
        Self {
            slots: Mutex::new(vec![Slot::default(); WINDOW_MINUTES]),
        }
    }
}

/// One minute of the ring: its start (unix ms) and its counts.
pub type Minute = (i64, BTreeMap<&'static str, u64>);

impl OutcomeRing {
    /// Counts `outcome` in the minute of `now_ms`.
    pub fn record(&self, outcome: RequestOutcome, now_ms: i64) {
        let minute = now_ms.div_euclid(60_000);
        let i = minute.rem_euclid(WINDOW_MINUTES as i64) as usize;
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let slot = &mut slots[i];
        if slot.minute != minute {
            *slot = Slot {
                minute,
                counts: BTreeMap::new(),
            };
        }
        *slot.counts.entry(outcome.as_str()).or_insert(0) += 1;
    }

    /// The last [`WINDOW_MINUTES`] minutes up to `now_ms`, oldest first
    /// (every minute, empty ones included), and the totals.
    pub fn snapshot(&self, now_ms: i64) -> (Vec<Minute>, BTreeMap<&'static str, u64>) {
        let now = now_ms.div_euclid(60_000);
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let mut totals = BTreeMap::new();
        let minutes = (now - WINDOW_MINUTES as i64 + 1..=now)
            .map(|m| {
                let slot = &slots[m.rem_euclid(WINDOW_MINUTES as i64) as usize];
                let counts = if slot.minute == m {
                    slot.counts.clone()
                } else {
                    BTreeMap::new()
                };
                for (k, n) in &counts {
                    *totals.entry(*k).or_insert(0) += n;
                }
                (m * 60_000, counts)
            })
            .collect();
        (minutes, totals)
    }
}

/// The middleware: hands the ring to the handlers (a request extension)
/// and counts each response's outcome.
pub async fn track(State(ring): State<Arc<OutcomeRing>>, mut req: Request, next: Next) -> Response {
    req.extensions_mut().insert(ring.clone());
    let res = next.run(req).await;
    if let Some(outcome) = res.extensions().get::<RequestOutcome>() {
        ring.record(*outcome, super::host_now_ms());
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minutes_roll_over_and_old_ones_drop_out() {
        let ring = OutcomeRing::default();
        let t0 = 1_700_000_000_000 - 1_700_000_000_000 % 60_000;
        ring.record(RequestOutcome::Executed, t0);
        ring.record(RequestOutcome::Executed, t0 + 1_000);
        ring.record(RequestOutcome::Replayed, t0 + 60_000);
        let (minutes, totals) = ring.snapshot(t0 + 60_000);
        assert_eq!(minutes.len(), WINDOW_MINUTES);
        assert_eq!(totals.get("executed"), Some(&2));
        assert_eq!(totals.get("replayed"), Some(&1));
        assert_eq!(minutes.last().map(|m| m.0), Some(t0 + 60_000));
        // An hour later the first minute's slot is reused.
        ring.record(RequestOutcome::Mismatch, t0 + 60 * 60_000);
        let (_, totals) = ring.snapshot(t0 + 60 * 60_000);
        assert_eq!(totals.get("executed"), None, "older than the window");
        assert_eq!(totals.get("replayed"), Some(&1));
        assert_eq!(totals.get("mismatch"), Some(&1));
    }
}
