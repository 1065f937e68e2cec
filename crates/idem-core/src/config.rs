//! [`ConfigError`], the one error every `*Config` of the libraries returns
//! from its `validate()`.
//!
//! The convention: a config has public fields and `Default`; `validate()`
//! states each bound once and is called by the constructor that takes the
//! config, which returns this error. Nothing is clamped silently.

use std::fmt;
use std::time::Duration;

/// A configuration value out of its bounds: which component, which field,
/// what is allowed and what was given.
///
/// ```
/// use std::time::Duration;
/// use idem_core::ConfigError;
/// let e = ConfigError::check_duration("DispatcherConfig", "lease", Duration::ZERO,
///                                     Duration::from_secs(1), Duration::from_secs(3600))
///     .unwrap_err();
/// assert_eq!(e.to_string(), "DispatcherConfig.lease must be between 1s and 1h, got 0s");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{component}.{field} must be {allowed}, got {got}")]
pub struct ConfigError {
    /// The config type, e.g. `DispatcherConfig`.
    pub component: &'static str,
    /// The field, e.g. `lease`.
    pub field: &'static str,
    /// What is allowed, e.g. `between 1s and 1h`.
    pub allowed: String,
    /// The value given.
    pub got: String,
}

impl ConfigError {
    /// An error for `component.field`.
    pub fn new(
        component: &'static str,
        field: &'static str,
        allowed: impl Into<String>,
        got: impl fmt::Display,
    ) -> Self {
        Self {
            component,
            field,
            allowed: allowed.into(),
            got: got.to_string(),
        }
    }

    /// `Ok` when `min <= value <= max`.
    pub fn check_range<T: PartialOrd + fmt::Display>(
        component: &'static str,
        field: &'static str,
        value: T,
        min: T,
        max: T,
    ) -> Result<(), Self> {
        if min <= value && value <= max {
            Ok(())
        } else {
            Err(Self::new(
                component,
                field,
                format!("between {min} and {max}"),
                value,
            ))
        }
    }

    /// `Ok` when `min <= value <= max`, durations shown as `500ms`, `30s`,
    /// `1min`, `1h`, `400d`.
    pub fn check_duration(
        component: &'static str,
        field: &'static str,
        value: Duration,
        min: Duration,
        max: Duration,
    ) -> Result<(), Self> {
        Self::check_range(component, field, Human(value), Human(min), Human(max))
    }
}

impl ConfigError {
    /// `Ok` when `value >= min` (a duration with no upper bound).
    pub fn check_min_duration(
        component: &'static str,
        field: &'static str,
        value: Duration,
        min: Duration,
    ) -> Result<(), Self> {
        if value >= min {
            Ok(())
        } else {
            Err(Self::new(
                component,
                field,
                format!("at least {}", Human(min)),
                Human(value),
            ))
        }
    }

    /// `Ok` when `value` is not zero.
    pub fn check_nonzero(
        component: &'static str,
        field: &'static str,
        value: Duration,
    ) -> Result<(), Self> {
        if value.is_zero() {
            Err(Self::new(component, field, "above 0s", "0s"))
        } else {
            Ok(())
        }
    }
}

/// A duration as an operator types it, in the largest unit that shows it
/// exactly: `0s`, `250ms`, `90s`, `2min`, `1h`, `1d`, `400d`; `1500us` and
/// `1500ns` below a millisecond. The one formatter of the workspace: config
/// errors, command-line errors and reports all read alike, and every text
/// it writes reads back as the same duration through the command line's
/// parser (`humantime::parse_duration`).
///
/// ```
/// use std::time::Duration;
/// assert_eq!(idem_core::duration_text(Duration::from_secs(86_400)), "1d");
/// assert_eq!(idem_core::duration_text(Duration::from_millis(1_500)), "1500ms");
/// ```
pub fn duration_text(d: Duration) -> String {
    let nanos = d.subsec_nanos();
    if nanos != 0 {
        return if nanos.is_multiple_of(1_000_000) {
            format!("{}ms", d.as_millis())
        } else if nanos.is_multiple_of(1_000) {
            format!("{}us", d.as_micros())
        } else {
            format!("{}ns", d.as_nanos())
        };
    }
    match d.as_secs() {
        0 => "0s".into(),
        s if s.is_multiple_of(86_400) => format!("{}d", s / 86_400),
        s if s.is_multiple_of(3_600) => format!("{}h", s / 3_600),
        s if s.is_multiple_of(60) => format!("{}min", s / 60),
        s => format!("{s}s"),
    }
}

