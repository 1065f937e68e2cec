//! Failure drills for any HTTP API that claims `Idempotency-Key` support:
//! a black-box conformance runner, as a library. [`run`] takes a validated
//! [`DrillConfig`] (from a [`DrillSpec`]: `Default` + fields, then
//! [`DrillSpec::validate`]) and an [`Observer`] ([`Quiet`] in a test), and
//! returns a [`Report`] with one [`DrillResult`] per drill of [`DRILLS`],
//! each PASS, FAIL, WARN, SKIP or INFO with its evidence. The `idem drill`
//! command is this crate behind a CLI; put the same call in your own
//! `cargo test` against your own server to keep the contract in CI.
//!
//! Two severities: a FAIL is a broken contract (a second effect, a retry
//! that does not get the first answer — also a retry answered `409` over
//! and over after the first request had finished —, another payload
//! accepted under a used key, a 5xx where a retry should replay) and
//! decides the verdict; a
//! WARN is a convention (the status of a refusal, byte-level fingerprints,
//! a malformed key accepted, server errors under a race that still made one
//! effect), failing the run only with `strict`. [`Report::failed`] is the
//! verdict; [`Report::table`], [`Report::json`] and [`Report::junit`]
//! render it (`idem drill` exits 1 when it failed, 2 for bad usage or an
//! unreachable target). Every contract drill but `baseline` runs `rounds`
//! times with fresh keys, every request on a new connection (a retry meets
//! whichever worker the target's kernel or balancer picks), and the worst
//! round decides.
//!
//! Every drill case uses a fresh `{unique}` value in the request, so its
//! effects are counted apart with `effects` and `count`. Requests go only
//! to the target, and, for `lost-response`, to a proxy of the runner's own
//! on loopback in front of it. Every exchange is bounded by `timeout` and
//! 1 MiB of answer; `max_requests` caps what is sent.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_drill::{DrillSpec, Quiet};
//! let config = DrillSpec {
//!     target: Some("http://127.0.0.1:8080".into()),
//!     request: Some("POST /v1/payments".into()),
//!     body: Some(r#"{"amount":100,"currency":"EUR","customer":"{unique}"}"#.into()),
//!     effects: Some("GET /v1/payments?customer={unique}".into()),
//!     count: Some("/data".into()),
//!     ..DrillSpec::default()
//! }
//! .validate()?;
//! let report = idem_drill::run(config, &mut Quiet).await?;
//! assert!(!report.failed(), "{}", report.table());
//! # Ok(()) }
//! ```
//!
//! Modules: `config` (the spec and its validation), `client` and `answer`
//! (the HTTP exchanges, bounded), `proxy` (the loopback proxy that loses
//! an answer), `rounds` (every contract drill, `--rounds` times), `keys`,
//! `replays`, `races` and `settle` (the drills),
//! `report` (verdicts and renderings), `observe` (progress).

use std::sync::Arc;
use std::time::Instant;

use hyper::http::Method;

mod answer;
mod client;
mod config;
mod error;
mod keys;
mod observe;
mod proxy;
mod races;
mod replays;
mod report;
mod rounds;
mod settle;

pub use answer::{Answer, MAX_ANSWER_BYTES, REPLAY_HEADERS};
pub use client::Budget;
pub use config::{DrillConfig, DrillSpec, KeyFormat, RequestLine, Target, UsageError};
pub use error::SendError;
pub use observe::{Observer, Quiet, duration_text, line};
pub use report::{DrillResult, Outcome, Report, Round, Rounds};

use client::{Client, Key};
use config::{UNIQUE, count_at};

