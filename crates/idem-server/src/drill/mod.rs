//! `idem drill`: a black-box conformance runner for any HTTP API that
//! claims `Idempotency-Key` support. [`run`] takes a validated
//! [`DrillConfig`] (from a [`DrillSpec`]: flags, a TOML file, or built in
//! code) and returns a [`Report`] with one [`DrillResult`] per drill of
//! [`DRILLS`], each PASS, FAIL, SKIP or INFO with its evidence.
//!
//! Every drill case uses a fresh `{unique}` value in the request, so its
//! effects are counted apart with `--effects` and `--count`. Requests go
//! only to the target, and, for `lost-response`, to a proxy of the runner's
//! own on loopback in front of it. Every exchange is bounded by `timeout`
//! and 1 MiB of answer; `max_requests` caps what is sent.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_server::drill::{self, DrillSpec};
//! let config = DrillSpec {
//!     target: Some("http://127.0.0.1:8080".into()),
//!     request: Some("POST /v1/payments".into()),
//!     body: Some(r#"{"amount":100,"currency":"EUR","customer":"{unique}"}"#.into()),
//!     effects: Some("GET /v1/payments?customer={unique}".into()),
//!     count: Some("/data".into()),
//!     ..DrillSpec::default()
//! }
//! .validate()?;
//! let report = drill::run(config).await?;
//! assert!(!report.failed(), "{}", report.table());
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use hyper::http::Method;

use crate::progress::Progress;

mod client;
mod config;
mod report;

pub use client::{Answer, Budget, MAX_ANSWER_BYTES, SendError};
pub use config::{DrillConfig, DrillSpec, RequestLine, Target, UsageError};
pub use report::{DrillResult, Outcome, Report};

use client::{Client, Key, LosingProxy};
use config::{Fields, ID, UNIQUE, count_at};

/// Every drill, in the order run, with what it checks in one line.
pub const DRILLS: &[(&str, &str)] = &[
    (
        "baseline",
        "one request with a fresh key: a 2xx and exactly one effect (checks --request, --body, --effects, --count); if it fails the rest is skipped",
    ),
    (
        "lost-response",
        "a proxy of the runner's own drops the answer once the target starts answering; the retry with the same key: a 2xx, one effect, and a second retry the same status and body",
    ),
    (
        "concurrency",
        "--concurrency requests with one key at once: one effect, every answer the same 2xx (a replay) or 409",
    ),
    (
        "key-reuse",
        "the key again with another payload: 422 (another 4xx passes with a note, a 2xx fails), no new effect",
    ),
    (
        "reordered-fields",
        "the key again with the body's JSON fields in reverse order: a replay (same status and body), one effect",
    ),
    (
        "missing-key",
        "no Idempotency-Key: 400, no effect (SKIP when the target accepts requests without a key)",
    ),
    ("empty-key", "an empty Idempotency-Key: 400, no effect"),
    ("long-key", "a 256-character key: 400, no effect"),
    (
        "control-key",
        "keys holding a tab and a \\x01 byte (sent raw): 400, no effect",
    ),
    (
        "duplicate-key",
        "two Idempotency-Key headers: 400, no effect",
    ),
    (
        "replay-after-mutation",
        "with --mutate: after the created resource is changed, the replay still answers the original body",
    ),
    (
        "late-retry",
        "with --ttl: a retry after the TTL (plus 1 s) — replayed, executed again or refused (informational)",
    ),
    (
        "replay-marker",
        "a replay carries Idempotent-Replayed: true and the first answer does not (informational)",
    ),
    (
        "storage-policy",
        "an invalid body twice with one key: whether the 4xx answer is stored and replayed (informational)",
    ),
];

/// Why a run could not be made at all.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The target did not answer the first request.
    #[error("the target is unreachable: {0}")]
    Unreachable(String),
}

/// Why a drill stopped before its verdict.
enum Stop {
    Send(SendError),
    Effects(String),
}

impl From<SendError> for Stop {
    fn from(e: SendError) -> Self {
        Stop::Send(e)
    }
}

