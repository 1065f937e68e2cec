//! The admin token: kept as its SHA-256 only, compared in constant time,
//! and refused at start-up when it is too easy to guess.
//!
//! The rule: 24 to 1024 visible ASCII characters, and at least
//! [`MIN_TOKEN_BITS`] bits by [`estimated_bits`] — a deliberately simple,
//! conservative estimate over the first 256 characters. Each character is
//! worth the bits of its own class (a letter log2(26), a digit log2(10),
//! another symbol 5; every character 4 when the token is hex digits with
//! letters of one case), except that a repetition of four or more
//! characters seen before (`passwordpassword`, `aaaa…`, `abababab`) and a
//! run that keeps a step of −1, 0 or +1 for a fourth character (`abcd`,
//! `4321`, `1111`) are worth nothing. 32 random hex digits score about 128
//! (never under 104 in 200,000 draws); `passwordpassword` 38. It cannot
//! know words or keyboard walks: generate the token
//! (`openssl rand -hex 32`) rather than choose it.

use std::fmt;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The shortest admin token accepted.
pub const MIN_TOKEN_LEN: usize = 24;
/// The longest admin token accepted.
pub const MAX_TOKEN_LEN: usize = 1024;
/// The fewest estimated bits an admin token must have.
pub const MIN_TOKEN_BITS: f64 = 96.0;
/// The command the refusals suggest.
pub const GENERATE: &str = "openssl rand -hex 32";

/// The admin bearer token. Only its SHA-256 is kept; `Debug` shows nothing.
#[derive(Clone)]
pub struct AdminToken([u8; 32]);

impl AdminToken {
    /// Validates a token: 24 to 1024 visible ASCII characters (it travels
    /// in a header) worth at least [`MIN_TOKEN_BITS`] by
    /// [`estimated_bits`]. The errors never quote the token, and name no
    /// flag or variable (the caller says where the token came from).
    pub fn new(token: &str) -> Result<Self, String> {
        if token.len() < MIN_TOKEN_LEN || token.len() > MAX_TOKEN_LEN {
            return Err(format!(
                "the admin token must be {MIN_TOKEN_LEN} to {MAX_TOKEN_LEN} characters, got {}; \
                 generate one with: {GENERATE}",
                token.len()
            ));
        }
        if !token.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err("the admin token must be visible ASCII (no spaces)".into());
        }
        let bits = estimated_bits(token.as_bytes());
        if bits < MIN_TOKEN_BITS {
            return Err(format!(
                "the admin token is too easy to guess: about {bits:.0} bits by Idem's estimate, \
                 at least {MIN_TOKEN_BITS:.0} needed (repeats, runs like abcd and small \
                 alphabets count little); generate one with: {GENERATE}"
            ));
        }
        Ok(Self(Sha256::digest(token.as_bytes()).into()))
    }

    /// Whether `candidate` is the token, in time independent of where they
    /// differ (both are hashed first, so their lengths leak nothing either).
    pub(crate) fn matches(&self, candidate: &[u8]) -> bool {
        let digest: [u8; 32] = Sha256::digest(candidate).into();
        bool::from(self.0[..].ct_eq(&digest[..]))
    }
}

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken([redacted])")
    }
}

/// The bits a character of `token` is worth on its own.
fn class_bits(b: u8, all_hex: bool) -> f64 {
    if all_hex {
        4.0
    } else if b.is_ascii_lowercase() || b.is_ascii_uppercase() {
        26f64.log2()
    } else if b.is_ascii_digit() {
        10f64.log2()
    } else {
        5.0
    }
}