/// `value` within `lo..=hi`, or an error naming the flag (or setting),
/// with the durations written by [`duration_text`], as they are typed.
///
/// ```
/// use std::time::Duration;
/// let (lo, hi) = (Duration::from_secs(1), Duration::from_secs(86_400));
/// assert!(idem_core::duration_within("--every", Duration::from_secs(5), lo, hi).is_ok());
/// assert_eq!(
///     idem_core::duration_within("--every", Duration::ZERO, lo, hi).unwrap_err(),
///     "--every must be between 1s and 1d, got 0s"
/// );
/// ```
pub fn duration_within(
    flag: &str,
    value: Duration,
    lo: Duration,
    hi: Duration,
) -> Result<Duration, String> {
    if value < lo || value > hi {
        return Err(format!(
            "{flag} must be between {} and {}, got {}",
            duration_text(lo),
            duration_text(hi),
            duration_text(value)
        ));
    }
    Ok(value)
}

/// A duration compared as one and shown by [`duration_text`].
#[derive(PartialEq, PartialOrd)]
struct Human(Duration);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&duration_text(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_component_field_bounds_and_value() {
        let e = ConfigError::check_range("CollectorConfig", "batch_size", 0u32, 1, 100_000);
        assert_eq!(
            e.unwrap_err().to_string(),
            "CollectorConfig.batch_size must be between 1 and 100000, got 0"
        );
        assert!(ConfigError::check_range("C", "f", 1u32, 1, 1).is_ok());
        let ms = Duration::from_millis;
        let e = ConfigError::check_duration("C", "poll", ms(5), ms(10), ms(60_000));
        assert_eq!(
            e.unwrap_err().to_string(),
            "C.poll must be between 10ms and 1min, got 5ms"
        );
        let days = Duration::from_secs(401 * 86_400);
        let e = ConfigError::check_duration("C", "r", days, Duration::ZERO, ms(400 * 86_400_000));
        assert_eq!(
            e.unwrap_err().to_string(),
            "C.r must be between 0s and 400d, got 401d"
        );
        assert_eq!(Human(Duration::from_secs(90)).to_string(), "90s");
    }

    #[test]
    fn durations_read_as_typed() {
        let t = |ms: u64| duration_text(Duration::from_millis(ms));
        assert_eq!(t(0), "0s");
        assert_eq!(t(250), "250ms");
        assert_eq!(t(1500), "1500ms");
        assert_eq!(t(90_000), "90s");
        assert_eq!(t(120_000), "2min");
        assert_eq!(t(3_600_000), "1h");
        assert_eq!(t(86_400_000), "1d");
        assert_eq!(t(90_000_000), "25h");
        assert_eq!(t(400 * 86_400_000), "400d");
        assert_eq!(duration_text(Duration::from_nanos(1500)), "1500ns");
        assert_eq!(duration_text(Duration::from_micros(1500)), "1500us");
    }

    #[test]
    fn every_text_reads_back_through_the_cli_parser() {
        let mut durations = vec![
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_nanos(1500),
            Duration::from_micros(1500),
            Duration::from_millis(250),
            Duration::from_millis(1500),
            Duration::from_secs(90),
            Duration::from_secs(120),
            Duration::from_secs(3_600),
            Duration::from_secs(86_400),
            Duration::from_secs(90_000),
            Duration::from_secs(400 * 86_400),
            Duration::new(86_400, 1),
        ];
        // And a spread of others, every unit's boundary among them.
        let mut n: u64 = 7;
        for _ in 0..500 {
            n = n.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let secs = (n >> 40) % (400 * 86_400);
            let nanos = match n % 4 {
                0 => 0,
                1 => ((n >> 8) % 1_000) as u32 * 1_000_000,
                2 => ((n >> 8) % 1_000_000) as u32 * 1_000,
                _ => ((n >> 8) % 1_000_000_000) as u32,
            };
            durations.push(Duration::new(secs, nanos));
            durations.push(Duration::from_secs(secs - secs % 60));
            durations.push(Duration::from_secs(secs - secs % 3_600));
            durations.push(Duration::from_secs(secs - secs % 86_400));
        }
        for d in durations {
            let text = duration_text(d);
            assert_eq!(humantime::parse_duration(&text), Ok(d), "{text}");
        }
    }
}
