//! Failpoints for crash drills: `IDEM_FAILPOINTS=name[=n],…` makes the process
//! abort (no unwinding, no cleanup: like `kill -9`) the n-th time (default the
//! first) it passes the named point.
//!
//! The machinery exists only with the `failpoints` feature, which only test
//! builds turn on (the `idem` binary that `idem-server`'s tests spawn). Without
//! it [`hit`] is an empty inline function, so a hit point compiles to nothing
//! and `IDEM_FAILPOINTS` is never read: a release build cannot be made to
//! abort by its environment. With it, an unset variable costs one relaxed load
//! per hit, and this is the one place the core reads its environment, once.

/// The environment variable naming the armed failpoints.
pub const ENV: &str = "IDEM_FAILPOINTS";

/// Whether this build has failpoints (the `failpoints` feature).
pub const ENABLED: bool = cfg!(feature = "failpoints");

/// Aborts the process if `name` is armed and this is its n-th pass. Without
/// the `failpoints` feature, does nothing.
#[inline(always)]
pub fn hit(name: &str) {
    #[cfg(feature = "failpoints")]
    armed::hit(name);
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}

#[cfg(feature = "failpoints")]
mod armed {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::OnceLock;

    fn armed() -> &'static Option<Mutex<HashMap<String, u64>>> {
        static ARMED: OnceLock<Option<Mutex<HashMap<String, u64>>>> = OnceLock::new();
        ARMED.get_or_init(|| {
            let spec = std::env::var(super::ENV).ok()?;
            Some(Mutex::new(parse(&spec)))
        })
    }

    pub(super) fn parse(spec: &str) -> HashMap<String, u64> {
        spec.split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|item| match item.split_once('=') {
                Some((name, n)) => (name.trim().to_owned(), n.trim().parse().unwrap_or(1)),
                None => (item.trim().to_owned(), 1),
            })
            .collect()
    }

    // Out of line: the hit points stay small, the slow path is here.
    #[inline(never)]
    pub(super) fn hit(name: &str) {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "failpoints")]
    #[test]
    fn spec_parsing() {
        let p = armed::parse("relay.after_publish, consume.after_commit=3,,");
        assert_eq!(p.get("relay.after_publish"), Some(&1));
        assert_eq!(p.get("consume.after_commit"), Some(&3));
        assert_eq!(p.len(), 2);
        assert_eq!(armed::parse("x=bad").get("x"), Some(&1));
    }

    #[test]
    fn unarmed_points_pass() {
        // The test runner does not set IDEM_FAILPOINTS.
        hit("never.armed");
    }
}
