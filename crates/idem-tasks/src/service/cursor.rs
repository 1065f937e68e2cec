//! Moving a poller's cursor, its values compared as JSON.

use idem_core::Tenant;
use idem_core::steps::RunStore;
use idem_core::tasks::{CursorMove, PollerName, TaskStore};

use super::Tasks;
use crate::TasksError;
use crate::json::{Checked, canonical};

impl<S: TaskStore + RunStore> Tasks<S> {
    /// In `tx`: moves `poller`'s cursor from `expected` to `value`,
    /// comparing cursors as JSON values; `Ok(cursor as stored)` or the
    /// conflict. The store compares texts, so a cursor stored written
    /// otherwise than `expected` or `value` is judged here: equal to
    /// `value`, a repeat (`Ok` with it as stored); equal to `expected`,
    /// moved from its stored text — still only if it is there, so a
    /// poller that moved it meanwhile wins; else the conflict.
    pub(super) async fn move_cursor(
        tx: &mut S::Tx,
        (tenant, poller): (&Tenant, &PollerName),
        expected: Option<&Checked>,
        value: &Checked,
        now_ms: i64,
    ) -> Result<Result<(bool, String), Option<String>>, TasksError> {
        let mut from = expected.map(|e| e.text.clone());
        // Each try is from the stored text read after the last: three
        // tries end when pollers keep moving it between equal values.
        for _ in 0..3 {
            let moved = S::move_cursor(
                tx,
                tenant.as_str(),
                poller.as_str(),
                from.as_deref(),
                &value.text,
                now_ms,
            )
            .await?;
            let current = match moved {
                CursorMove::Moved => return Ok(Ok((false, value.text.clone()))),
                CursorMove::AlreadyThere => return Ok(Ok((true, value.text.clone()))),
                CursorMove::Conflict(None) => return Ok(Err(None)),
                CursorMove::Conflict(Some(current)) => current,
            };
            let at = canonical(&current);
            if at.as_deref() == Some(value.canonical.as_str()) {
                return Ok(Ok((true, current)));
            }
            match expected {
                Some(e)
                    if at.as_deref() == Some(e.canonical.as_str())
                        && from.as_deref() != Some(current.as_str()) =>
                {
                    from = Some(current);
                }
                _ => return Ok(Err(Some(current))),
            }
        }
        Ok(Err(from))
    }
}
