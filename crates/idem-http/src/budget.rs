//! [`BodyBudget`]: the request body bytes a server holds at once, over every
//! request and for each [`Peer`].
//!
//! A server that reads request bodies into memory needs one bound over all
//! of them — many slow uploads at once must not exhaust memory — and a
//! share of it per peer, so that one peer announcing or sending many bodies
//! at once cannot take the whole: past its share it is refused while every
//! other peer keeps the rest.
//!
//! A [`Reservation`] holds bytes for one request: made when its body is
//! first read (its declared length, whole), grown as more arrives (a
//! chunked body), given back when dropped. A peer has an entry only while
//! it holds bytes, so the accounting is bounded by the requests in progress.
//!
//! ```
//! use idem_http::{BodyBudget, OverBudget, Peer};
//! use std::net::{IpAddr, Ipv4Addr};
//!
//! let budget = BodyBudget::new(64 << 20, 8 << 20)?;
//! let hog = Peer::of(Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))));
//! let held: Vec<_> = (0..8).map(|_| budget.reserve(hog, 1 << 20)).collect::<Result<_, _>>()?;
//! // Its share is spent; another peer still gets through.
//! assert_eq!(budget.reserve(hog, 1).unwrap_err(), OverBudget::Peer);
//! let other = Peer::of(Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2))));
//! assert!(budget.reserve(other, 1 << 20).is_ok());
//! drop(held);
//! assert_eq!((budget.held(), budget.peers()), (0, 0));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use idem_core::ConfigError;

/// The metric: request body bytes held now (a gauge, over the process).
pub const BODY_BYTES_BUFFERED: &str = "idem_http_body_bytes_buffered";
/// The metric: bodies refused for want of budget, by `bound` (`peer`,
/// `total`).
pub const BODY_BUDGET_REFUSALS: &str = "idem_http_body_budget_refusals_total";

/// Who a share of the budget belongs to: the TCP peer's address — an IPv4
/// address (IPv4-mapped IPv6 ones included), the first 64 bits of an IPv6
/// address (one host commonly holds a whole /64), or unknown (no peer
/// address, as in an in-process router; all such requests share one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Peer {
    /// An IPv4 address.
    V4([u8; 4]),
    /// The first 64 bits of an IPv6 address.
    V6([u8; 8]),
    /// No peer address known.
    Unknown,
}

impl Peer {
    /// The peer of an address.
    pub fn of(ip: Option<IpAddr>) -> Self {
        match ip {
            Some(IpAddr::V4(v4)) => Self::V4(v4.octets()),
            Some(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
                Some(v4) => Self::V4(v4.octets()),
                None => {
                    let mut prefix = [0u8; 8];
                    prefix.copy_from_slice(&v6.octets()[..8]);
                    Self::V6(prefix)
                }
            },
            None => Self::Unknown,
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::V4(octets) => write!(f, "{}", std::net::Ipv4Addr::from(*octets)),
            Self::V6(prefix) => {
                let mut octets = [0u8; 16];
                octets[..8].copy_from_slice(prefix);
                write!(f, "{}/64", std::net::Ipv6Addr::from(octets))
            }
            Self::Unknown => f.write_str("unknown"),
        }
    }
}

/// Why bytes were refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OverBudget {
    /// The peer holds its whole share.
    #[error("this peer holds its whole share of the request body budget")]
    Peer,
    /// The budget is spent, over all peers.
    #[error("the request body budget is spent")]
    Total,
}

impl OverBudget {
    /// The metric's `bound` label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Peer => "peer",
            Self::Total => "total",
        }
    }
}

/// The bytes held at once, over all requests and per peer. Cloning it
/// shares it.
#[derive(Clone)]
pub struct BodyBudget {
    shared: Arc<Shared>,
}

struct Shared {
    total: usize,
    per_peer: usize,
    tally: Mutex<Tally>,
}

#[derive(Default)]
struct Tally {
    held: usize,
    /// Only peers holding bytes: an entry goes when its peer's last byte
    /// is given back.
    peers: HashMap<Peer, usize>,
}

impl Shared {
    fn tally(&self) -> MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl fmt::Debug for BodyBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BodyBudget")
            .field("total", &self.shared.total)
            .field("per_peer", &self.shared.per_peer)
            .field("held", &self.held())
            .finish()
    }
}

impl BodyBudget {
    /// `total` bytes over all requests, `per_peer` of them at most for one
    /// peer (1 to `total`).
    pub fn new(total: usize, per_peer: usize) -> Result<Self, ConfigError> {
        ConfigError::check_range("BodyBudget", "total", total, 1, usize::MAX)?;
        ConfigError::check_range("BodyBudget", "per_peer", per_peer, 1, total)?;
        Ok(Self {
            shared: Arc::new(Shared {
                total,
                per_peer,
                tally: Mutex::default(),
            }),
        })
    }

    /// The bytes held at once over all requests.
    pub fn total(&self) -> usize {
        self.shared.total
    }

    /// The bytes one peer may hold at once.
    pub fn per_peer(&self) -> usize {
        self.shared.per_peer
    }

