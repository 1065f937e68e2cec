//! What a drill run is told: [`DrillSpec`] as typed (flags or the TOML
//! file), validated into a [`DrillConfig`] before anything is sent.

use std::time::Duration;

use hyper::http::{HeaderName, HeaderValue, Method};
use serde::Deserialize;
use serde_json::Value;

/// The placeholder replaced with a fresh value per drill case.
pub const UNIQUE: &str = "{unique}";
/// The placeholder of `--mutate`, replaced with the first answer's `id`.
pub const ID: &str = "{id}";

/// The most concurrent requests `--concurrency` accepts.
pub const MAX_CONCURRENCY: usize = 1000;
/// The longest `--ttl` the late-retry drill waits.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// The largest request body template.
pub const MAX_BODY_TEMPLATE: usize = 256 << 10;
/// Rounds of every contract drill but `baseline` when `--rounds` is not given.
pub const DEFAULT_ROUNDS: u32 = 5;
/// The most rounds `--rounds` accepts.
pub const MAX_ROUNDS: u32 = 100;
/// The longest key a `--key-format` may make.
pub const MAX_KEY_LEN: usize = 255;
/// The wait before every case is counted again, when `--settle` is not given.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(1);
/// The longest `--settle`.
pub const MAX_SETTLE: Duration = Duration::from_secs(60);
/// A case name at least as long as any the drills use (`replay-after-mutation`,
/// `lost-response-100`, …), for checking a `--key-format`'s length.
const LONGEST_CASE: &str = "replay-after-mutation-100";

/// A drill run as typed: every flag, also the TOML form of `--config`
/// (snake_case keys: `target`, `request`, `body`, `effects`, `count`,
/// `headers`, `concurrency`, `timeout`, `max_requests`, `mutate`,
/// `mutate_body`, `ttl`, `rounds`, `key_format`, `strict`, `settle`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrillSpec {
    /// `http://HOST:PORT[/PREFIX]`.
    pub target: Option<String>,
    /// `METHOD /path` of the request under test (`{unique}` allowed).
    pub request: Option<String>,
    /// The JSON body template (`{unique}` allowed).
    pub body: Option<String>,
    /// `GET /path` (or `/path`) that lists the effects of one `{unique}`.
    pub effects: Option<String>,
    /// JSON pointer into the effects answer: an array (its length) or a number.
    pub count: Option<String>,
    /// `Name: value` headers sent with every request.
    #[serde(default)]
    pub headers: Vec<String>,
    /// Requests of the concurrency drill (default 50).
    pub concurrency: Option<usize>,
    /// The longest one exchange may take (default 10s), humantime.
    pub timeout: Option<String>,
    /// A hard cap on the requests sent.
    pub max_requests: Option<u64>,
    /// `METHOD /path/{id}` changing the created resource.
    pub mutate: Option<String>,
    /// The body of `mutate` (JSON template).
    pub mutate_body: Option<String>,
    /// The key records' TTL: enables the late-retry drill, humantime.
    pub ttl: Option<String>,
    /// Rounds of every contract drill but `baseline`, each with fresh keys
    /// and every request on a new connection (default 5).
    pub rounds: Option<u32>,
    /// `token` (default), `uuid`, or a template holding `{uuid}` or
    /// `{token}` (e.g. `pay_{uuid}`).
    pub key_format: Option<String>,
    /// Convention warnings fail the run too.
    pub strict: Option<bool>,
    /// The wait before every case is counted again (default 1s; 0s: off).
    pub settle: Option<String>,
}

/// A bad setting, found before anything was sent.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

fn usage<T>(msg: impl Into<String>) -> Result<T, UsageError> {
    Err(UsageError(msg.into()))
}

/// The target: where every request goes.
#[derive(Debug, Clone)]
pub struct Target {
    /// `HOST:PORT` to connect to (and the `Host` header).
    pub authority: String,
    /// Prefix of every path (no trailing `/`).
    pub prefix: String,
    /// As given, for reports.
    pub text: String,
}

impl Target {
    fn parse(text: &str) -> Result<Self, UsageError> {
        let base = idem_gateway::HttpBase::parse("TARGET", text).map_err(UsageError)?;
        Ok(Self {
            authority: base.authority,
            prefix: base.prefix,
            text: text.to_owned(),
        })
    }
}

/// How the drills' `Idempotency-Key` values look, for APIs that constrain
/// them (a UUID column, a prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyFormat {
    /// `idem-drill-<run>-<case>`: readable in the target's logs.
    Token,
    /// A UUID (version 4 layout), one per case.
    Uuid,
    /// A template in which `{uuid}` and `{token}` are replaced.
    Template(String),
}

