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

/// A duration in the largest unit that shows it exactly.
#[derive(PartialEq, PartialOrd)]
struct Human(Duration);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d.subsec_nanos() != 0 {
            return if d.subsec_nanos().is_multiple_of(1_000_000) {
                write!(f, "{}ms", d.as_millis())
            } else {
                write!(f, "{d:?}")
            };
        }
        let s = d.as_secs();
        match s {
            0 => f.write_str("0s"),
            s if s.is_multiple_of(86_400) => write!(f, "{}d", s / 86_400),
            s if s.is_multiple_of(3_600) => write!(f, "{}h", s / 3_600),
            s if s.is_multiple_of(60) => write!(f, "{}min", s / 60),
            s => write!(f, "{s}s"),
        }
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
        assert_eq!(Human(Duration::from_nanos(1500)).to_string(), "1.5µs");
        assert_eq!(Human(Duration::from_secs(90)).to_string(), "90s");
    }
}