    /// Takes `bytes` for `peer` now, or says which bound refused them
    /// (nothing taken). Zero bytes are always granted.
    pub fn reserve(&self, peer: Peer, bytes: usize) -> Result<Reservation, OverBudget> {
        let mut r = Reservation {
            shared: self.shared.clone(),
            peer,
            bytes: 0,
        };
        r.grow(bytes)?;
        Ok(r)
    }

    /// The bytes held now, over all peers.
    pub fn held(&self) -> usize {
        self.shared.tally().held
    }

    /// The bytes `peer` holds now.
    pub fn held_by(&self, peer: Peer) -> usize {
        self.shared.tally().peers.get(&peer).copied().unwrap_or(0)
    }

    /// How many peers hold bytes now.
    pub fn peers(&self) -> usize {
        self.shared.tally().peers.len()
    }
}

/// Bytes held for one request, given back when dropped.
pub struct Reservation {
    shared: Arc<Shared>,
    peer: Peer,
    bytes: usize,
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("peer", &self.peer)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Reservation {
    /// The bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whose they are.
    pub fn peer(&self) -> Peer {
        self.peer
    }

    /// Takes `n` bytes more, or says which bound refused them (nothing
    /// taken; what is held stays held).
    pub fn grow(&mut self, n: usize) -> Result<(), OverBudget> {
        if n == 0 {
            return Ok(());
        }
        let refused = {
            let mut tally = self.shared.tally();
            let peer_holds = tally.peers.get(&self.peer).copied().unwrap_or(0);
            if peer_holds.saturating_add(n) > self.shared.per_peer {
                Some(OverBudget::Peer)
            } else if tally.held.saturating_add(n) > self.shared.total {
                Some(OverBudget::Total)
            } else {
                *tally.peers.entry(self.peer).or_default() += n;
                tally.held += n;
                self.bytes += n;
                metrics::gauge!(BODY_BYTES_BUFFERED).set(tally.held as f64);
                None
            }
        };
        match refused {
            Some(why) => {
                metrics::counter!(BODY_BUDGET_REFUSALS, "bound" => why.label()).increment(1);
                Err(why)
            }
            None => Ok(()),
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        let mut tally = self.shared.tally();
        tally.held = tally.held.saturating_sub(self.bytes);
        if let Some(left) = tally.peers.get_mut(&self.peer) {
            *left = left.saturating_sub(self.bytes);
            if *left == 0 {
                tally.peers.remove(&self.peer);
            }
        }
        metrics::gauge!(BODY_BYTES_BUFFERED).set(tally.held as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn v4(last: u8) -> Peer {
        Peer::of(Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, last))))
    }

    #[test]
    fn a_peer_holds_at_most_its_share_and_the_others_the_rest() {
        let budget = BodyBudget::new(100, 30).unwrap();
        let a = budget.reserve(v4(1), 20).unwrap();
        assert_eq!(budget.reserve(v4(1), 11).unwrap_err(), OverBudget::Peer);
        let mut b = budget.reserve(v4(1), 10).unwrap();
        assert_eq!(b.grow(1).unwrap_err(), OverBudget::Peer);
        assert_eq!(b.bytes(), 10, "a refused growth takes nothing");
        let others: Vec<_> = (2..=3)
            .map(|i| budget.reserve(v4(i), 30).unwrap())
            .collect();
        assert_eq!(budget.held(), 90);
        // 10 left over all peers: a fresh peer gets those and no more.
        assert_eq!(budget.reserve(v4(5), 11).unwrap_err(), OverBudget::Total);
        assert_eq!(budget.reserve(v4(5), 10).map(|r| r.bytes()), Ok(10));
        drop(a);
        assert_eq!(budget.held_by(v4(1)), 10);
        drop(b);
        assert_eq!(budget.held_by(v4(1)), 0);
        assert_eq!(budget.peers(), 2, "an entry goes with its last byte");
        drop(others);
        assert_eq!((budget.held(), budget.peers()), (0, 0));
    }

    #[test]
    fn zero_bytes_hold_no_entry() {
        let budget = BodyBudget::new(10, 10).unwrap();
        let r = budget.reserve(v4(1), 0).unwrap();
        assert_eq!(budget.peers(), 0);
        drop(r);
        assert_eq!(budget.peers(), 0);
    }

    #[test]
    fn a_share_must_fit_the_budget() {
        assert!(BodyBudget::new(10, 11).is_err());
        assert!(BodyBudget::new(10, 0).is_err());
        assert!(BodyBudget::new(0, 0).is_err());
        assert!(BodyBudget::new(10, 10).is_ok());
    }

    #[test]
    fn an_ipv6_peer_is_its_64_prefix_and_a_mapped_ipv4_its_address() {
        let a: Ipv6Addr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: Ipv6Addr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        let c: Ipv6Addr = "2001:db8:1:3::1".parse().unwrap();
        let of = |ip: Ipv6Addr| Peer::of(Some(IpAddr::V6(ip)));
        assert_eq!(of(a), of(b));
        assert_ne!(of(a), of(c));
        let mapped: Ipv6Addr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(of(mapped), v4(7));
        assert_eq!(of(a).to_string(), "2001:db8:1:2::/64");
        assert_eq!(Peer::of(None).to_string(), "unknown");
    }
}
