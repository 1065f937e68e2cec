//! Driver errors as [`StoreError`](idem_core::StoreError)s, by SQLSTATE.

use std::time::Duration;

use idem_core::StoreError;

/// A lock wait's `Busy`, with the wait it gave up after.
pub(crate) fn map_err_waited(e: sqlx::Error, wait: Duration) -> StoreError {
    match map_err(e) {
        StoreError::Busy { .. } => StoreError::Busy { waited: wait },
        other => other,
    }
}

/// Whether a prepared statement of Idem's was missing (`26000`): business
/// code ran `DEALLOCATE` on the connection.
pub(crate) fn lost_prepared(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db.code().as_deref() == Some("26000"),
        _ => false,
    }
}

/// Whether the connection broke (I/O error, connection exception `08…`, or the
/// server ended the session `57P0…`): the statement never ran.
pub(crate) fn connection_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("57P0")),
        _ => false,
    }
}

/// Classifies a driver error by SQLSTATE: `55P03` lock_not_available is
/// `Busy`; connection exceptions (`08…`), shutdowns (`57P0…`),
/// too-many-connections (`53300`), a statement cancelled by
/// `statement_timeout` (`57014`) and a session ended by
/// `idle_in_transaction_session_timeout` (`25P03`) are `Unavailable`; data
/// exceptions (`22…`: a NUL in text, a number out of range, …) and values too
/// large for an index (`54000`) are `InvalidValue`, the caller's input.
pub fn map_err(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            if code == "55P03" {
                StoreError::Busy {
                    waited: Duration::ZERO,
                }
            } else if code.starts_with("08")
                || code.starts_with("57P0")
                || ["53300", "57014", "25P03"].contains(&code.as_str())
            {
                StoreError::Unavailable { source: e.into() }
            } else if code.starts_with("22") || code == "54000" {
                StoreError::InvalidValue { source: e.into() }
            } else {
                StoreError::Database { source: e.into() }
            }
        }
        _ => idem_sql::store::map_client_err(e),
    }
}
