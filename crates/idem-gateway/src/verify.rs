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
mod tests {
    use super::*;

    fn route(p: &str) -> PathPattern {
        PathPattern::parse(p).unwrap_or_else(|e| panic!("{e}"))
    }

    fn verify(lookup: &str, found: Option<&str>) -> Verify {
        Verify::parse(
            VerifySettings {
                lookup,
                found,
                landing: Some("2s"),
                ..VerifySettings::default()
            },
            &route("/v1/orders/{order}/payments"),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn lookups_name_the_key_a_body_field_or_a_path_segment_encoded() {
        let v = verify(
            "GET /v1/payments?reference={/reference}&key={key}&order={order}",
            Some("/data/0"),
        );
        let body = "{\"reference\":\"ord 1/ü&x\",\"amount\":5}".as_bytes();
        let target = v
            .target(
                "idem:forward:ab",
                JSON,
                body,
                "/v1/orders/o%201/payments",
                &route("/v1/orders/{order}/payments"),
            )
            .unwrap();
        assert_eq!(
            target,
            "/v1/payments?reference=ord%201%2F%C3%BC%26x&key=idem%3Aforward%3Aab&order=o%201"
        );
        assert_eq!(v.landing, Duration::from_secs(2));
        assert_eq!(v.status, StatusCode::OK);
        // A form body, as Stripe's clients send it: /metadata/ref is metadata[ref].
        let form = b"amount=5&metadata%5Bref%5D=r-1&reference=r-2";
        let v = verify("GET /v1/payments?ref={/metadata/ref}&r={/reference}", None);
        let t = v
            .target("k", FORM, form, "/x", &route("/v1/orders/{order}/payments"))
            .unwrap();
        assert_eq!(t, "/v1/payments?ref=r-1&r=r-2");
    }

    #[test]
    fn a_request_without_the_looked_up_value_is_refused_before_anything_is_sent() {
        let v = verify("GET /v1/payments?reference={/reference}", Some("/data/0"));
        let r = route("/v1/orders/{order}/payments");
        for body in [
            &br#"{"amount":5}"#[..],
            br#"{"reference":""}"#,
            br#"{"reference":{"a":1}}"#,
            br#"{"reference":42}"#,
        ] {
            let e = v
                .check(JSON, body, "/v1/orders/1/payments", &r)
                .unwrap_err();
            assert!(e.contains("/reference"), "{e}");
        }
        let e = (v.check(
            FORM,
            b"reference=a&reference=b",
            "/v1/orders/1/payments",
            &r,
        ))
        .unwrap_err();
        assert!(e.contains("/reference"), "sent twice: {e}");
        assert!(
            v.check(JSON, br#"{"reference":"42"}"#, "/v1/orders/1/payments", &r)
                .is_ok()
        );
    }

    /// The body is read as its Content-Type says, as the upstream reads it,
    /// never another way: a JSON-looking form, a JSON body serde refuses
    /// (too deep, a lone surrogate) or a body without a type is refused.
    #[test]
    fn a_body_is_read_only_as_its_content_type_says() {
        let v = verify("GET /v1/payments?reference={/reference}", Some("/data/0"));
        let r = route("/v1/orders/{order}/payments");
        let p = "/v1/orders/1/payments";
        let as_form = br#"{"reference":"decoy","x":"&reference=real&"}"#;
        let t = v.target("", FORM, as_form, p, &r).unwrap();
        assert_eq!(t, "/v1/payments?reference=real", "read as the form it is");
        let deep = format!(
            r#"{{"reference":"real","pad":{}{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        let surrogate = br#"{"reference":"real","n":"\ud83d","x":"&reference=decoy&"}"#;
        for (ct, body) in [
            (JSON, deep.as_bytes()),
            (JSON, &surrogate[..]),
            (None, br#"{"reference":"real"}"#),
            (Some("text/plain"), b"reference=real"),
            (FORM, b"\xff\xfe"),
        ] {
            let e = v.check(ct, body, p, &r).unwrap_err();
            assert!(e.contains("neither JSON"), "{ct:?}: {e}");
        }
        let typed = Some("application/merge-patch+json; charset=utf-8");
        assert!(v.check(typed, br#"{"reference":"real"}"#, p, &r).is_ok());
    }

    /// A candidate whose value differs only as an upstream normalises it
    /// (trimmed, case folded) is unclear: never another's, never a second
    /// forward.
    #[test]
    fn a_normalised_value_is_not_another_intents() {
        let v = verify("GET /v1/payments?reference={/reference}", Some("/data/0"));
        let sent = br#"{"reference":"Order-7 ","amount":5}"#;
        let found = br#"{"data":[{"id":"pay_1","reference":"order-7"}]}"#;
        assert!(matches!(
            v.read(StatusCode::OK, None, found, JSON, sent),
            Lookup::Failed(_)
        ));
        let other = br#"{"data":[{"id":"pay_2","reference":"order-8"}]}"#;
        assert_eq!(
            v.read(StatusCode::OK, None, other, JSON, sent),
            Lookup::NotFound
        );
    }

    const MINE: &[u8] = br#"{"reference":"r-1","amount":5}"#;
    const JSON: Option<&str> = Some("application/json");
    const FORM: Option<&str> = Some("application/x-www-form-urlencoded");

    #[test]
    fn not_found_is_read_only_from_an_answer_of_the_expected_shape() {
        let search = verify("GET /v1/payments?reference={/reference}", Some("/data/0"));
        let ok = StatusCode::OK;
        assert_eq!(
            search.read(
                ok,
                Some("application/json"),
                br#"{"data":[{"id":"pay_1","reference":"r-1"}]}"#,
                JSON,
                MINE
            ),
            Lookup::Found {
                content_type: "application/json".into(),
                body: br#"{"id":"pay_1","reference":"r-1"}"#.to_vec()
            }
        );
        assert_eq!(
            search.read(ok, None, br#"{"data":[]}"#, JSON, MINE),
            Lookup::NotFound
        );
        for (wrong, why) in [
            (&br#"{}"#[..], "no /data at all"),
            (br#"{"data":null}"#, "null, not a list"),
            (br#"{"error":"database unavailable"}"#, "an error in a 200"),
            (br#"{"data":"oops"}"#, "a string"),
            (br#"{"data":[null]}"#, "a null candidate"),
            (br#"{"data":{"0":null}}"#, "an object where a list is named"),
            (br#"[]"#, "the root is a list"),
            (
                br#"{"data":[{"reference":"r-1"},{"reference":"r-1"}]}"#,
                "two candidates",
            ),
            (b"<html>", "not JSON"),
        ] {
            assert!(
                matches!(search.read(ok, None, wrong, JSON, MINE), Lookup::Failed(_)),
                "{why}"
            );
        }
        for status in [
            StatusCode::NOT_FOUND,
            StatusCode::BAD_GATEWAY,
            StatusCode::FOUND,
        ] {
            assert!(matches!(
                search.read(status, None, b"", JSON, MINE),
                Lookup::Failed(_)
            ));
        }
        let one = verify("GET /v1/payments/by-key/{key}", None);
        assert_eq!(
            one.read(StatusCode::NOT_FOUND, None, b"", JSON, MINE),
            Lookup::NotFound
        );
        assert!(matches!(
            one.read(ok, Some("application/json"), b"{}", JSON, MINE),
            Lookup::Found { .. }
        ));
        let by_field = verify("GET /v1/payment?reference={/reference}", Some("/payment"));
        assert_eq!(
            by_field.read(ok, None, br#"{"payment":null}"#, JSON, MINE),
            Lookup::NotFound
        );
    }

    #[test]
    fn a_candidate_of_another_intent_is_not_this_one() {
        let r = route("/v1/payments");
        let scoped = Verify::parse(
            VerifySettings {
                lookup: "GET /v1/payments?reference={/reference}",
                found: Some("/data/0"),
                matching: Some(&["/reference".to_owned(), "/customer".to_owned()]),
                ..VerifySettings::default()
            },
            &r,
        )
        .unwrap();
        let bob = br#"{"reference":"order-1","customer":"bob"}"#;
        let alices = br#"{"data":[{"id":"pay_1","reference":"order-1","customer":"alice"}]}"#;
        assert_eq!(
            scoped.read(StatusCode::OK, None, alices, JSON, bob),
            Lookup::NotFound,
            "a reused reference of another customer's"
        );
        let bobs = br#"{"data":[{"id":"pay_2","reference":"order-1","customer":"bob"}]}"#;
        assert!(matches!(
            scoped.read(StatusCode::OK, None, bobs, JSON, bob),
            Lookup::Found { .. }
        ));
        // Only a different string is another's: a candidate without the
        // value (or with a number there) says nothing: still unknown.
        for unclear in [
            &br#"{"data":[{"id":"pay_4","reference":"order-1"}]}"#[..],
            br#"{"data":[{"id":"pay_5","reference":"order-1","customer":7}]}"#,
        ] {
            assert!(
                matches!(
                    scoped.read(StatusCode::OK, None, unclear, JSON, bob),
                    Lookup::Failed(_)
                ),
                "{}",
                String::from_utf8_lossy(unclear)
            );
        }
        // A request without a value to compare is refused before it is sent.
        for body in [
            &br#"{"reference":"order-1"}"#[..],
            br#"{"reference":"order-1","customer":7}"#,
            br#"{"reference":"order-1","customer":""}"#,
        ] {
            let e = scoped.check(JSON, body, "/v1/payments", &r).unwrap_err();
            assert!(e.contains("/customer") && e.contains("verify_match"), "{e}");
        }
        assert!(scoped.check(JSON, bob, "/v1/payments", &r).is_ok());
        // By default the lookup's own fields must match: a lookup that
        // ignores its filter finds nothing of this request's.
        let plain = verify("GET /v1/payments?reference={/reference}", Some("/data/0"));
        let other = br#"{"data":[{"id":"pay_3","reference":"r-9"}]}"#;
        assert_eq!(
            plain.read(StatusCode::OK, None, other, JSON, MINE),
            Lookup::NotFound
        );
    }

    #[test]
    fn bad_lookups_are_refused() {
        let r = route("/v1/payments");
        let bad = |settings: VerifySettings<'_>| Verify::parse(settings, &r).unwrap_err();
        for (lookup, says) in [
            ("POST /v1/x?k={key}", "GET"),
            ("GET v1/x?k={key}", "starting with one /"),
            ("GET //evil.example/x?k={key}", "starting with one /"),
            ("GET /v1/ü/{key}", "visible ASCII"),
            ("GET /v1/x", "names nothing"),
            ("GET /v1/x?k={nope}", "neither"),
            ("GET /v1/x?k={key", "unclosed"),
            ("GET /v1/x?k={key}}", "stray"),
            ("GET /v1/x?k={/a~2}", "pointer"),
        ] {
            let e = bad(VerifySettings {
                lookup,
                ..VerifySettings::default()
            });
            assert!(e.contains(says), "{lookup}: {e}");
        }
        let lookup = "GET /v1/x?k={key}";
        for (settings, says) in [
            (
                VerifySettings {
                    lookup,
                    found: Some("data"),
                    ..VerifySettings::default()
                },
                "verify_found",
            ),
            (
                VerifySettings {
                    lookup,
                    status: Some(404),
                    ..VerifySettings::default()
                },
                "verify_status",
            ),
            (
                VerifySettings {
                    lookup,
                    status: Some(204),
                    ..VerifySettings::default()
                },
                "verify_status",
            ),
            (
                VerifySettings {
                    lookup,
                    landing: Some("2days"),
                    ..VerifySettings::default()
                },
                "landing",
            ),
            (
                VerifySettings {
                    lookup,
                    landing: Some("0s"),
                    ..VerifySettings::default()
                },
                "landing",
            ),
            (
                VerifySettings {
                    lookup,
                    matching: Some(&["x".to_owned()]),
                    ..VerifySettings::default()
                },
                "verify_match",
            ),
        ] {
            let e = bad(settings);
            assert!(e.contains(says), "{says}: {e}");
        }
    }
}
