//! `on_unknown = "verify"`: the seed's *idempotency by validation*. A
//! forward whose outcome is unknown (sent, and no usable answer came back)
//! is not sent again blindly: the gateway asks the upstream whether the
//! intent landed, with a lookup keyed by something it sent — the derived
//! key, a field of the request body (a payment's `reference`) or a segment
//! of its path.
//!
//! - Found: the found resource is stored as the request's answer (with
//!   [`Verify::status`]) and every retry replays it.
//! - Not found, and the [landing window](Verify::landing) since the outcome
//!   became unknown has passed: nothing the gateway sent can land any more,
//!   so the request is forwarded again (with the same derived key).
//! - Not found within the window, or the lookup failed: still unknown; the
//!   client gets `409 outcome-unknown` with `Retry-After` and the record
//!   keeps the time the outcome became unknown.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::Value;

use crate::path::PathPattern;

/// Default [`Verify::landing`].
pub const DEFAULT_LANDING: Duration = Duration::from_secs(60);
/// The bounds of [`Verify::landing`]: never zero, a forward the gateway
/// gave up on may still be running upstream.
pub const LANDING_RANGE: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(24 * 3600));
/// The longest lookup template.
const MAX_TEMPLATE: usize = 2048;

/// A route's lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verify {
    target: Vec<Piece>,
    found: Option<String>,
    /// The status a found answer is stored and replayed with.
    pub status: StatusCode,
    /// How long after a forward's outcome became unknown a request the
    /// gateway sent may still land upstream: a lookup that finds nothing
    /// earlier is not trusted, and nothing is forwarded again before.
    pub landing: Duration,
    /// JSON pointers whose values a found resource shares with the request;
    /// one that does not is another intent's (another caller's reused
    /// reference), not this one's.
    matching: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Literal(String),
    /// The derived key the gateway sends upstream.
    Key,
    /// A field of the request body (a JSON pointer; for a form body its
    /// segments name the field as `a[b][c]`).
    Body(String),
    /// A `{param}` segment of the route's path.
    Param(String),
}

/// What the lookup said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The intent landed: this body is its answer.
    Found {
        /// The answer's media type.
        content_type: String,
        /// The answer's body.
        body: Vec<u8>,
    },
    /// The upstream has no trace of it.
    NotFound,
    /// No usable answer: the outcome is still unknown.
    Failed(String),
}

fn invalid(text: String) -> String {
    text
}

/// A route's `verify*` and `landing` settings, as written.
#[derive(Debug, Clone, Copy, Default)]
pub struct VerifySettings<'a> {
    /// `verify`: `GET /path?query` with placeholders.
    pub lookup: &'a str,
    /// `verify_found`: a JSON pointer into the lookup's answer.
    pub found: Option<&'a str>,
    /// `verify_status`.
    pub status: Option<u16>,
    /// `landing`.
    pub landing: Option<&'a str>,
    /// `verify_match`: JSON pointers whose values the found resource must
    /// share with the request (default: the body fields the lookup names).
    pub matching: Option<&'a [String]>,
}