impl KeyFormat {
    fn parse(text: &str) -> Result<Self, UsageError> {
        let format = match text {
            "token" => KeyFormat::Token,
            "uuid" => KeyFormat::Uuid,
            t if t.contains("{uuid}") || t.contains("{token}") => KeyFormat::Template(t.to_owned()),
            t => {
                return usage(format!(
                    "--key-format must be token, uuid, or a template holding {{uuid}} or {{token}} (such as pay_{{uuid}}), got {t:?}"
                ));
            }
        };
        let sample = format.key("00000000", LONGEST_CASE);
        if sample.len() > MAX_KEY_LEN || sample.bytes().any(|b| !(0x21..=0x7e).contains(&b)) {
            return usage(format!(
                "--key-format must make keys of visible ASCII without spaces, at most {MAX_KEY_LEN} bytes, got {sample:?}"
            ));
        }
        Ok(format)
    }

    /// The key of drill case `case` in run `run`: the same for the same
    /// case, so retries carry it, and different across cases and runs.
    pub fn key(&self, run: &str, case: &str) -> String {
        let token = format!("idem-drill-{run}-{case}");
        match self {
            KeyFormat::Token => token,
            KeyFormat::Uuid => uuid_of(&token),
            KeyFormat::Template(t) => t
                .replace("{uuid}", &uuid_of(&token))
                .replace("{token}", &token),
        }
    }

    /// As typed.
    pub fn text(&self) -> &str {
        match self {
            KeyFormat::Token => "token",
            KeyFormat::Uuid => "uuid",
            KeyFormat::Template(t) => t,
        }
    }
}