/// `1 effect`, `3 effects`.
fn effects_text(n: u64) -> String {
    format!("{n} effect{}", if n == 1 { "" } else { "s" })
}

/// What a drill collects as it goes.
#[derive(Default)]
struct Evidence {
    lines: Vec<String>,
    effects: Option<u64>,
}

impl Evidence {
    fn note(&mut self, line: impl Into<String>) {
        self.lines.push(line.into());
    }
}

type Verdict = Result<(Outcome, String), Stop>;

struct Runner {
    config: DrillConfig,
    client: Client,
    run_id: String,
}

impl Runner {
    fn unique(&self, case: &str) -> String {
        format!("drill-{}-{case}", self.run_id)
    }

    fn key(&self, case: &str) -> String {
        format!("idem-drill-{}-{case}", self.run_id)
    }

    fn path(&self, unique: &str) -> String {
        self.config.request.path.replace(UNIQUE, unique)
    }

    fn body(&self, unique: &str) -> Option<String> {
        self.config.body.as_ref().map(|b| b.replace(UNIQUE, unique))
    }

    /// The request under test, for case `unique`.
    async fn send(&self, unique: &str, key: Key<'_>) -> Result<Answer, SendError> {
        let body = self.body(unique);
        self.client
            .send(
                &self.config.request.method,
                &self.path(unique),
                key,
                body.as_deref(),
            )
            .await
    }

    /// The request under test with another body.
    async fn send_body(&self, unique: &str, key: Key<'_>, body: &str) -> Result<Answer, SendError> {
        self.client
            .send(
                &self.config.request.method,
                &self.path(unique),
                key,
                Some(body),
            )
            .await
    }

    /// The request under test with raw key header lines.
    async fn send_raw(&self, unique: &str, key_lines: &[Vec<u8>]) -> Result<Answer, SendError> {
        let body = self.body(unique);
        self.client
            .send_raw(
                &self.config.request.method,
                &self.path(unique),
                key_lines,
                body.as_deref(),
            )
            .await
    }

    /// The effects of case `unique`.
    async fn effects(&self, unique: &str, ev: &mut Evidence) -> Result<u64, Stop> {
        let path = self.config.effects.path.replace(UNIQUE, unique);
        let a = self
            .client
            .send(&Method::GET, &path, Key::None, None)
            .await?;
        if !a.success() {
            return Err(Stop::Effects(format!("GET {path} answered {}", a.brief())));
        }
        let json = a
            .json()
            .ok_or_else(|| Stop::Effects(format!("GET {path} answered no JSON: {}", a.brief())))?;
        let n = count_at(&json, &self.config.count).map_err(Stop::Effects)?;
        ev.effects = Some(n);
        ev.note(format!("effects: {n}"));
        Ok(n)
    }

    async fn run_one(&self, name: &'static str, ev: &mut Evidence) -> Verdict {
        match name {
            "baseline" => self.baseline(ev).await,
            "lost-response" => self.lost_response(ev).await,
            "concurrency" => self.concurrency(ev).await,
            "key-reuse" => self.key_reuse(ev).await,
            "reordered-fields" => self.reordered(ev).await,
            "missing-key" => self.missing_key(ev).await,
            "empty-key" => {
                let u = self.unique(name);
                let a = self.send_raw(&u, &[b"Idempotency-Key: ".to_vec()]).await?;
                self.refused(name, &u, vec![a], ev).await
            }
            "long-key" => {
                let u = self.unique(name);
                let a = self.send(&u, Key::One(&"k".repeat(256))).await?;
                self.refused(name, &u, vec![a], ev).await
            }
            "control-key" => {
                let u = self.unique(name);
                let mut answers = Vec::new();
                for sep in [b'\t', 0x01] {
                    let mut line = b"Idempotency-Key: idem".to_vec();
                    line.push(sep);
                    line.extend_from_slice(self.key(name).as_bytes());
                    answers.push(self.send_raw(&u, &[line]).await?);
                }
                self.refused(name, &u, answers, ev).await
            }
            "duplicate-key" => {
                let u = self.unique(name);
                let lines = [
                    format!("Idempotency-Key: {}-a", self.key(name)).into_bytes(),
                    format!("Idempotency-Key: {}-b", self.key(name)).into_bytes(),
                ];
                let a = self.send_raw(&u, &lines).await?;
                self.refused(name, &u, vec![a], ev).await
            }
            "replay-after-mutation" => self.after_mutation(ev).await,
            "late-retry" => self.late_retry(ev).await,
            "replay-marker" => self.replay_marker(ev).await,
            "storage-policy" => self.storage_policy(ev).await,
            _ => Ok((Outcome::Skip, "unknown drill".into())),
        }
    }

