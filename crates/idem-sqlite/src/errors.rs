//! Driver errors as [`StoreError`](idem_core::StoreError)s, by SQLite result code.

use std::time::Duration;

use idem_core::StoreError;

/// Whether a failed `COMMIT` may have reached the disk: an I/O error
/// (`IOERR`, 10) or a dead worker thread.
pub(crate) fn outcome_unknown(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::WorkerCrashed | sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => {
            db.code().and_then(|c| c.parse::<i64>().ok()).unwrap_or(0) & 0xff == 10
        }
        _ => false,
    }
}

/// Classifies a driver error. SQLite result codes: 5 `BUSY`, 6 `LOCKED`,
/// 8 `READONLY`, 10 `IOERR`, 13 `FULL`, 14 `CANTOPEN` (extended codes carry the
/// primary code in their low byte).
pub fn map_err(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::Database(db) => {
            let code = db.code().and_then(|c| c.parse::<i64>().ok()).unwrap_or(0) & 0xff;
            match code {
                5 | 6 => StoreError::Busy {
                    waited: Duration::ZERO,
                },
                8 | 10 | 13 | 14 => StoreError::Unavailable { source: e.into() },
                _ => StoreError::Database { source: e.into() },
            }
        }
        _ => idem_sql::store::map_client_err(e),
    }
}