/// Every drill, in the order run, with what it checks in one line.
pub const DRILLS: &[(&str, &str)] = &[
    (
        "baseline",
        "one request with a fresh key: a 2xx and exactly one effect (checks --request, --body, --effects, --count); if it fails the rest is skipped",
    ),
    (
        "lost-response",
        "--rounds times: a proxy of the runner's own drops the answer once the target starts answering and reads it on to its end; the retry with the same key (Accept-Encoding: gzip, bodies compared decoded): a 2xx, one effect, and a second retry the same status and body; retries still answered 409 (or 425, 429, 503) at the end of their pauses FAIL when the whole answer had come (the first request had finished), WARN when it had not",
    ),
    (
        "abandoned-request",
        "--rounds times: the client gives up 50 ms after sending, before any answer, while the target may still be working (a middleware must not release the key on a disconnect); retries with the key (409 retried, as clients do): a 2xx, one effect, the same answer twice; retries refused to the end FAIL when the target's whole answer had come first, WARN (inconclusive) when the first request may still be running",
    ),
    (
        "concurrency",
        "--rounds times: --concurrency requests with one key at once, then a retry: one effect and one 2xx answer, which the retry gets (FAIL otherwise, a retry still answered 409 after a 2xx too); answers other than that 2xx or 409, such as 500s, WARN",
    ),
    (
        "key-reuse",
        "--rounds times, the second body on a new connection: the key again with another payload: 422 and no new effect (a 2xx or a new effect FAILs, another refusal status WARNs)",
    ),
    (
        "reordered-fields",
        "--rounds times: the key again with the body's JSON fields in reverse order: a replay, one effect (a refusal WARNs: a byte-level fingerprint; a new effect FAILs)",
    ),
    (
        "missing-key",
        "--rounds times: no Idempotency-Key: 400, no effect (INFO when the key is optional: accepted without one)",
    ),
    (
        "empty-key",
        "--rounds times: an empty Idempotency-Key: 400, no effect (INFO when the key is optional and it is handled as missing)",
    ),
    (
        "long-key",
        "--rounds times: a 256-character key: 400, no effect",
    ),
    (
        "control-key",
        "--rounds times: keys holding a tab and a \\x01 byte (sent raw): 400, no effect",
    ),
    (
        "duplicate-key",
        "--rounds times: two Idempotency-Key headers: 400, no effect (the bad-key drills WARN on another status or an accepted key)",
    ),
    (
        "replay-after-mutation",
        "with --mutate, --rounds times: after the created resource is changed, the replay still answers the original body",
    ),
    (
        "late-retry",
        "with --ttl: a retry after the TTL (plus 1 s) — replayed, executed again or refused (informational)",
    ),
    (
        "replay-marker",
        "which replay header the replay carries (Idempotent-Replayed or a variant such as Idempotency-Replayed) and that the first answer does not (informational)",
    ),
    (
        "storage-policy",
        "an invalid body twice with one key: whether the 4xx answer is stored and replayed (informational)",
    ),
];

/// Why a run could not be made at all.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The target did not answer the first request.
    #[error("the target is unreachable: {0}")]
    Unreachable(String),
    /// A setting is out of its bounds (changed after
    /// [`DrillSpec::validate`](crate::DrillSpec::validate)); nothing was sent.
    #[error("{0}")]
    Usage(String),
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
    format!("{n} effect{}", report::plural(n as usize))
}

/// What a drill collects as it goes.
#[derive(Default)]
struct Evidence {
    lines: Vec<String>,
    effects: Option<u64>,
    rounds: Option<Rounds>,
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
    /// What missing-key found: the target accepts requests without a key.
    key_optional: std::sync::OnceLock<bool>,
    /// A drill of rounds ran out of budget part way: the run stops there.
    budget_out: std::sync::atomic::AtomicBool,
    /// Every case counted so far, counted again after `--settle`.
    counted: std::sync::Mutex<Vec<settle::Counted>>,
    /// The index in [`DRILLS`] of the drill running.
    current: std::sync::atomic::AtomicUsize,
}

impl Runner {
    fn unique(&self, case: &str) -> String {
        format!("drill-{}-{case}", self.run_id)
    }

    /// The key of `case`, in `--key-format`.
    fn key(&self, case: &str) -> String {
        self.config.key_format.key(&self.run_id, case)
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
        self.record(unique, n);
        ev.effects = Some(n);
        ev.note(format!("effects: {n}"));
        Ok(n)
    }

