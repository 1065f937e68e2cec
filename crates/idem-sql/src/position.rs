//! Log consumers' positions ([`PositionStore`]): one text per statement for
//! both dialects, and the store's methods, written once.

use idem_core::StoreError;
use idem_core::position::{Position, PositionStore};

use crate::dialect::{Dialect, On, Stmt, read_rows};
use crate::row;
use crate::store::SqlStore;

/// Stores `$4` (offset) for `$1` (group), `$2` (topic), `$3` (partition),
/// never lower than the stored offset.
pub const SAVE: &str = "\
INSERT INTO idem_positions (consumer_group, topic, partition_id, last_offset)
VALUES ($1, $2, $3, $4)
ON CONFLICT (consumer_group, topic, partition_id)
DO UPDATE SET last_offset = excluded.last_offset
WHERE idem_positions.last_offset < excluded.last_offset";

/// The partitions and offsets of `$1` (group) on `$2` (topic).
pub const LIST: &str = "\
SELECT partition_id, last_offset FROM idem_positions
WHERE consumer_group = $1 AND topic = $2 ORDER BY partition_id";

impl<D: Dialect> PositionStore for SqlStore<D> {
    async fn save_position(&self, tx: &mut D::Tx, position: &Position) -> Result<(), StoreError> {
        let d = &self.0;
        d.bounded(async {
            let s = Stmt::new(SAVE)
                .bind(position.group.as_str())
                .bind(position.topic.as_str())
                .bind(i64::from(position.partition))
                .bind(position.offset);
            D::execute(On::Conn(&mut **tx), s)
                .await
                .map_err(|e| d.map(e))?;
            Ok(())
        })
        .await
    }

    async fn positions(&self, group: &str, topic: &str) -> Result<Vec<(i32, i64)>, StoreError> {
        let d = &self.0;
        let s = Stmt::new(LIST).bind(group).bind(topic);
        read_rows(d, s, |r| {
            let partition = row::int(r, "partition_id")?;
            let partition = i32::try_from(partition).map_err(|_| StoreError::Corrupt {
                detail: format!("idem_positions.partition_id {partition} is not an i32"),
            })?;
            Ok((partition, row::int(r, "last_offset")?))
        })
        .await
    }
}