    async fn baseline(&self, ev: &mut Evidence) -> Verdict {
        let u = self.unique("baseline");
        let before = self.effects(&u, ev).await?;
        if let Some(line) = ev.lines.last_mut() {
            *line = format!("effects before: {before}");
        }
        if before != 0 {
            return Ok((
                Outcome::Fail,
                format!(
                    "{before} effects before any request: --effects/--count do not count one case's effects"
                ),
            ));
        }
        let a = self.send(&u, Key::One(&self.key("baseline"))).await?;
        ev.note(format!("answer: {}", a.brief()));
        if !a.success() {
            return Ok((
                Outcome::Fail,
                format!(
                    "the request was refused ({}): check --request, --body and --header",
                    a.status
                ),
            ));
        }
        let n = self.effects(&u, ev).await?;
        Ok(match n {
            1 => (Outcome::Pass, "a 2xx and one effect".into()),
            n => (
                Outcome::Fail,
                format!(
                    "a 2xx and {n} effects: --effects/--count must count this request's effect once"
                ),
            ),
        })
    }

    async fn lost_response(&self, ev: &mut Evidence) -> Verdict {
        let (u, key) = (self.unique("lost-response"), self.key("lost-response"));
        let addr = self.client.resolve().await?;
        let proxy = LosingProxy::start(addr, self.client.timeout()).await?;
        let body = self.body(&u);
        let lost = self
            .client
            .send_via(
                proxy.addr,
                &self.config.request.method,
                &self.path(&u),
                Key::One(&key),
                body.as_deref(),
            )
            .await;
        let log = proxy.log().await;
        ev.note(format!(
            "through the proxy: {} request bytes forwarded; {}",
            log.forwarded,
            if log.answered {
                "the target started answering and the answer was dropped".to_owned()
            } else {
                format!(
                    "no answer within {}, the connection was dropped",
                    crate::duration_text(self.client.timeout())
                )
            }
        ));
        match &lost {
            Ok(a) => ev.note(format!("the client still got an answer: {}", a.brief())),
            Err(SendError::Budget) => return Err(SendError::Budget.into()),
            Err(e) => ev.note(format!("the client got: {e}")),
        }
        let first = self.send(&u, Key::One(&key)).await?;
        ev.note(format!("retry 1: {}", first.brief()));
        let second = self.send(&u, Key::One(&key)).await?;
        ev.note(format!(
            "retry 2: {}",
            if second.same(&first) {
                "the same status and body".to_owned()
            } else {
                second.brief()
            }
        ));
        let n = self.effects(&u, ev).await?;
        Ok(if n == 1 && first.success() && second.same(&first) {
            (
                Outcome::Pass,
                "one effect; the retries got the same 2xx".into(),
            )
        } else if n != 1 {
            (Outcome::Fail, format!("{} for one intent", effects_text(n)))
        } else if !first.success() {
            (
                Outcome::Fail,
                format!("the retry was answered {}", first.status),
            )
        } else {
            (
                Outcome::Fail,
                "the second retry answered differently".into(),
            )
        })
    }

