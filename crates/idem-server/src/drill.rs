//! `idem drill`'s runner is the library crate [`idem_drill`]; this module
//! re-exports it, with [`run`] for a run that shows no progress.

pub use idem_drill::*;

/// [`idem_drill::run`] with the [`Quiet`] observer.
///
/// # Errors
/// [`Error::Unreachable`] when the very first request cannot connect.
pub async fn run(config: DrillConfig) -> Result<Report, Error> {
    idem_drill::run(config, &mut Quiet).await
}
