//! Ids and keys derived, never drawn: SHA-256 over length-prefixed parts
//! after a domain tag (runs, steps, tasks, actions share it).

use sha2::{Digest, Sha256};

/// SHA-256 over length-prefixed parts, after a domain tag: no two different
/// tuples hash alike, and ids of one kind never collide with another's.
pub(crate) fn digest(domain: &str, parts: &[&str]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(domain.as_bytes());
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p.as_bytes());
    }
    h.finalize().into()
}

/// Lowercase hex digits of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}