    async fn concurrency(&self, ev: &mut Evidence) -> Verdict {
        let (u, key) = (self.unique("concurrency"), self.key("concurrency"));
        let n = self.config.concurrency;
        let addr = self.client.resolve().await?;
        if let Some(left) = self.client.budget().left()
            && left < n as u64 + 1
        {
            return Err(SendError::Budget.into());
        }
        // Every connection open before any request goes, so they overlap.
        let opened = join_all((0..n).map(|_| self.client.open(addr))).await;
        let mut conns = Vec::with_capacity(n);
        for c in opened {
            conns.push(c?);
        }
        self.client.budget().take(n as u64)?;
        let body = self.body(&u);
        let path = self.path(&u);
        let answers = join_all(conns.into_iter().map(|c| {
            self.client.send_prepaid(
                c,
                &self.config.request.method,
                &path,
                Key::One(&key),
                body.as_deref(),
            )
        }))
        .await;
        let mut tally: std::collections::BTreeMap<String, usize> = Default::default();
        let mut successes: Vec<&Answer> = Vec::new();
        let (mut others, mut errors) = (Vec::new(), Vec::new());
        for a in &answers {
            match a {
                Ok(a) => {
                    let label = format!(
                        "{}{}",
                        a.status,
                        if a.replayed() { " replayed" } else { "" }
                    );
                    *tally.entry(label).or_default() += 1;
                    if a.success() {
                        successes.push(a);
                    } else if a.status != 409 {
                        others.push(a.brief());
                    }
                }
                Err(e) => errors.push(e.to_string()),
            }
        }
        let answers_text: Vec<String> = tally.iter().map(|(s, c)| format!("{s} ×{c}")).collect();
        ev.note(format!("{n} answers: {}", answers_text.join(", ")));
        let mut distinct: Vec<&Answer> = Vec::new();
        for a in &successes {
            if !distinct.iter().any(|d| d.same(a)) {
                distinct.push(a);
            }
        }
        ev.note(format!("distinct 2xx answers: {}", distinct.len()));
        for d in distinct.iter().take(3) {
            ev.note(format!("2xx: {}", d.brief()));
        }
        if let Some(o) = others.first() {
            ev.note(format!("{} other answers, first: {o}", others.len()));
        }
        if let Some(e) = errors.first() {
            ev.note(format!(
                "{} requests got no answer, first: {e}",
                errors.len()
            ));
        }
        let effects = self.effects(&u, ev).await?;
        Ok(
            if effects == 1 && distinct.len() <= 1 && others.is_empty() && errors.is_empty() {
                (
                    Outcome::Pass,
                    format!(
                        "one effect; {} × the same 2xx, the rest 409",
                        successes.len()
                    ),
                )
            } else if effects != 1 {
                (
                    Outcome::Fail,
                    format!("{} for {n} requests with one key", effects_text(effects)),
                )
            } else if distinct.len() > 1 {
                (
                    Outcome::Fail,
                    format!("{} different 2xx answers to one key", distinct.len()),
                )
            } else {
                (
                    Outcome::Fail,
                    "answers other than the same 2xx or 409".into(),
                )
            },
        )
    }

    /// The first request of a drill that needs a stored answer: a 2xx or
    /// the verdict that the drill cannot go on.
    async fn first(
        &self,
        u: &str,
        key: &str,
        ev: &mut Evidence,
    ) -> Result<Result<Answer, (Outcome, String)>, Stop> {
        let a = self.send(u, Key::One(key)).await?;
        ev.note(format!("first: {}", a.brief()));
        Ok(if a.success() {
            Ok(a)
        } else {
            Err((
                Outcome::Fail,
                format!("the first request was answered {}", a.status),
            ))
        })
    }

    fn fields(&self, u: &str) -> Option<Fields> {
        self.body(u).and_then(|b| Fields::of(&b))
    }

