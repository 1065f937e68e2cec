//! Route paths: the patterns routes are written with, and the readings a
//! request's path is matched in.
//!
//! Servers read a path in more ways than one: `//v1/payments`,
//! `/v1/./payments`, `/v1/payments/`, `/v1/%70ayments`, `/V1/payments`,
//! `/v1/payments;x` and `/v1%2Fpayments` all reach `/v1/payments` on some
//! of them, while others read `%2F` and `;x` as part of a segment. A keyed
//! route must cover every spelling its upstream may act on, or a client (a
//! base URL with a trailing slash is enough) gets past the key: so a
//! request's path is read every plausible way ([`readings`]) and a route
//! covers it when any reading matches. The forwarded request keeps the path
//! as the client sent it, and its fingerprint too, so each spelling is its
//! own request under the key. A `{param}` a lookup needs is taken only when
//! every matching reading gives it the same value.

/// A path: literal segments and `{param}` segments that match any one
/// non-empty segment; `*` matches every path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    segments: Option<Vec<Segment>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param(String),
}

impl PathPattern {
    /// Every path.
    pub fn any() -> Self {
        Self { segments: None }
    }

    /// Parses `/v1/payments/{id}/refunds`.
    pub fn parse(pattern: &str) -> Result<Self, String> {
        if pattern == "*" {
            return Ok(Self::any());
        }
        let Some(rest) = pattern.strip_prefix('/') else {
            return Err(format!("{pattern:?} does not start with /"));
        };
        if pattern.len() > 1024 {
            return Err("longer than 1024 characters".into());
        }
        let mut segments = Vec::new();
        for s in rest.split('/') {
            if s.starts_with('{') || s.ends_with('}') {
                let name = s
                    .strip_prefix('{')
                    .and_then(|s| s.strip_suffix('}'))
                    .filter(|n| {
                        !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    });
                let Some(name) = name else {
                    return Err(format!("{pattern:?}: {s:?} is not a {{param}} segment"));
                };
                segments.push(Segment::Param(name.to_owned()));
            } else if s
                .chars()
                .any(|c| c.is_control() || c == ' ' || c == '?' || c == '#' || c == '{')
            {
                return Err(format!("{pattern:?}: {s:?} is not a path segment"));
            } else if (s.is_empty() && pattern != "/")
                || s == "."
                || s == ".."
                || s.contains(['%', ';', '\\'])
            {
                // A request is matched in its normalised readings; a
                // pattern written otherwise would match none of them.
                return Err(format!(
                    "{pattern:?}: write the path normalised (no empty, . or .. segment, no \
                     trailing /, no %-escape, ;parameter or \\): every spelling of it is keyed"
                ));
            } else {
                segments.push(Segment::Literal(s.to_owned()));
            }
        }
        Ok(Self {
            segments: Some(segments),
        })
    }

    /// Whether one reading of a path ([`readings`]) matches.
    /// Literal segments match whatever their letters' case: a path that
    /// differs from a keyed route only in case is keyed too.
    fn matches(&self, path: &str) -> bool {
        let Some(segments) = &self.segments else {
            return true;
        };
        let Some(rest) = path.strip_prefix('/') else {
            return false;
        };
        let mut parts = rest.split('/');
        for s in segments {
            match (s, parts.next()) {
                (Segment::Literal(l), Some(p)) if l.eq_ignore_ascii_case(p) => {}
                (Segment::Param(_), Some(p)) if !p.is_empty() => {}
                _ => return false,
            }
        }
        parts.next().is_none()
    }

    /// Whether the pattern has a `{name}` segment.
    pub fn has_param(&self, name: &str) -> bool {
        self.segments
            .iter()
            .flatten()
            .any(|s| matches!(s, Segment::Param(n) if n == name))
    }

    /// Whether any reading of `path` (as sent, without its query)
    /// matches.
    pub fn covers(&self, path: &str) -> bool {
        all_readings(path).iter().any(|r| self.matches(r))
    }

