//! Whether a stream has a quorum: what a relay's or a consumer's readiness
//! asks.
//!
//! A cluster that lost two of three nodes keeps client connections up, and
//! the node left may still answer about the stream as its stalled leader.
//! Its answer lists the followers with `current` (which NATS 2.9 clears
//! only after its lost-quorum interval, 10 s) and `active`, the time since
//! the leader last heard from each: that time is what tells a dead copy
//! from a live one within seconds. A node left without its leader does not
//! answer at all until it holds an election it cannot win: a caller waits
//! for the answer only briefly.

use std::time::Duration;

use async_nats::jetstream::{self, Context};

use crate::{NatsError, nats_err};

/// How long a follower may go unheard by the stream's leader and still
/// count as a live copy. A NATS leader heartbeats its followers every
/// second (2.9's Raft `hbInterval`) but skips the heartbeat when it sent
/// entries within the last second, so a live follower can go almost two
/// seconds unheard while the stream is written now and then; the half
/// second above that absorbs a busy host. A follower unheard for longer is
/// taken for gone.
pub const FOLLOWER_SILENCE: Duration = Duration::from_millis(2500);

/// What a stream's leader says about the stream's copies
/// ([`stream_quorum`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamQuorum {
    /// A majority of the copies is live: the leader, and enough followers
    /// current and heard from within [`FOLLOWER_SILENCE`].
    pub held: bool,
    /// How long `held` stays true if no follower is heard from again: a
    /// caller that reuses the answer reuses it no longer than this.
    /// `Duration::ZERO` without a quorum; `Duration::MAX` for a stream
    /// that needs no follower (one copy, or a server not in a cluster).
    pub holds_for: Duration,
}

impl StreamQuorum {
    const LOST: Self = Self {
        held: false,
        holds_for: Duration::ZERO,
    };
    const ALONE: Self = Self {
        held: true,
        holds_for: Duration::MAX,
    };

    /// What the stream information `info` (from the stream's leader, or
    /// from a node that knows it has none) says.
    pub fn of(info: &jetstream::stream::Info) -> Self {
        let Some(cluster) = &info.cluster else {
            return Self::ALONE;
        };
        if cluster.leader.as_deref().is_none_or(str::is_empty) {
            return Self::LOST;
        }
        // Followers needed beside the leader for a majority of the copies.
        let needed = info.config.num_replicas.max(1) / 2;
        if needed == 0 {
            return Self::ALONE;
        }
        // How long each live follower stays live without a word.
        let mut left: Vec<Duration> = cluster
            .replicas
            .iter()
            .filter(|p| p.current && !p.offline)
            .filter_map(|p| FOLLOWER_SILENCE.checked_sub(p.active))
            .filter(|d| !d.is_zero())
            .collect();
        left.sort_unstable_by(|a, b| b.cmp(a));
        match left.get(needed - 1) {
            Some(&holds_for) => Self {
                held: true,
                holds_for,
            },
            None => Self::LOST,
        }
    }
}

/// Asks JetStream about the stream `name` and says whether it has a
/// quorum and for how long the answer holds ([`StreamQuorum::of`]). An
/// error is the request's: no answer, no such stream, no connection.
pub async fn stream_quorum(js: &Context, name: &str) -> Result<StreamQuorum, NatsError> {
    let stream = js.get_stream(name).await.map_err(nats_err)?;
    Ok(StreamQuorum::of(stream.cached_info()))
}

/// Whether the stream `name` answers and a majority of its copies is live
/// ([`stream_quorum`]'s `held`).
pub async fn stream_has_quorum(js: &Context, name: &str) -> Result<bool, NatsError> {
    Ok(stream_quorum(js, name).await?.held)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stream information as NATS 2.9.10 answered it in a three-node
    /// cluster, with the followers' `active` (nanoseconds) and flags given.
    fn info(
        leader: Option<&str>,
        replicas: u32,
        followers: &[(u64, bool)],
    ) -> jetstream::stream::Info {
        let peers: Vec<serde_json::Value> = followers
            .iter()
            .enumerate()
            .map(|(i, (active, current))| {
                serde_json::json!({"name": format!("n{}", i + 2), "current": current, "active": active, "peer": "p"})
            })
            .collect();
        let mut cluster = serde_json::json!({"name": "q", "replicas": peers});
        if let Some(leader) = leader {
            cluster["leader"] = leader.into();
        }
        let text = serde_json::json!({
            "config": {"name": "T", "subjects": ["t.>"], "num_replicas": replicas, "retention": "limits",
                       "max_consumers": -1, "max_msgs": -1, "max_bytes": -1, "max_age": 0,
                       "max_msg_size": -1, "storage": "file", "discard": "old", "duplicate_window": 120_000_000_000u64},
            "created": "2026-01-01T00:00:00Z",
            "state": {"messages": 0, "bytes": 0, "first_seq": 0, "first_ts": "0001-01-01T00:00:00Z",
                      "last_seq": 0, "last_ts": "0001-01-01T00:00:00Z", "consumer_count": 0},
            "cluster": cluster,
        });
        serde_json::from_value(text).unwrap()
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn a_majority_is_the_leader_and_the_followers_heard_from_lately() {
        let q = |leader, followers: &[(u64, bool)]| StreamQuorum::of(&info(leader, 3, followers));
        // Both heard from: it holds until the fresher one goes quiet.
        assert_eq!(
            q(Some("n1"), &[(300 * MS, true), (900 * MS, true)]),
            StreamQuorum {
                held: true,
                holds_for: Duration::from_millis(2200)
            }
        );
        // One follower gone: the other is enough.
        let one = q(Some("n1"), &[(9_600 * MS, true), (1_500 * MS, true)]);
        assert_eq!(one.holds_for, Duration::from_millis(1000));
        // Both unheard for longer than FOLLOWER_SILENCE, though NATS still
        // calls them current (as 2.9 does for 10 s): no quorum.
        assert_eq!(
            q(Some("n1"), &[(2_600 * MS, true), (9_600 * MS, true)]),
            StreamQuorum::LOST
        );
        // A follower that is not current does not count, however fresh.
        assert!(!q(Some("n1"), &[(10 * MS, false), (2_600 * MS, true)]).held);
        // No leader: no quorum.
        assert!(!q(None, &[(10 * MS, true), (10 * MS, true)]).held);
        assert!(!q(Some(""), &[(10 * MS, true), (10 * MS, true)]).held);
        // One copy in a cluster, five copies with two followers fresh.
        assert_eq!(
            StreamQuorum::of(&info(Some("n1"), 1, &[])),
            StreamQuorum::ALONE
        );
        let five = &[
            (100 * MS, true),
            (200 * MS, true),
            (9_000 * MS, true),
            (9_000 * MS, true),
        ];
        assert_eq!(
            StreamQuorum::of(&info(Some("n1"), 5, five)).holds_for,
            Duration::from_millis(2300)
        );
        let five = &[
            (100 * MS, true),
            (9_000 * MS, true),
            (9_000 * MS, true),
            (9_000 * MS, true),
        ];
        assert!(!StreamQuorum::of(&info(Some("n1"), 5, five)).held);
    }
}
