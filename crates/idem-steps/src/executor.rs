//! [`Executor`]: what every run executing in one process shares — the
//! store, the clock, the settings, the executor's name in leases.

use idem_core::SharedClock;
use idem_core::steps::RunStore;

use crate::config::RunsConfig;

/// What every run of one [`Runs`](crate::Runs) shares, and all a
/// [`Run`](crate::Run) reads of it: the workflows and the run slots stay
/// with `Runs`.
pub(crate) struct Executor<S: RunStore> {
    pub(crate) store: S,
    pub(crate) clock: SharedClock,
    pub(crate) config: RunsConfig,
    pub(crate) holder: String,
}

impl<S: RunStore> Executor<S> {
    pub(crate) fn lease_ms(&self) -> i64 {
        i64::try_from(self.config.lease.as_millis()).unwrap_or(i64::MAX / 4)
    }
}
