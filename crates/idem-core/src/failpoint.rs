//! Failpoints for crash drills: `IDEM_FAILPOINTS=name[=n],…` makes the process
//! abort (no unwinding, no cleanup: like `kill -9`) the n-th time (default the
//! first) it passes the named point. Unset, a failpoint costs one relaxed load.
//!
//! This is the one place the core reads its environment; it does so once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::OnceLock;

/// The environment variable naming the armed failpoints.
pub const ENV: &str = "IDEM_FAILPOINTS";

fn armed() -> &'static Option<Mutex<HashMap<String, u64>>> {
    static ARMED: OnceLock<Option<Mutex<HashMap<String, u64>>>> = OnceLock::new();
    ARMED.get_or_init(|| {
        let spec = std::env::var(ENV).ok()?;
        Some(Mutex::new(parse(&spec)))
    })
}

fn parse(spec: &str) -> HashMap<String, u64> {
    spec.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|item| match item.split_once('=') {
            Some((name, n)) => (name.trim().to_owned(), n.trim().parse().unwrap_or(1)),
            None => (item.trim().to_owned(), 1),
        })
        .collect()
}

/// Aborts the process if `name` is armed and this is its n-th pass.
pub fn hit(name: &str) {
    let Some(armed) = armed() else { return };
    let mut armed = armed.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(left) = armed.get_mut(name) {
        *left = left.saturating_sub(1);
        if *left == 0 {
            eprintln!("idem: failpoint {name} reached, aborting");
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_parsing() {
        let p = parse("relay.after_publish, consume.after_commit=3,,");
        assert_eq!(p.get("relay.after_publish"), Some(&1));
        assert_eq!(p.get("consume.after_commit"), Some(&3));
        assert_eq!(p.len(), 2);
        assert_eq!(parse("x=bad").get("x"), Some(&1));
    }

    #[test]
    fn unarmed_points_pass() {
        // The test runner does not set IDEM_FAILPOINTS.
        hit("never.armed");
    }
}
