//! Route paths: the patterns routes are written with, and the one form a
//! request's path is matched in.
//!
//! Servers read a path in more ways than one: `//v1/payments`,
//! `/v1/./payments`, `/v1/payments/`, `/v1/%70ayments`, `/V1/payments` and
//! `/v1/payments;x` all reach `/v1/payments` on some of them. A keyed route
//! must cover every spelling its upstream may act on, or a client (a base
//! URL with a trailing slash is enough) gets past the key: so a request's
//! path is [`normalized`] before it is matched — the forwarded request keeps
//! the path as the client sent it, and its fingerprint too, so each spelling
//! is its own request under the key.

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
            } else {
                segments.push(Segment::Literal(s.to_owned()));
            }
        }
        Ok(Self {
            segments: Some(segments),
        })
    }

    /// Whether `path` (without its query; [`normalized`] first) matches.
    /// Literal segments match whatever their letters' case: a path that
    /// differs from a keyed route only in case is keyed too.
    pub fn matches(&self, path: &str) -> bool {
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

    /// The value of the `{name}` segment in a matching `path`.
    pub fn param<'p>(&self, name: &str, path: &'p str) -> Option<&'p str> {
        let segments = self.segments.as_ref()?;
        let rest = path.strip_prefix('/')?;
        segments
            .iter()
            .zip(rest.split('/'))
            .find_map(|(s, p)| matches!(s, Segment::Param(n) if n == name).then_some(p))
    }
}

/// A path as routes are matched against it: percent-encoded unreserved
/// characters, `/` and `\\` decoded, `\\` read as `/`, each segment's
/// `;parameters` dropped, empty and `.` segments removed, `..` resolved,
/// no trailing `/`. Always starts with `/`.
pub(crate) fn normalized(path: &str) -> String {
    let decoded = decode_for_matching(path).replace('\\', "/");
    let mut out: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        let segment = segment.split(';').next().unwrap_or("");
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

/// `%XX` decoded where it stands for an unreserved character, `/` or `\\`;
/// any other escape is left as written.
fn decode_for_matching(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(b) = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            && (b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/' | b'\\'))
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

#[cfg(test)]
mod tests {
    use super::*;

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
        ] {
            assert!(
                p.matches(&normalized(path)),
                "{path} -> {}",
                normalized(path)
            );
        }
        for path in ["/v1/payments/x", "/v1/pay%20ments", "/v2/payments", "/"] {
            assert!(!p.matches(&normalized(path)), "{path}");
        }
        let with = PathPattern::parse("/v1/orders/{id}/refunds").unwrap();
        let n = normalized("//v1/orders/o%2D1/refunds/");
        assert!(with.matches(&n));
        assert_eq!(with.param("id", &n), Some("o-1"));
        assert_eq!(normalized(""), "/");
        assert_eq!(normalized("/../../etc"), "/etc");
    }
}