    async fn key_reuse(&self, ev: &mut Evidence) -> Verdict {
        let (u, key) = (self.unique("key-reuse"), self.key("key-reuse"));
        let Some(fields) = self.fields(&u) else {
            return Ok((Outcome::Skip, "needs a --body that is a JSON object".into()));
        };
        let (other, what) = fields.changed(&u);
        if let Err(v) = self.first(&u, &key, ev).await? {
            return Ok(v);
        }
        let a = self.send_body(&u, Key::One(&key), &other).await?;
        ev.note(format!("same key, {what}: {}", a.brief()));
        let n = self.effects(&u, ev).await?;
        Ok(match a.status {
            _ if n != 1 => (
                Outcome::Fail,
                format!("{}: the other payload ran", effects_text(n)),
            ),
            422 => (Outcome::Pass, "422 and no new effect".into()),
            400..=499 => (
                Outcome::Pass,
                format!(
                    "{} and no new effect (note: 422 is the usual answer)",
                    a.status
                ),
            ),
            s if a.success() => (
                Outcome::Fail,
                format!("{s}: another payload under a used key was accepted"),
            ),
            s => (Outcome::Fail, format!("{s}: expected 422")),
        })
    }

    async fn reordered(&self, ev: &mut Evidence) -> Verdict {
        let (u, key) = (
            self.unique("reordered-fields"),
            self.key("reordered-fields"),
        );
        let Some(reversed) = self.fields(&u).and_then(|f| f.reversed()) else {
            return Ok((
                Outcome::Skip,
                "needs a --body that is a JSON object with two fields or more".into(),
            ));
        };
        let first = match self.first(&u, &key, ev).await? {
            Ok(a) => a,
            Err(v) => return Ok(v),
        };
        let a = self.send_body(&u, Key::One(&key), &reversed).await?;
        ev.note(format!(
            "fields reversed: {}",
            if a.same(&first) {
                "the same status and body".to_owned()
            } else {
                a.brief()
            }
        ));
        let n = self.effects(&u, ev).await?;
        Ok(if n == 1 && a.same(&first) {
            (Outcome::Pass, "a replay; one effect".into())
        } else if n != 1 {
            (
                Outcome::Fail,
                format!("{}: the reordered body ran again", effects_text(n)),
            )
        } else {
            (
                Outcome::Fail,
                format!(
                    "answered {} instead of a replay: the same JSON in another order is another request here",
                    a.status
                ),
            )
        })
    }

    async fn missing_key(&self, ev: &mut Evidence) -> Verdict {
        let u = self.unique("missing-key");
        let a = self.send(&u, Key::None).await?;
        if a.success() {
            ev.note(format!("answer: {}", a.brief()));
            let n = self.effects(&u, ev).await?;
            return Ok((
                Outcome::Skip,
                format!(
                    "the key is optional here: accepted without one ({})",
                    effects_text(n)
                ),
            ));
        }
        self.refused("missing-key", &u, vec![a], ev).await
    }

    /// Every answer must be 400 and the case must have no effect.
    async fn refused(
        &self,
        name: &str,
        u: &str,
        answers: Vec<Answer>,
        ev: &mut Evidence,
    ) -> Verdict {
        for a in &answers {
            ev.note(format!("answer: {}", a.brief()));
        }
        let n = self.effects(u, ev).await?;
        let statuses: Vec<String> = answers.iter().map(|a| a.status.to_string()).collect();
        Ok(if n == 0 && answers.iter().all(|a| a.status == 400) {
            (Outcome::Pass, "400 and no effect".into())
        } else if n != 0 {
            (
                Outcome::Fail,
                format!("{} from a request with a bad key ({name})", effects_text(n)),
            )
        } else {
            (
                Outcome::Fail,
                format!("answered {} (expected 400)", statuses.join(", ")),
            )
        })
    }