impl Verify {
    /// Parses the `verify*` and `landing` settings of a route on `path`;
    /// the error names the setting.
    pub fn parse(settings: VerifySettings<'_>, path: &PathPattern) -> Result<Self, String> {
        let VerifySettings {
            lookup,
            found,
            status,
            landing,
            matching,
        } = settings;
        if lookup.len() > MAX_TEMPLATE {
            return Err(invalid(format!(
                "verify: longer than {MAX_TEMPLATE} characters"
            )));
        }
        let Some(target) = lookup.strip_prefix("GET ") else {
            return Err(invalid(format!(
                "verify: {lookup:?} must be \"GET /path?query\": a lookup reads, it never acts"
            )));
        };
        let target = target.trim();
        if !target.starts_with('/')
            || target.starts_with("//")
            || target.contains(['#', ' '])
            || !target.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(invalid(format!(
                "verify: {target:?} is not a path and query starting with one / (visible ASCII)"
            )));
        }
        let mut pieces = Vec::new();
        let mut rest = target;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                pieces.push(Piece::Literal(rest[..open].to_owned()));
            }
            let Some(close) = rest[open..].find('}') else {
                return Err(invalid(format!("verify: an unclosed {{ in {target:?}")));
            };
            let name = &rest[open + 1..open + close];
            pieces.push(match name {
                "key" => Piece::Key,
                p if p.starts_with('/') => {
                    if !valid_pointer(p) {
                        return Err(invalid(format!("verify: {{{p}}} is not a JSON pointer")));
                    }
                    Piece::Body(p.to_owned())
                }
                p if path.has_param(p) => Piece::Param(p.to_owned()),
                p => {
                    return Err(invalid(format!(
                        "verify: {{{p}}} is neither {{key}}, a {{/json/pointer}} into the body, nor \
                         a {{param}} of the route's path"
                    )));
                }
            });
            rest = &rest[open + close + 1..];
        }
        if rest.contains('}') {
            return Err(invalid(format!("verify: a stray }} in {target:?}")));
        }
        if !rest.is_empty() {
            pieces.push(Piece::Literal(rest.to_owned()));
        }
        if !pieces.iter().any(|p| !matches!(p, Piece::Literal(_))) {
            return Err(invalid(format!(
                "verify: {target:?} names nothing of the request ({{key}}, {{/field}} or \
                 {{param}}): it cannot tell one intent from another"
            )));
        }
        if let Some(p) = found
            && !(p.is_empty() || valid_pointer(p))
        {
            return Err(invalid(format!(
                "verify_found: {p:?} is not a JSON pointer"
            )));
        }
        let status = match status {
            None => StatusCode::OK,
            Some(s) if (200..=299).contains(&s) && s != 204 && s != 205 => StatusCode::from_u16(s)
                .map_err(|_| invalid(format!("verify_status: {s} is not a status")))?,
            Some(s) => {
                return Err(invalid(format!(
                    "verify_status: {s} is not a 2xx status with a body (a found intent \
                     succeeded, and its answer is what was found)"
                )));
            }
        };
        let landing = match landing {
            None => DEFAULT_LANDING,
            Some(text) => {
                let d = humantime::parse_duration(text)
                    .map_err(|e| invalid(format!("landing: {text:?} is not a duration ({e})")))?;
                idem_core::ConfigError::check_duration(
                    "gateway.routes",
                    "landing",
                    d,
                    LANDING_RANGE.0,
                    LANDING_RANGE.1,
                )
                .map_err(|e| e.to_string())?;
                d
            }
        };
        let matching = match matching {
            Some(list) => {
                if let Some(p) = list.iter().find(|p| !valid_pointer(p)) {
                    return Err(invalid(format!(
                        "verify_match: {p:?} is not a JSON pointer"
                    )));
                }
                list.to_vec()
            }
            None => pieces
                .iter()
                .filter_map(|p| match p {
                    Piece::Body(pointer) => Some(pointer.clone()),
                    _ => None,
                })
                .collect(),
        };
        Ok(Self {
            target: pieces,
            found: found.filter(|p| !p.is_empty()).map(str::to_owned),
            status,
            landing,
            matching,
        })
    }

    /// The body pointers the lookup and `verify_match` read.
    pub fn pointers(&self) -> impl Iterator<Item = &str> {
        let looked = self.target.iter().filter_map(|p| match p {
            Piece::Body(pointer) => Some(pointer.as_str()),
            _ => None,
        });
        looked.chain(self.matching.iter().map(String::as_str))
    }

    /// Whether a request carries every value the lookup needs, so it can
    /// be verified should its outcome become unknown: checked before
    /// anything is forwarded. The error says what is missing.
    pub fn check(
        &self,
        content_type: Option<&str>,
        body: &[u8],
        path: &str,
        route: &PathPattern,
    ) -> Result<(), String> {
        let fields = Fields::of(content_type, body);
        if let Fields::None = fields
            && (self.target.iter().any(|p| matches!(p, Piece::Body(_)))
                || !self.matching.is_empty())
        {
            return Err(
                "the request body is neither JSON (Content-Type application/json) nor a form \
                 (application/x-www-form-urlencoded) that parses: this route verifies unknown \
                 outcomes by its fields"
                    .into(),
            );
        }
        self.target("", content_type, body, path, route)?;
        match self.matching.iter().find(|p| !fields.has_text(p)) {
            Some(p) => Err(format!(
                "the request body has no {p} (a string of 1 to 1024 characters): this route \
                 tells its own intent from another's by it (verify_match)"
            )),
            None => Ok(()),
        }
    }

    /// The lookup's path and query for one request, every value
    /// percent-encoded.
    pub fn target(
        &self,
        key: &str,
        content_type: Option<&str>,
        body: &[u8],
        path: &str,
        route: &PathPattern,
    ) -> Result<String, String> {
        let mut out = String::new();
        let mut parsed = None;
        for piece in &self.target {
            match piece {
                Piece::Literal(l) => out.push_str(l),
                Piece::Key => encode(key, &mut out),
                Piece::Param(name) => encode(&route.param(name, path)?, &mut out),
                Piece::Body(pointer) => {
                    let fields = parsed.get_or_insert_with(|| Fields::of(content_type, body));
                    match fields.get(pointer) {
                        Some(v) if !v.is_empty() && v.len() <= 1024 => encode(&v, &mut out),
                        _ => {
                            return Err(format!(
                                "the request body has no {pointer} (a string of 1 to 1024 \
                                 characters): this route verifies unknown outcomes by it"
                            ));
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// What a lookup answer says about the request whose body is
    /// `request`. "Not found" is a reason to forward again, so it is only
    /// read from an answer of the expected shape: a 404 for a lookup of one
    /// resource (no `verify_found`); for a search, the pointer's container
    /// present with the pointer's last step missing (an index past the
    /// array's end, a key absent or null from the object), or an empty
    /// list. Anything else — another status, another shape, several
    /// candidates — fails and leaves the outcome unknown. A candidate that
    /// does not share the request's [`matching`](Self) values is another
    /// intent's: not found.
    pub fn read(
        &self,
        status: StatusCode,
        content_type: Option<&str>,
        body: &[u8],
        request_type: Option<&str>,
        request: &[u8],
    ) -> Lookup {
        if status == StatusCode::NOT_FOUND && self.found.is_none() {
            return Lookup::NotFound;
        }
        if !status.is_success() {
            return Lookup::Failed(format!("the lookup answered {}", status.as_u16()));
        }
        let Some(pointer) = &self.found else {
            if !self.matching.is_empty() {
                let Ok(v) = serde_json::from_slice::<Value>(body) else {
                    return Lookup::Failed("the lookup's answer is not JSON".into());
                };
                match self.shares_values(&v, request_type, request) {
                    Shared::All => {}
                    Shared::Differs => return Lookup::NotFound,
                    Shared::Unclear(why) => return Lookup::Failed(why),
                }
            }
            return Lookup::Found {
                content_type: content_type
                    .unwrap_or("application/octet-stream")
                    .to_owned(),
                body: body.to_vec(),
            };
        };
        let Ok(v) = serde_json::from_slice::<Value>(body) else {
            return Lookup::Failed("the lookup's answer is not JSON".into());
        };
        let (parent, last) = pointer.rsplit_once('/').unwrap_or(("", pointer));
        let last = unescape_pointer(last);
        let candidate = match (v.pointer(parent), last.parse::<usize>()) {
            (Some(Value::Array(items)), Ok(i)) => {
                if i >= items.len() {
                    return Lookup::NotFound;
                }
                if items.len() > i + 1 {
                    return Lookup::Failed(format!(
                        "the lookup found {} candidates: it cannot tell which is this request's",
                        items.len() - i
                    ));
                }
                &items[i]
            }
            (Some(Value::Object(fields)), Err(_)) => match fields.get(&last) {
                None | Some(Value::Null) => return Lookup::NotFound,
                Some(v) => v,
            },
            _ => {
                return Lookup::Failed(format!(
                    "the lookup's answer does not have the shape {pointer} names"
                ));
            }
        };
        match candidate {
            Value::Array(a) if a.is_empty() => Lookup::NotFound,
            Value::Object(_) => match self.shares_values(candidate, request_type, request) {
                Shared::All => Lookup::Found {
                    content_type: "application/json".into(),
                    body: candidate.to_string().into_bytes(),
                },
                Shared::Differs => Lookup::NotFound,
                Shared::Unclear(why) => Lookup::Failed(why),
            },
            _ => Lookup::Failed(format!(
                "the lookup's {pointer} is not an object (or an empty list)"
            )),
        }
    }

    /// Whether `found` holds the request's values at every matching
    /// pointer (as JSON strings). Only a clearly different string there
    /// makes it another intent's; a value it lacks (or holds as something
    /// else), or one that differs only as an upstream may normalise it
    /// (surrounding or repeated white space, letter case), says nothing
    /// either way.
    fn shares_values(&self, found: &Value, request_type: Option<&str>, request: &[u8]) -> Shared {
        let fields = Fields::of(request_type, request);
        let mut shared = Shared::All;
        for p in &self.matching {
            let Some(mine) = fields.get(p) else {
                return Shared::Unclear(format!("the request has no {p} to compare"));
            };
            match found.pointer(p) {
                Some(Value::String(theirs)) if *theirs == mine => {}
                Some(Value::String(theirs)) if loosely(theirs) != loosely(&mine) => {
                    return Shared::Differs;
                }
                Some(Value::String(_)) => {
                    shared = Shared::Unclear(format!(
                        "the lookup's candidate has {p} spelled otherwise (white space or case): \
                         it cannot tell whose it is"
                    ));
                }
                _ => {
                    shared = Shared::Unclear(format!(
                        "the lookup's candidate has no string at {p}: it cannot tell whose it is"
                    ));
                }
            }
        }
        shared
    }
}

/// What a candidate shares with the request.
enum Shared {
    /// Every matching value: this request's intent.
    All,
    /// A different value at some pointer: another intent's.
    Differs,
    /// A value missing: unknown whose it is.
    Unclear(String),
}

/// A value as an upstream may normalise it: trimmed, white space runs
/// folded, lower case.
fn loosely(v: &str) -> String {
    v.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// A request body's fields, read as its `Content-Type` says (as the
/// upstream reads it): JSON for `application/json` (or `…+json`), a form
/// (`a[b]=…` for `/a/b`) for `application/x-www-form-urlencoded`. A body
/// of another type, or one that does not parse as its type, has none:
/// reading it another way than the upstream would look up another value.
enum Fields {
    Json(Value),
    Form(Vec<(String, String)>),
    None,
}

impl Fields {
    fn of(content_type: Option<&str>, body: &[u8]) -> Self {
        let media = content_type
            .and_then(|c| c.split(';').next())
            .map(|m| m.trim().to_ascii_lowercase());
        match media.as_deref() {
            Some(m)
                if m == "application/json"
                    || (m.starts_with("application/") && m.ends_with("+json")) =>
            {
                serde_json::from_slice::<Value>(body).map_or(Self::None, Self::Json)
            }
            Some("application/x-www-form-urlencoded") if std::str::from_utf8(body).is_ok() => {
                Self::Form(
                    form_urlencoded::parse(body)
                        .map(|(k, v)| (k.into_owned(), v.into_owned()))
                        .collect(),
                )
            }
            _ => Self::None,
        }
    }

    /// Whether the body holds a string of 1 to 1024 characters there.
    fn has_text(&self, pointer: &str) -> bool {
        self.get(pointer)
            .is_some_and(|v| !v.is_empty() && v.len() <= 1024)
    }

    fn get(&self, pointer: &str) -> Option<String> {
        match self {
            // Strings only: a number's text differs between servers
            // (`100` and `100.0`), and a lookup that misses is a forward.
            Self::Json(v) => match v.pointer(pointer)? {
                Value::String(s) => Some(s.clone()),
                _ => None,
            },
            Self::Form(pairs) => {
                let mut segments = pointer.split('/').skip(1).map(unescape_pointer);
                let mut name = segments.next()?;
                for s in segments {
                    name = format!("{name}[{s}]");
                }
                let mut values = pairs.iter().filter(|(k, _)| *k == name);
                match (values.next(), values.next()) {
                    (Some((_, v)), None) => Some(v.clone()),
                    // Sent twice: which one the upstream reads is unknowable.
                    _ => None,
                }
            }
            Self::None => None,
        }
    }
}

fn unescape_pointer(segment: &str) -> String {
    segment.replace("~1", "/").replace("~0", "~")
}

fn valid_pointer(p: &str) -> bool {
    p.starts_with('/')
        && p.len() <= 256
        && !p.chars().any(char::is_control)
        && p.split('~').skip(1).all(|s| s.starts_with(['0', '1']))
}

/// Percent-encodes everything but RFC 3986's unreserved characters, so a
/// value lands in one path segment or one query value whatever it holds.
fn encode(value: &str, out: &mut String) {
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

#[cfg(test)]
mod tests;
