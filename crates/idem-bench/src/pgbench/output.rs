//! What pgbench prints: its summary and its per-transaction logs.

use std::time::Duration;

use anyhow::Context;

/// What pgbench's summary says.
#[derive(Debug, PartialEq)]
pub struct Summary {
    pub tps: f64,
    pub processed: u64,
    pub failed: u64,
}

/// Reads `tps = …`, `number of transactions actually processed: …` and
/// `number of failed transactions: …` (absent before PostgreSQL 15: zero).
pub fn parse_summary(text: &str) -> anyhow::Result<Summary> {
    let after = |prefix: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
    };
    let tps = after("tps = ")
        .and_then(|v| v.parse().ok())
        .context("no `tps = …` in pgbench's output")?;
    let processed = after("number of transactions actually processed: ")
        .and_then(|v| v.split('/').next())
        .and_then(|v| v.parse().ok())
        .context("no transaction count in pgbench's output")?;
    let failed = match after("number of failed transactions: ") {
        Some(v) => v.parse().context("failed transactions")?,
        None => 0,
    };
    Ok(Summary {
        tps,
        processed,
        failed,
    })
}

/// The latencies of a per-transaction log (`client transaction latency_us
/// script epoch_s epoch_us` per line).
pub fn parse_log(text: &str) -> anyhow::Result<Vec<Duration>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            l.split_whitespace()
                .nth(2)
                .and_then(|v| v.parse::<u64>().ok())
                .map(Duration::from_micros)
                .with_context(|| format!("pgbench log line {l:?}"))
        })
        .collect()
}

/// p50 and p99 (zero without values).
pub fn percentiles(values: &mut [Duration]) -> (Duration, Duration) {
    values.sort();
    let pct = |p: f64| {
        values
            .get(((values.len() as f64 * p) as usize).min(values.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    (pct(0.50), pct(0.99))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from pgbench 15.18 (`-n -M prepared -f bare.sql -c 2 -j 2 -T 1 -l`).
    const OUTPUT: &str = "pgbench (15.18 (Debian 15.18-0+deb12u1))
transaction type: bare.sql
scaling factor: 1
query mode: prepared
number of clients: 2
number of threads: 2
maximum number of tries: 1
duration: 1 s
number of transactions actually processed: 5353
number of failed transactions: 0 (0.000%)
latency average = 0.373 ms
initial connection time = 3.570 ms
tps = 5355.651047 (without initial connection time)
";

    #[test]
    fn pgbench_summary_parses() {
        assert_eq!(
            parse_summary(OUTPUT).unwrap(),
            Summary {
                tps: 5355.651047,
                processed: 5353,
                failed: 0
            }
        );
        let failing = OUTPUT.replace(
            "failed transactions: 0 (0.000%)",
            "failed transactions: 3 (0.056%)",
        );
        assert_eq!(parse_summary(&failing).unwrap().failed, 3);
        assert!(parse_summary("pgbench: error: connection failed").is_err());
    }

    #[test]
    fn pgbench_logs_give_percentiles() {
        // The first lines of the two logs of the run above.
        let log = "0 1 1237 0 1796375078 675928\n0 2 324 0 1796375078 676260\n\
                   0 3 283 0 1796375078 676546\n";
        let log2 = "1 1 1370 0 1796375078 676088\n1 2 313 0 1796375078 676407\n\
                    1 3 292 0 1796375078 676702\n";
        let mut all = parse_log(log).unwrap();
        all.extend(parse_log(log2).unwrap());
        assert_eq!(all.len(), 6);
        let (p50, p99) = percentiles(&mut all);
        assert_eq!(p50, Duration::from_micros(324));
        assert_eq!(p99, Duration::from_micros(1370));
        assert!(parse_log("0 1 x 0 1 2\n").is_err());
        assert_eq!(percentiles(&mut []), (Duration::ZERO, Duration::ZERO));
    }
}