    async fn after_mutation(&self, ev: &mut Evidence) -> Verdict {
        let Some((line, body)) = &self.config.mutate else {
            return Ok((Outcome::Skip, "needs --mutate".into()));
        };
        let (u, key) = (
            self.unique("replay-after-mutation"),
            self.key("replay-after-mutation"),
        );
        let first = match self.first(&u, &key, ev).await? {
            Ok(a) => a,
            Err(v) => return Ok(v),
        };
        let id = match first.json().as_ref().and_then(|v| v.get("id")) {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Number(n)) => n.to_string(),
            _ => {
                return Ok((
                    Outcome::Fail,
                    "the first answer has no JSON \"id\" for {id}".into(),
                ));
            }
        };
        if id
            .bytes()
            .any(|b| !b.is_ascii_alphanumeric() && !b"-_.~".contains(&b))
        {
            return Ok((
                Outcome::Fail,
                format!("the id {id:?} cannot go in a path as is"),
            ));
        }
        let path = line.path.replace(ID, &id).replace(UNIQUE, &u);
        let body = body
            .as_ref()
            .map(|b| b.replace(ID, &id).replace(UNIQUE, &u));
        let m = self
            .client
            .send(
                &line.method,
                &path,
                Key::One(&self.key("mutation")),
                body.as_deref(),
            )
            .await?;
        ev.note(format!("{} {path}: {}", line.method, m.brief()));
        if !m.success() {
            return Ok((
                Outcome::Fail,
                format!("the mutation was answered {}", m.status),
            ));
        }
        let replay = self.send(&u, Key::One(&key)).await?;
        ev.note(format!(
            "replay: {}",
            if replay.same(&first) {
                "the original status and body".to_owned()
            } else {
                replay.brief()
            }
        ));
        let n = self.effects(&u, ev).await?;
        Ok(if replay.same(&first) && n == 1 {
            (Outcome::Pass, "the replay answers the original body".into())
        } else if n != 1 {
            (Outcome::Fail, format!("{} for one intent", effects_text(n)))
        } else {
            (
                Outcome::Fail,
                "the replay differs from the original answer".into(),
            )
        })
    }

    async fn late_retry(&self, ev: &mut Evidence) -> Verdict {
        let Some(ttl) = self.config.ttl else {
            return Ok((Outcome::Skip, "needs --ttl".into()));
        };
        let (u, key) = (self.unique("late-retry"), self.key("late-retry"));
        let first = match self.first(&u, &key, ev).await? {
            Ok(a) => a,
            Err((_, why)) => return Ok((Outcome::Info, why)),
        };
        let wait = ttl + Duration::from_secs(1);
        ev.note(format!("waited {}", crate::duration_text(wait)));
        tokio::time::sleep(wait).await;
        let late = self.send(&u, Key::One(&key)).await?;
        ev.note(format!("late retry: {}", late.brief()));
        let n = self.effects(&u, ev).await?;
        let what = if late.same(&first) && n == 1 {
            "replayed: the record outlived --ttl".to_owned()
        } else if n >= 2 {
            format!(
                "executed again ({n} effects): past its TTL a key protects nothing; a business natural key is the second line of defence"
            )
        } else {
            format!(
                "answered {} with {}: not a replay, no second effect",
                late.status,
                effects_text(n)
            )
        };
        Ok((Outcome::Info, what))
    }

    async fn replay_marker(&self, ev: &mut Evidence) -> Verdict {
        let (u, key) = (self.unique("replay-marker"), self.key("replay-marker"));
        let first = match self.first(&u, &key, ev).await? {
            Ok(a) => a,
            Err((_, why)) => return Ok((Outcome::Info, why)),
        };
        let second = self.send(&u, Key::One(&key)).await?;
        ev.note(format!("second: {}", second.brief()));
        let n = self.effects(&u, ev).await?;
        let marked = |a: &Answer| match a.header("idempotent-replayed") {
            Some(v) => format!("Idempotent-Replayed: {v}"),
            None => "no Idempotent-Replayed".to_owned(),
        };
        let summary = if n != 1 || !second.same(&first) {
            format!(
                "no replay happened ({}); the second answer has {}",
                effects_text(n),
                marked(&second)
            )
        } else {
            format!(
                "first answer: {}; replay: {}",
                marked(&first),
                marked(&second)
            )
        };
        Ok((Outcome::Info, summary))
    }

    async fn storage_policy(&self, ev: &mut Evidence) -> Verdict {
        let (u, key) = (self.unique("storage-policy"), self.key("storage-policy"));
        let invalid = "{\"idem_drill_invalid\":";
        let first = self.send_body(&u, Key::One(&key), invalid).await?;
        ev.note(format!("invalid body: {}", first.brief()));
        let second = self.send_body(&u, Key::One(&key), invalid).await?;
        ev.note(format!("again with the key: {}", second.brief()));
        let summary = if first.success() {
            format!(
                "the target accepted a body that is not JSON ({})",
                first.status
            )
        } else if second.replayed() {
            format!("the {} is stored with the key and replayed", first.status)
        } else if second.same(&first) {
            format!(
                "the {} is answered again (the same bytes, not marked as a replay): not stored, or replayed without the marker",
                first.status
            )
        } else {
            format!("{} then {}: not stored", first.status, second.status)
        };
        Ok((Outcome::Info, summary))
    }
}