    /// The value of the `{name}` segment of `path` (as sent), percent-decoded
    /// as the upstream reads it: the same in every reading that matches, or
    /// an error saying why it cannot be told.
    pub fn param(&self, name: &str, path: &str) -> Result<String, String> {
        let mut values = all_readings(path)
            .into_iter()
            .filter(|r| self.matches(r))
            .filter_map(|r| self.segment(name, &r).map(percent_decoded));
        let Some(first) = values.next() else {
            return Err(format!("the path has no {{{name}}} segment"));
        };
        if values.any(|v| v != first) {
            return Err(format!(
                "the path's {{{name}}} segment reads differently on different servers (an \
                 escaped / or a ;parameter in it): it cannot be looked up"
            ));
        }
        Ok(first)
    }

    fn segment<'p>(&self, name: &str, reading: &'p str) -> Option<&'p str> {
        let segments = self.segments.as_ref()?;
        let rest = reading.strip_prefix('/')?;
        segments
            .iter()
            .zip(rest.split('/'))
            .find_map(|(s, p)| matches!(s, Segment::Param(n) if n == name).then_some(p))
    }
}

/// How many times a path is decoded in search of a control character: a
/// path escaped more often than this is refused.
const MAX_DECODINGS: usize = 8;

/// Why `path` cannot be read the same way by every server, if it cannot:
/// a control character (NUL, CR, LF, TAB, DEL, …, and the C1 controls
/// U+0080 to U+009F such as NEL), raw or escaped — once or more (`%2500`
/// decodes to `%00`, then to NUL) —, a `%` that does not start an escape
/// (`%0`, `%zz`, `%u0000`), or escapes that do not decode to UTF-8, however
/// often decoded (an overlong `%C0%80`, or `%25C0%2580` read twice, is a
/// NUL to some decoders). An upstream that stops reading a path at NUL
/// reads `/v1/payments%00` as `/v1/payments`: such a path would slip past
/// the route's key, so it is refused, never passed through.
pub(crate) fn unreadable(path: &str) -> Option<&'static str> {
    let mut bytes = path.as_bytes().to_vec();
    for depth in 0..=MAX_DECODINGS {
        // Each decoding is UTF-8 (the path itself is, and so is each
        // decoding checked below): its characters are what a reader sees.
        let text = String::from_utf8_lossy(&bytes);
        if text.chars().any(char::is_control) {
            return Some(
                "the path holds a control character (NUL, CR, LF, TAB, DEL and the like), raw or \
                 %-escaped",
            );
        }
        let Some(decoded) = decode_once(&bytes, depth == 0) else {
            return Some("the path has a % that does not start an escape (%XX, two hex digits)");
        };
        if decoded.len() == bytes.len() {
            return None;
        }
        if std::str::from_utf8(&decoded).is_err() {
            return Some("the path's escapes do not decode to UTF-8");
        }
        bytes = decoded;
    }
    Some("the path is %-escaped more than 8 times over")
}