    async fn run_one(&self, name: &'static str, ev: &mut Evidence) -> Verdict {
        match name {
            "baseline" => self.baseline(ev).await,
            name if rounds::IN_ROUNDS.contains(&name) => self.rounds(name, ev).await,
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
            return self.baseline_refused(&a, ev).await;
        }
        let n = self.effects(&u, ev).await?;
        Ok(match n {
            1 => (
                Outcome::Pass,
                format!(
                    "a 2xx and one effect (key {})",
                    report::truncate(&self.key("baseline"), 60)
                ),
            ),
            n => (
                Outcome::Fail,
                format!(
                    "a 2xx and {n} effects: --effects/--count must count this request's effect once"
                ),
            ),
        })
    }

    /// The baseline was refused: why, as far as one more request (without
    /// a key) can tell.
    async fn baseline_refused(&self, a: &Answer, ev: &mut Evidence) -> Verdict {
        let u = self.unique("baseline-no-key");
        let bare = self.send(&u, Key::None).await?;
        ev.note(format!("the same request without a key: {}", bare.brief()));
        let format = self.config.key_format.text();
        let why = if bare.success() {
            format!(
                "refused ({}) with the key {:?} but accepted without a key: the target most likely refuses this key's format (try --key-format uuid, or a template such as 'pay_{{uuid}}'; now: {format})",
                a.status,
                report::truncate(&self.key("baseline"), 60)
            )
        } else {
            format!(
                "refused ({}; {} without a key), cause unknown. Likely causes: --request, --body or a --header the target needs (authentication, Content-Type), or the key's format (--key-format uuid or a template; now: {format})",
                a.status, bare.status
            )
        };
        Ok((Outcome::Fail, why))
    }
}

/// Runs every drill against the target and reports. Drills run one after
/// the other; a drill that cannot get an answer fails with the reason,
/// one the budget stops is skipped (and so is every drill after it).
///
/// # Errors
/// [`Error::Unreachable`] when the very first request cannot connect;
/// [`Error::Usage`] when a setting is out of its bounds.
pub async fn run(config: DrillConfig, observer: &mut dyn Observer) -> Result<Report, Error> {
    config.check_bounds().map_err(|e| Error::Usage(e.0))?;
    let started = Instant::now();
    let budget = Arc::new(Budget::new(config.max_requests));
    let client = Client::new(&config, budget.clone());
    let runner = Runner {
        run_id: uuid::Uuid::new_v4().simple().to_string()[..8].to_owned(),
        client,
        config,
        key_optional: std::sync::OnceLock::new(),
        budget_out: Default::default(),
        counted: Default::default(),
        current: Default::default(),
    };
    let mut drills = Vec::new();
    let mut stopped: Option<String> = None;
    for (i, (name, _)) in DRILLS.iter().enumerate() {
        observer.start(name);
        let t = Instant::now();
        let mut ev = Evidence::default();
        runner.current.store(i, std::sync::atomic::Ordering::SeqCst);
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
                    observer.abort();
                    return Err(Error::Unreachable(e.to_string()));
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
        if stopped.is_none() && runner.budget_out.load(std::sync::atomic::Ordering::SeqCst) {
            stopped = Some(format!(
                "the request budget is used up ({} of --max-requests {})",
                budget.sent(),
                budget.sent() + budget.left().unwrap_or_default()
            ));
        }
        let result = DrillResult {
            name,
            outcome,
            summary,
            evidence: ev.lines,
            effects: ev.effects,
            rounds: ev.rounds,
            elapsed_ms: t.elapsed().as_millis() as u64,
        };
        observer.done(i, DRILLS.len(), &result);
        drills.push(result);
    }
    let settled = runner.settle(&mut drills).await;
    observer.finish(settled.as_deref());
    Ok(Report {
        settled,
        target: runner.config.target.text.clone(),
        request: runner.config.request.text(),
        drills,
        requests_sent: budget.sent(),
        max_requests: runner.config.max_requests,
        elapsed_ms: started.elapsed().as_millis() as u64,
        strict: runner.config.strict,
    })
}
