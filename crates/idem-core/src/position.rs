//! Consumer positions in an ordered log (a Kafka partition), kept in the
//! database beside the effects: [`PositionStore`].
//!
//! A log consumer that stores the offset of the last record it settled in
//! the **same transaction** as that record's effects resumes exactly where
//! its effects end after any crash: no record applied twice, none skipped.

use std::future::Future;

use crate::error::StoreError;
use crate::keys::KeyStore;

/// Where one consumer group stands in one partition of one topic: the
/// offset of the last record it settled (applied, skipped as a duplicate,
/// or dead-lettered). It resumes at `offset + 1`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Position {
    /// The consumer group (Kafka's `group.id`).
    pub group: String,
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The last settled record's offset.
    pub offset: i64,
}

impl Position {
    /// Whether `other` is in the same group, topic and partition.
    pub fn same_lane(&self, other: &Position) -> bool {
        self.partition == other.partition && self.topic == other.topic && self.group == other.group
    }
}

/// The table of consumer positions (`idem_positions`, keyed by group, topic
/// and partition).
pub trait PositionStore: KeyStore {
    /// Records `position` in `tx`, which also holds the record's effects. A
    /// position never moves backwards: a lower offset than the stored one
    /// leaves the stored one (a late writer after a rebalance is harmless).
    fn save_position(
        &self,
        tx: &mut Self::Tx,
        position: &Position,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The stored `(partition, last settled offset)` pairs of `group` on
    /// `topic`, by partition.
    fn positions(
        &self,
        group: &str,
        topic: &str,
    ) -> impl Future<Output = Result<Vec<(i32, i64)>, StoreError>> + Send;
}