/// `bytes` with each `%XX` decoded; a `%` that starts no escape is `None`
/// when `strict`, kept as it is otherwise (a decoded `%`).
fn decode_once(bytes: &[u8], strict: bool) -> Option<Vec<u8>> {
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let pair = bytes
                .get(i + 1)
                .copied()
                .and_then(hex)
                .zip(bytes.get(i + 2).copied().and_then(hex));
            match pair {
                Some((h, l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                None if strict => return None,
                None => {}
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    Some(out)
}

/// Whether `path` has a `..` segment, in some reading, that climbs above
/// the root: an upstream with a base path (`http://host/api`) would read it
/// outside what the routes name, so it is refused, never passed through.
pub(crate) fn climbs_above_root(path: &str) -> bool {
    decodings(path).iter().any(|path| climbs(path))
}

fn climbs(path: &str) -> bool {
    [true, false].into_iter().any(|slashes| {
        let decoded = slashes_read(path, slashes);
        let mut depth = 0usize;
        for segment in decoded.split('/') {
            match segment.split(';').next().unwrap_or("") {
                "" | "." => {}
                ".." if depth == 0 => return true,
                ".." => depth -= 1,
                _ => depth += 1,
            }
        }
        false
    })
}

/// The path as sent, then as read by servers that decode it more than
/// once (a proxy that decodes before forwarding, a framework that decodes
/// again): each decoding that still holds a `%` (`/v1/pay%256Dents` is
/// `/v1/pay%6Dents` once decoded, which reads `/v1/payments`), at most
/// [`MAX_DECODINGS`] deep. A path whose decodings are not UTF-8 is refused
/// before it is matched ([`unreadable`]).
fn decodings(path: &str) -> Vec<String> {
    let mut out = vec![path.to_owned()];
    let mut bytes = path.as_bytes().to_vec();
    for _ in 0..MAX_DECODINGS {
        let Some(decoded) = decode_once(&bytes, false) else {
            break;
        };
        if decoded.len() == bytes.len() || !decoded.contains(&b'%') {
            break;
        }
        out.push(String::from_utf8_lossy(&decoded).into_owned());
        bytes = decoded;
    }
    out
}

/// [`readings`] of every one of `path`'s [`decodings`]: a keyed route
/// covers a spelling that reaches it only once decoded twice, so such a
/// path is keyed, never passed through unkeyed.
fn all_readings(path: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for decoded in decodings(path) {
        for r in readings(&decoded) {
            if !out.contains(&r) {
                out.push(r);
            }
        }
    }
    out
}

/// Every way a server may read `path`: percent-encoded unreserved
/// characters decoded, empty and `.` segments removed, `..` resolved, no
/// trailing `/` — with `%2F`, `%5C` and `\\` read as `/` or kept inside
/// their segment, and each segment's `;parameters` dropped or kept. Each
/// starts with `/`; no two are the same.
pub(crate) fn readings(path: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(4);
    for slashes in [true, false] {
        for params in [true, false] {
            let r = reading(path, slashes, params);
            if !out.contains(&r) {
                out.push(r);
            }
        }
    }
    out
}

/// `path` decoded for matching, with `\\` read as `/` when `slashes`.
fn slashes_read(path: &str, slashes: bool) -> String {
    let decoded = decode_for_matching(path, slashes);
    if slashes {
        decoded.replace('\\', "/")
    } else {
        decoded
    }
}

fn reading(path: &str, slashes: bool, drop_params: bool) -> String {
    let decoded = slashes_read(path, slashes);
    let mut out: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        let segment = if drop_params {
            segment.split(';').next().unwrap_or("")
        } else {
            segment
        };
        match segment {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    format!("/{}", out.join("/"))
}

/// `%XX` decoded where it stands for an unreserved character (and, with
/// `slashes`, `/` or `\\`); any other escape is left as written.
fn decode_for_matching(path: &str, slashes: bool) -> String {
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(b) = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            && (b.is_ascii_alphanumeric()
                || matches!(b, b'-' | b'.' | b'_' | b'~')
                || (slashes && matches!(b, b'/' | b'\\')))
        {
            out.push(b as char);
            i += 3;
            continue;
        }
        // The path of a parsed URI is ASCII; anything else is kept as is.
        let c = path[i..].chars().next().unwrap_or('\u{fffd}');
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// A path segment as the upstream reads it (`%XX` decoded; invalid UTF-8
/// replaced).
fn percent_decoded(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(h), Some(l)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_are_written_normalised() {
        for bad in [
            "/v1/payments/",
            "//v1/payments",
            "/v1//payments",
            "/v1/./payments",
            "/v1/../payments",
            "/v1/%70ayments",
            "/v1/payments;x",
            "/v1\\payments",
        ] {
            let e = PathPattern::parse(bad).unwrap_err();
            assert!(e.contains("normalised"), "{bad}: {e}");
        }
        assert!(PathPattern::parse("/").unwrap().covers("//"));
        assert!(PathPattern::parse("/v1/payments").is_ok());
    }

    #[test]
    fn a_path_with_a_control_character_is_unreadable() {
        for path in [
            "/v1/payments\0",
            "/v1/payments\x7f",
            "/v1/payments%00",
            "/v1/pay%0Aments",
            "/v1/payments%0d%0a",
            "/v1/payments%09",
            "/v1/payments%1F",
            "/v1/payments%7f",
            "/v1/payments%2500",
            "/v1/payments%25252500",
            "/v1/payments%C0%80",
            // An overlong NUL escaped again, and C1 control characters
            // (U+0080 to U+009F: NEL is a line end to some readers).
            "/v1/payments%25C0%2580",
            "/v1/payments%25c0%25%38%30",
            "/v1/payments%C2%85",
            "/v1/payments%c2%80",
            "/v1/payments%25C2%2585",
            "/v1/payments\u{85}",
            "/v1/payments%ff",
            "/v1/payments%",
            "/v1/payments%0",
            "/v1/payments%zz",
            "/v1/payments%u0000",
            &format!("/v1/payments%{}41", "25".repeat(9)),
        ] {
            assert!(unreadable(path).is_some(), "{path}");
        }
        for path in [
            "/v1/payments",
            "/v1/%70ayments",
            "/v1/pay%20ments",
            "/v1%2Fpayments",
            "/v1/items/100%25",
            "/v1/items/100%2541",
            "/v1/caf%C3%A9",
            "/v1/caf\u{e9}",
            &format!("/v1/payments%{}41", "25".repeat(7)),
        ] {
            assert_eq!(unreadable(path), None, "{path}");
        }
        // A long path costs a pass per decoding, at most 9.
        let deep = format!("/%{}41", "25".repeat(20_000));
        assert!(unreadable(&deep).unwrap().contains("8 times"));
        assert_eq!(unreadable(&format!("/{}", "%2525".repeat(20_000))), None);
    }

    #[test]
    fn a_path_that_climbs_above_the_root_is_told() {
        for path in [
            "/../api/v1/payments",
            "/%2e%2e/api/v1/payments",
            "/v1/../../api/v1/payments",
            "/v1%2F..%2F..%2Fapi",
            "/..;x/api",
            // Climbing once decoded twice.
            "/%252e%252e/api",
            "/v1/%252E%252E/%252e%252e/x",
        ] {
            assert!(climbs_above_root(path), "{path}");
        }
        for path in [
            "/v1/payments",
            "/v1/x/../payments",
            "/v1/./payments",
            "/a..b/c",
        ] {
            assert!(!climbs_above_root(path), "{path}");
        }
    }

    #[test]
    fn every_spelling_of_a_keyed_path_is_matched() {
        let p = PathPattern::parse("/v1/payments").unwrap();
        for path in [
            "/v1/payments",
            "/v1/payments/",
            "//v1/payments",
            "/v1//payments",
            "/v1/./payments",
            "/v1/x/../payments",
            "/v1/%70ayments",
            "/V1/Payments",
            "/v1/payments;jsessionid=1",
            "/v1/payments%2F",
            "/v1%2Fpayments",
            "/v1\\payments",
            "/v1%5Cpayments",
            // What a server that decodes twice reads as the route.
            "/v1/pay%256Dents",
            "/v1/x/%252e%252e/payments",
            "/v1%252Fpayments",
            "/v1/%25%37%30ayments",
        ] {
            assert!(p.covers(path), "{path} -> {:?}", all_readings(path));
        }
        for path in [
            "/v1/payments/x",
            "/v1/pay%20ments",
            "/v1/pay%2520ments",
            "/v2/payments",
            "/",
        ] {
            assert!(!p.covers(path), "{path}");
        }
        assert_eq!(readings(""), ["/"]);
        assert_eq!(readings("/../../etc"), ["/etc"]);
    }

    #[test]
    fn a_param_is_read_as_the_upstream_reads_it_or_not_at_all() {
        let with = PathPattern::parse("/v1/orders/{id}/refunds").unwrap();
        assert_eq!(
            with.param("id", "//v1/orders/o%2D1/refunds/").as_deref(),
            Ok("o-1")
        );
        assert_eq!(
            with.param("id", "/v1/orders/o%201/refunds").as_deref(),
            Ok("o 1")
        );
        // An escaped slash inside the id: keyed (one reading matches), and
        // the id is the whole segment.
        assert!(with.covers("/v1/orders/a%2Fb/refunds"));
        assert_eq!(
            with.param("id", "/v1/orders/a%2Fb/refunds").as_deref(),
            Ok("a/b")
        );
        // A ;parameter: one server reads id 1, another 1;1 — not looked up.
        assert!(with.covers("/v1/orders/1;1/refunds"));
        let e = with.param("id", "/v1/orders/1;1/refunds").unwrap_err();
        assert!(e.contains("differently"), "{e}");
        assert!(with.param("id", "/v1/orders").is_err());
        assert!(with.param("nope", "/v1/orders/1/refunds").is_err());
    }
}
