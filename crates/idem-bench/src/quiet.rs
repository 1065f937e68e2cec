//! Is the machine quiet? Benchmark figures taken while other processes hold
//! the CPU are not the machine's: before each case `idem bench` samples how
//! many cores are busy (from `/proc/stat`, Linux) while it itself waits, and
//! says at the end whether every case started on a quiet machine.

use std::sync::Mutex;
use std::time::Duration;

/// How long each sample lasts.
const SAMPLE: Duration = Duration::from_millis(250);
/// Busy cores (of other processes: the bench is idle while it samples)
/// above which a case is flagged.
pub const BUSY_LIMIT: f64 = 0.25;

/// CPU time counters of `/proc/stat`'s first line: (busy, total) jiffies.
fn parse_cpu_line(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().next()?;
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = fields.map(|f| f.parse().ok()).collect::<Option<_>>()?;
    if v.len() < 4 {
        return None;
    }
    // user nice system idle iowait irq softirq steal [guest guest_nice]:
    // guest time is already counted in user and nice.
    let total: u64 = v.iter().take(8).sum();
    let idle = v[3] + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// Cores busy between two readings, given the number of cores.
fn busy_cores(before: (u64, u64), after: (u64, u64), cores: usize) -> f64 {
    let busy = after.0.saturating_sub(before.0) as f64;
    let total = after.1.saturating_sub(before.1) as f64;
    if total <= 0.0 {
        return 0.0;
    }
    busy / total * cores as f64
}

fn read() -> Option<(u64, u64)> {
    parse_cpu_line(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// The cases sampled so far and the busiest sample: (cases, flagged, max).
static SEEN: Mutex<(u64, u64, f64)> = Mutex::new((0, 0, 0.0));

/// Samples the machine for 250 ms (`SAMPLE`) while waiting; returns the busy
/// cores, or `None` where `/proc/stat` cannot be read.
pub async fn sample() -> Option<f64> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let before = read()?;
    tokio::time::sleep(SAMPLE).await;
    let busy = busy_cores(before, read()?, cores);
    if let Ok(mut seen) = SEEN.lock() {
        seen.0 += 1;
        if busy > BUSY_LIMIT {
            seen.1 += 1;
        }
        seen.2 = seen.2.max(busy);
    }
    Some(busy)
}

/// One line on the run: how many cases started with other work on the
/// CPU, and the most busy cores seen.
pub fn verdict() -> String {
    let (cases, flagged, max) = SEEN.lock().map_or((0, 0, 0.0), |s| *s);
    if cases == 0 {
        return "machine check: not available (no /proc/stat); the figures may include other load"
            .to_owned();
    }
    if flagged == 0 {
        format!(
            "machine check: quiet before all {cases} cases (at most {max:.2} busy cores while idle, limit {BUSY_LIMIT})"
        )
    } else {
        format!(
            "machine check: NOT QUIET — {flagged} of {cases} cases started with other processes using up to {max:.2} cores (limit {BUSY_LIMIT}); the ratios hold better than the absolute figures: rerun on a quiet machine"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_lines_parse_and_busy_cores_follow() {
        let a = parse_cpu_line("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n").unwrap();
        assert_eq!(a, (150, 1000));
        // 2 cores, 200 jiffies elapsed of which 100 busy: one core busy.
        let b = parse_cpu_line("cpu  180 0 70 880 70 0 0 0 0 0\n").unwrap();
        assert_eq!(b, (250, 1200));
        assert!((busy_cores(a, b, 2) - 1.0).abs() < 1e-9);
        assert_eq!(busy_cores(a, a, 2), 0.0);
        for bad in ["", "cpu0 1 2 3 4", "cpu x y z w", "cpu 1 2"] {
            assert!(parse_cpu_line(bad).is_none(), "{bad:?}");
        }
    }
}