/// The length of the longest earlier repetition of `token[i..]` (the
/// earlier copy may overlap it, as in `aaaa`).
fn repeat_len(token: &[u8], i: usize) -> usize {
    (0..i)
        .map(|j| {
            token[i..]
                .iter()
                .zip(&token[j..])
                .take_while(|(a, b)| a == b)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// How much of a token [`estimated_bits`] reads.
const ESTIMATED_LEN: usize = 256;

/// The estimate of how many bits of guessing `token` takes (see the
/// module's documentation), over its first 256 characters.
pub fn estimated_bits(token: &[u8]) -> f64 {
    // Enough to reach the minimum, and the work stays small.
    let token = &token[..token.len().min(ESTIMATED_LEN)];
    let all_hex = token.iter().all(u8::is_ascii_hexdigit)
        && token.iter().any(u8::is_ascii_alphabetic)
        && !(token.iter().any(u8::is_ascii_lowercase) && token.iter().any(u8::is_ascii_uppercase));
    let step = |a: u8, b: u8| i16::from(b) - i16::from(a);
    let mut bits = 0.0;
    let mut i = 0;
    while i < token.len() {
        let repeat = repeat_len(token, i);
        if repeat >= 4 {
            i += repeat;
            continue;
        }
        let run = i >= 3 && {
            let s = step(token[i - 1], token[i]);
            s.abs() <= 1
                && s == step(token[i - 2], token[i - 1])
                && s == step(token[i - 3], token[i - 2])
        };
        if !run {
            bits += class_bits(token[i], all_hex);
        }
        i += 1;
    }
    bits
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weak_tokens_are_refused_with_the_command_to_make_one() {
        for weak in [
            "aaaaaaaaaaaaaaaa",
            "passwordpassword",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "passwordpasswordpasswordpassword",
            "abcdefghijklmnopqrstuvwxyzabcdef",
            "01234567890123456789012345678901",
            "0123456789abcdef0123456789abcdef",
            "abcdefghijklmnopabcdefghijklmnop",
            "deadbeefdeadbeefdeadbeefdeadbeef",
            "111111111111111111111111111111111111111111",
            "123456789012345678901234",
            "abababababababababababababababab",
            "abcabcabcabcabcabcabcabcabcabcab",
        ] {
            let err = AdminToken::new(weak).unwrap_err();
            assert!(err.contains(GENERATE), "{weak}: {err}");
            assert!(!err.contains(weak), "the token is not quoted: {err}");
        }
        assert!(AdminToken::new("short").unwrap_err().contains("24 to 1024"));
    }

    #[test]
    fn generated_tokens_are_accepted() {
        for good in [
            // openssl rand -hex 16, -hex 32, -base64 24; uuidgen
            "3f9c2a7d81e04b6f95d2c8a1e7b30f46",
            "9e1d4c7ab2f85036de91a4c7b0e28f5d3a6c91e7f24b08d5c3a9e17f60b2d84c",
            "q3Zk9Vt2Lw8pXr1Ys6Nm4Bh7Jc0Fd5Ga",
            "7c9e6679-7425-40de-944b-e07fc1f90ae7",
            "Tr0ub4dor&3-Xq9!zK2@mW7#pL5$",
        ] {
            assert!(
                AdminToken::new(good).is_ok(),
                "{good}: {:.0} bits",
                estimated_bits(good.as_bytes())
            );
        }
    }

    #[test]
    fn random_hex_of_32_characters_passes_every_time() {
        // 2,000 draws from the operating system: the estimate leaves a
        // margin under the 128 bits such a token has (the lowest of 200,000
        // draws scored 104).
        for _ in 0..2000 {
            let mut bytes = [0u8; 16];
            getrandom::fill(&mut bytes).unwrap();
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            assert!(
                estimated_bits(hex.as_bytes()) >= MIN_TOKEN_BITS,
                "{hex}: {:.0}",
                estimated_bits(hex.as_bytes())
            );
        }
    }

    #[test]
    fn tokens_are_bounded_and_compared_whole() {
        assert!(AdminToken::new("has a space in it 3f9c2a7d81e04b6f").is_err());
        assert!(AdminToken::new(&"x".repeat(1025)).is_err());
        let token = "3f9c2a7d81e04b6f95d2c8a1e7b30f46";
        let t = AdminToken::new(token).unwrap();
        assert!(t.matches(token.as_bytes()));
        assert!(!t.matches(&token.as_bytes()[..31]));
        assert!(!t.matches(format!("{token}0").as_bytes()));
        assert!(!t.matches(b""));
        assert_eq!(format!("{t:?}"), "AdminToken([redacted])");
    }
}