/// A UUID derived from `seed` (SHA-256, with the version-4 and variant
/// bits set), so a case's key is stable within a run.
fn uuid_of(seed: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(seed.as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_random_bytes(bytes)
        .into_uuid()
        .hyphenated()
        .to_string()
}

/// `METHOD /path` with placeholders.
#[derive(Debug, Clone)]
pub struct RequestLine {
    /// The method.
    pub method: Method,
    /// The path template (starts with `/`).
    pub path: String,
}

impl RequestLine {
    fn parse(flag: &str, text: &str, default_get: bool) -> Result<Self, UsageError> {
        let text = text.trim();
        let (method, path) = match text.split_once(' ') {
            Some((m, p)) => (m, p.trim()),
            None if default_get => ("GET", text),
            None => return usage(format!("{flag} must be 'METHOD /path', got {text:?}")),
        };
        let method = Method::from_bytes(method.as_bytes())
            .map_err(|_| UsageError(format!("{flag}: {method:?} is not an HTTP method")))?;
        if !path.starts_with('/') || path.bytes().any(|b| !(0x21..=0x7e).contains(&b)) {
            return usage(format!(
                "{flag}: the path must start with / and be visible ASCII without spaces, got {path:?}"
            ));
        }
        // The path with sample values must make a valid request target.
        let sample = path.replace(UNIQUE, "drill-x").replace(ID, "id");
        if sample.parse::<hyper::Uri>().is_err() {
            return usage(format!("{flag}: {path:?} is not a valid request path"));
        }
        Ok(Self {
            method,
            path: path.to_owned(),
        })
    }

    /// `METHOD /path` as typed.
    pub fn text(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// A JSON body template: valid JSON once `{unique}` (and `{id}`) are
/// replaced, as the drills will replace them.
fn json_template(flag: &str, text: &str) -> Result<String, UsageError> {
    if text.len() > MAX_BODY_TEMPLATE {
        return usage(format!("{flag} is over {MAX_BODY_TEMPLATE} bytes"));
    }
    let sample = text.replace(UNIQUE, "drill-x").replace(ID, "id");
    if let Err(e) = serde_json::from_str::<Value>(&sample) {
        return usage(format!(
            "{flag} is not valid JSON (with {UNIQUE} replaced): {e}"
        ));
    }
    Ok(text.to_owned())
}

fn duration(flag: &str, text: &str) -> Result<Duration, UsageError> {
    humantime::parse_duration(text).map_err(|e| {
        UsageError(format!(
            "{flag}: {text:?} is not a duration such as 10s: {e}"
        ))
    })
}

/// Everything a run needs, validated.
#[derive(Debug, Clone)]
pub struct DrillConfig {
    /// Where requests go.
    pub target: Target,
    /// The request under test.
    pub request: RequestLine,
    /// Its JSON body template, if it has one.
    pub body: Option<String>,
    /// The path that lists one case's effects.
    pub effects: RequestLine,
    /// JSON pointer to the effect count.
    pub count: String,
    /// Headers sent with every request.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Requests of the concurrency drill.
    pub concurrency: usize,
    /// The longest one exchange may take.
    pub timeout: Duration,
    /// A hard cap on the requests sent.
    pub max_requests: Option<u64>,
    /// The mutation of the replay-after-mutation drill, and its body.
    pub mutate: Option<(RequestLine, Option<String>)>,
    /// The late-retry drill's wait.
    pub ttl: Option<Duration>,
    /// Rounds of every contract drill but `baseline`.
    pub rounds: u32,
    /// How keys look.
    pub key_format: KeyFormat,
    /// Convention warnings fail the run too.
    pub strict: bool,
    /// The wait before every case is counted again (zero: not counted again).
    pub settle: Duration,
}

impl DrillSpec {
    /// `other`'s settings over these (`headers` are appended).
    pub fn overlay(mut self, other: DrillSpec) -> DrillSpec {
        macro_rules! over {
            ($($f:ident),*) => { $( if other.$f.is_some() { self.$f = other.$f; } )* };
        }
        over!(
            target,
            request,
            body,
            effects,
            count,
            concurrency,
            timeout,
            max_requests,
            mutate,
            mutate_body,
            ttl,
            rounds,
            key_format,
            strict,
            settle
        );
        self.headers.extend(other.headers);
        self
    }

    /// Checks every setting; the error names the flag.
    pub fn validate(self) -> Result<DrillConfig, UsageError> {
        let required = |v: Option<String>, flag: &str| {
            v.ok_or_else(|| UsageError(format!("{flag} is required (a flag or in --config)")))
        };
        let target = Target::parse(&required(self.target, "TARGET")?)?;
        let request =
            RequestLine::parse("--request", &required(self.request, "--request")?, false)?;
        let body = self.body.map(|b| json_template("--body", &b)).transpose()?;
        let effects = RequestLine::parse("--effects", &required(self.effects, "--effects")?, true)?;
        if effects.method != Method::GET {
            return usage("--effects must be a GET");
        }
        if !effects.path.contains(UNIQUE) {
            return usage(format!(
                "--effects must contain {UNIQUE}, so each case's effects are counted apart"
            ));
        }
        if !request.path.contains(UNIQUE) && !body.as_ref().is_some_and(|b| b.contains(UNIQUE)) {
            return usage(format!(
                "--request or --body must contain {UNIQUE}, so each case's effects are counted apart"
            ));
        }
        let count = required(self.count, "--count")?;
        if !(count.is_empty() || count.starts_with('/')) {
            return usage(format!(
                "--count must be a JSON pointer such as /data (or empty for the whole answer), got {count:?}"
            ));
        }
        let mut headers = Vec::new();
        for h in &self.headers {
            let Some((name, value)) = h.split_once(':') else {
                return usage(format!("--header must be 'Name: value', got {h:?}"));
            };
            let name = HeaderName::from_bytes(name.trim().as_bytes())
                .map_err(|_| UsageError(format!("--header: {name:?} is not a header name")))?;
            if matches!(
                name.as_str(),
                "host" | "content-length" | "transfer-encoding" | "connection" | "idempotency-key"
            ) {
                return usage(format!("--header: {name} is set by the drills"));
            }
            let value = HeaderValue::from_str(value.trim())
                .map_err(|_| UsageError(format!("--header: the value of {name} is not valid")))?;
            headers.push((name, value));
        }
        let concurrency = self.concurrency.unwrap_or(50);
        let timeout = match self.timeout {
            Some(t) => duration("--timeout", &t)?,
            None => Duration::from_secs(10),
        };
        let mutate = match (self.mutate, self.mutate_body) {
            (Some(line), body) => {
                let line = RequestLine::parse("--mutate", &line, false)?;
                let body = body
                    .map(|b| json_template("--mutate-body", &b))
                    .transpose()?;
                Some((line, body))
            }
            (None, Some(_)) => return usage("--mutate-body needs --mutate"),
            (None, None) => None,
        };
        let rounds = self.rounds.unwrap_or(DEFAULT_ROUNDS);
        let key_format = match &self.key_format {
            Some(f) => KeyFormat::parse(f)?,
            None => KeyFormat::Token,
        };
        let settle = match &self.settle {
            Some(t) => duration("--settle", t)?,
            None => DEFAULT_SETTLE,
        };
        let ttl = self.ttl.map(|t| duration("--ttl", &t)).transpose()?;
        let config = DrillConfig {
            target,
            request,
            body,
            effects,
            count,
            headers,
            concurrency,
            timeout,
            max_requests: self.max_requests,
            mutate,
            ttl,
            rounds,
            key_format,
            strict: self.strict.unwrap_or(false),
            settle,
        };
        config.check_bounds()?;
        Ok(config)
    }
}

impl DrillConfig {
    /// Checks the numeric bounds (the fields are public: a library caller
    /// may change a validated config, so [`crate::run`] checks again).
    pub fn check_bounds(&self) -> Result<(), UsageError> {
        if !(2..=MAX_CONCURRENCY).contains(&self.concurrency) {
            return usage(format!(
                "--concurrency must be between 2 and {MAX_CONCURRENCY}, got {}",
                self.concurrency
            ));
        }
        if !(Duration::from_millis(100)..=Duration::from_secs(600)).contains(&self.timeout) {
            return usage("--timeout must be between 100ms and 10min");
        }
        if self.max_requests == Some(0) {
            return usage("--max-requests must be at least 1");
        }
        if !(1..=MAX_ROUNDS).contains(&self.rounds) {
            return usage(format!(
                "--rounds must be between 1 and {MAX_ROUNDS}, got {}",
                self.rounds
            ));
        }
        if self.settle > MAX_SETTLE {
            return usage("--settle must be at most 60s");
        }
        if self.ttl.is_some_and(|t| t > MAX_TTL) {
            return usage("--ttl must be at most 24h (the drill waits that long)");
        }
        Ok(())
    }
}

/// The effect count at `pointer` in `answer`: an array's length or a
/// non-negative integer.
pub fn count_at(answer: &Value, pointer: &str) -> Result<u64, String> {
    match answer.pointer(pointer) {
        Some(Value::Array(a)) => Ok(a.len() as u64),
        Some(Value::Number(n)) => n
            .as_u64()
            .ok_or_else(|| format!("{pointer} is {n}, not a count")),
        Some(other) => Err(format!(
            "{pointer} is neither an array nor a number: {}",
            super::report::truncate(&other.to_string(), 80)
        )),
        None => Err(format!("{pointer:?} is not in the effects answer")),
    }
}

/// A top-level JSON object with its fields in the order written.
#[derive(Debug, Clone)]
pub struct Fields(pub Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Fields {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Fields;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Fields, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, Value>()? {
                    out.push((k, v));
                }
                Ok(Fields(out))
            }
        }
        d.deserialize_map(V)
    }
}

impl Fields {
    /// The fields of `body` if it is a JSON object.
    pub fn of(body: &str) -> Option<Fields> {
        serde_json::from_str(body).ok()
    }

    /// The object, in this order.
    pub fn render(&self) -> String {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(k, v)| format!("{}:{v}", Value::String(k.clone())))
            .collect();
        format!("{{{}}}", parts.join(","))
    }

    /// The same object with its fields in reverse order, when that is a
    /// different order (two fields or more).
    pub fn reversed(&self) -> Option<String> {
        (self.0.len() >= 2).then(|| {
            let mut r = self.0.clone();
            r.reverse();
            Fields(r).render()
        })
    }

    /// Another payload of the same shape: the first number field plus one
    /// (negated, a float too large for one to change it),
    /// else the first string field (not the unique value) with `-other`
    /// appended, else an extra field. What changed is said in the second
    /// value.
    pub fn changed(&self, unique: &str) -> (String, String) {
        let mut f = self.0.clone();
        if let Some((k, v)) = f.iter_mut().find(|(_, v)| v.is_number()) {
            let new = if let Some(i) = v.as_i64().filter(|i| *i < i64::MAX) {
                Value::from(i + 1)
            } else if let Some(x) = v.as_f64() {
                // Past 2^53 adding one changes nothing: negate instead.
                let y = if x + 1.0 != x { x + 1.0 } else { -x };
                serde_json::Number::from_f64(y).map_or(Value::from(1), Value::Number)
            } else {
                Value::from(1)
            };
            let what = format!("{k}: {v} → {new}");
            *v = new;
            return (Fields(f).render(), what);
        }
        if let Some((k, v)) = f
            .iter_mut()
            .find(|(_, v)| v.as_str().is_some_and(|s| !s.contains(unique)))
        {
            let new = Value::String(format!("{}-other", v.as_str().unwrap_or_default()));
            let what = format!("{k}: {v} → {new}");
            *v = new;
            return (Fields(f).render(), what);
        }
        f.push(("idem_drill_other".into(), Value::Bool(true)));
        (Fields(f).render(), "an extra field idem_drill_other".into())
    }
}

#[cfg(test)]
mod tests;