/// Runs every drill against the target and reports. Drills run one after
/// the other; a drill that cannot get an answer fails with the reason,
/// one the budget stops is skipped (and so is every drill after it).
///
/// # Errors
/// [`RunError::Unreachable`] when the very first request cannot connect.
pub async fn run(config: DrillConfig) -> Result<Report, RunError> {
    let started = Instant::now();
    let budget = Arc::new(Budget::new(config.max_requests));
    let client = Client::new(&config, budget.clone());
    let runner = Runner {
        run_id: uuid::Uuid::new_v4().simple().to_string()[..8].to_owned(),
        client,
        config,
    };
    let mut progress = DrillProgress::new(runner.config.progress);
    let mut drills = Vec::new();
    let mut stopped: Option<String> = None;
    for (i, (name, _)) in DRILLS.iter().enumerate() {
        progress.start(name);
        let t = Instant::now();
        let mut ev = Evidence::default();
        let (outcome, summary) = match &stopped {
            Some(why) => (Outcome::Skip, why.clone()),
            None => match runner.run_one(name, &mut ev).await {
                Ok(v) => v,
                Err(Stop::Send(SendError::Budget)) => {
                    let why = format!(
                        "the request budget is used up ({} of --max-requests {})",
                        budget.sent(),
                        budget.sent() + budget.left().unwrap_or_default()
                    );
                    stopped = Some(why.clone());
                    (Outcome::Skip, why)
                }
                Err(Stop::Send(e @ SendError::Connect { .. })) if i == 0 => {
                    progress.abort();
                    return Err(RunError::Unreachable(e.to_string()));
                }
                Err(Stop::Send(e)) => (Outcome::Fail, format!("no answer: {e}")),
                Err(Stop::Effects(e)) => (
                    Outcome::Fail,
                    format!("the effects could not be counted: {e}"),
                ),
            },
        };
        if i == 0 && outcome == Outcome::Fail {
            stopped = Some("the baseline failed".into());
        }
        let result = DrillResult {
            name,
            outcome,
            summary,
            evidence: ev.lines,
            effects: ev.effects,
            elapsed_ms: t.elapsed().as_millis() as u64,
        };
        progress.done(i, &result);
        drills.push(result);
    }
    Ok(Report {
        target: runner.config.target.text.clone(),
        request: runner.config.request.text(),
        drills,
        requests_sent: budget.sent(),
        max_requests: runner.config.max_requests,
        elapsed_ms: started.elapsed().as_millis() as u64,
    })
}

/// One line per drill on stderr; on a terminal a bar shows the drill
/// running between them.
struct DrillProgress(Option<Progress>);

impl DrillProgress {
    fn new(on: bool) -> Self {
        Self(on.then(|| Progress::stderr("drill", Some(DRILLS.len() as u64))))
    }

    fn start(&mut self, name: &str) {
        if let Some(p) = &mut self.0 {
            p.advance(0, &format!("{name} …"));
        }
    }

    fn done(&mut self, i: usize, r: &DrillResult) {
        let Some(p) = &mut self.0 else {
            return;
        };
        let summary = report::truncate(&r.summary, 100);
        p.complete(
            1,
            &format!(
                "[{}/{}] {} {} — {summary} ({})",
                i + 1,
                DRILLS.len(),
                r.name,
                r.outcome.label(),
                crate::duration_text(Duration::from_millis(r.elapsed_ms))
            ),
        );
    }

    fn abort(&mut self) {
        if let Some(p) = &mut self.0 {
            p.abandon();
        }
    }
}
