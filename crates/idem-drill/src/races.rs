//! The drills that lose an answer or race one key: lost-response,
//! abandoned-request and concurrency (each round of them; `rounds` runs
//! them), and the retry as clients make it.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::future::join_all;

use super::answer::Answer;
use super::client::Key;
use super::error::SendError;
use super::proxy::LosingProxy;
use super::report::Outcome;
use super::{Evidence, Runner, Verdict, effects_text};

/// How often a retry answered "try again" (409 in flight, 425, 429, 503)
/// is sent again, as retrying clients do; the first pause (doubling), and
/// the longest `Retry-After` honoured.
const BUSY_RETRIES: u32 = 5;
const BUSY_PAUSE: Duration = Duration::from_millis(100);
const MAX_RETRY_AFTER: Duration = Duration::from_secs(2);
/// How long after sending the client of abandoned-request gives up.
pub const GIVE_UP: Duration = Duration::from_millis(50);

impl Runner {
    /// The request again with `key`, as a client retries: sent again while
    /// it is answered "try again" (409 in flight, 425, 429, 503), a few
    /// times with growing pauses or as `Retry-After` says.
    pub(super) async fn retry(
        &self,
        u: &str,
        key: &str,
        label: &str,
        ev: &mut Evidence,
    ) -> Result<Answer, SendError> {
        self.retry_body(u, key, None, label, ev).await
    }

    /// [`Runner::retry`] with `body` in place of the case's own.
    pub(super) async fn retry_body(
        &self,
        u: &str,
        key: &str,
        body: Option<&str>,
        label: &str,
        ev: &mut Evidence,
    ) -> Result<Answer, SendError> {
        Ok(self.retry_counted(u, key, body, label, ev).await?.0)
    }

    /// [`Runner::retry_body`], and how many requests it sent.
    async fn retry_counted(
        &self,
        u: &str,
        key: &str,
        body: Option<&str>,
        label: &str,
        ev: &mut Evidence,
    ) -> Result<(Answer, u32), SendError> {
        let send = || async {
            match body {
                Some(b) => self.send_body(u, Key::One(key), b).await,
                None => self.send(u, Key::One(key)).await,
            }
        };
        let mut pause = BUSY_PAUSE;
        let mut a = send().await?;
        let mut sent = 1;
        for _ in 0..BUSY_RETRIES {
            let Some(after) = a.try_again_after(MAX_RETRY_AFTER) else {
                break;
            };
            let wait = after.unwrap_or(pause);
            ev.note(format!(
                "{label}: {}, again in {} ms",
                a.status,
                wait.as_millis()
            ));
            tokio::time::sleep(wait).await;
            pause *= 2;
            a = send().await?;
            sent += 1;
        }
        Ok((a, sent))
    }

    /// One round of lost-response: the answer lost by the proxy, two
    /// retries with the key. With `give_up`, the round of
    /// abandoned-request: the client leaves that long after sending,
    /// before any answer, while the target may still be working.
    pub(super) async fn lost_response(
        &self,
        case: &str,
        give_up: Option<Duration>,
        ev: &mut Evidence,
    ) -> Verdict {
        let (u, key) = (self.unique(case), self.key(case));
        let addr = self.client.resolve().await?;
        let proxy = LosingProxy::start(addr, self.client.timeout(), give_up).await?;
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
            if log.gave_up {
                format!(
                    "the client gave up {} ms after sending, before any answer",
                    GIVE_UP.as_millis()
                )
            } else if log.began_after.is_some() {
                format!(
                    "the target started answering{} and the answer was dropped; {}",
                    log.began_after
                        .map(|d| format!(" after {} ms", d.as_millis()))
                        .unwrap_or_default(),
                    match log.answered_after {
                        Some(d) => format!("its whole answer had come after {} ms", d.as_millis()),
                        None => format!(
                            "its answer had not ended within {}",
                            idem_core::duration_text(self.client.timeout())
                        ),
                    }
                )
            } else {
                format!(
                    "no answer within {}, the connection was dropped",
                    idem_core::duration_text(self.client.timeout())
                )
            }
        ));
        match &lost {
            Ok(a) => ev.note(format!("the client still got an answer: {}", a.brief())),
            Err(SendError::Budget) => return Err(SendError::Budget.into()),
            Err(e) => ev.note(format!("the client got: {e}")),
        }
        let (first, second, retried) = self.retries(&u, &key, ev).await?;
        let n = self.effects(&u, ev).await?;
        let garbled = first.garbled.as_ref().or(second.garbled.as_ref());
        Ok(if n != 1 {
            (Outcome::Fail, format!("{} for one intent", effects_text(n)))
        } else if refused(&first) && log.answered {
            // The target's whole answer came: the first request had
            // finished, so these refusals are not "still in flight" — they
            // are all a retrying client will ever get.
            (
                Outcome::Fail,
                format!(
                    "one effect, but its answer is never given back: the first request had finished (the target began answering it{} and its whole answer came), yet all {} retries over {:.1} s were answered {} (try again) instead of the first answer",
                    log.began_after
                        .map(|d| format!(" after {} ms", d.as_millis()))
                        .unwrap_or_default(),
                    retried.sent,
                    retried.over.as_secs_f64(),
                    statuses(&first, &second),
                ),
            )
        } else if refused(&first) {
            (
                Outcome::Warn,
                format!(
                    "inconclusive: one effect, but every retry was answered {} (try again) while the first request may still have been running ({}); the answer was never seen",
                    statuses(&first, &second),
                    if log.began_after.is_some() {
                        "its answer had begun but not ended"
                    } else {
                        "no answer had begun"
                    }
                ),
            )
        } else if first.status >= 500 {
            (
                Outcome::Fail,
                format!(
                    "the retry was answered {} where it should replay the lost answer",
                    first.status
                ),
            )
        } else if !first.success() {
            (
                Outcome::Fail,
                format!(
                    "the retry was answered {}: the caller never gets the answer of its one effect",
                    first.status
                ),
            )
        } else if let Some(g) = garbled {
            (
                Outcome::Fail,
                format!("the retry's body is unreadable: {g}"),
            )
        } else if !second.same(&first) {
            (
                Outcome::Fail,
                "the second retry answered differently".into(),
            )
        } else {
            (
                Outcome::Pass,
                "one effect; the retries got the same 2xx".into(),
            )
        })
    }

    /// The retries of a lost answer: two, each sent again while it is
    /// answered "try again"; when the first still was at the end of its
    /// pauses and the second got an answer, a third to compare it with (a
    /// `409` followed by the first answer is a late answer, not a lost
    /// one). The answer and the retry compared with it, and what was sent.
    async fn retries(
        &self,
        u: &str,
        key: &str,
        ev: &mut Evidence,
    ) -> Result<(Answer, Answer, Retried), SendError> {
        let started = std::time::Instant::now();
        let (first, a) = self.retry_counted(u, key, None, "retry 1", ev).await?;
        ev.note(format!("retry 1: {}", first.brief()));
        let (second, b) = self.retry_counted(u, key, None, "retry 2", ev).await?;
        note_again(ev, "retry 2", &second, &first);
        let mut sent = a + b;
        let (first, second) = if refused(&first) && !refused(&second) {
            let (third, c) = self.retry_counted(u, key, None, "retry 3", ev).await?;
            note_again(ev, "retry 3", &third, &second);
            sent += c;
            (second, third)
        } else {
            (first, second)
        };
        let over = started.elapsed();
        Ok((first, second, Retried { sent, over }))
    }

    /// One round of concurrency: `--concurrency` requests with one key at
    /// once, then one retry with it once they are all answered.
    pub(super) async fn concurrency(&self, case: &str, ev: &mut Evidence) -> Verdict {
        let (u, key) = (self.unique(case), self.key(case));
        let n = self.config.concurrency;
        let addr = self.client.resolve().await?;
        if let Some(left) = self.client.budget().left()
            && left < n as u64 + 2
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
        let race = Race::of(&answers);
        race.note(n, ev);
        let after = self.retry(&u, &key, "the retry after the race", ev).await?;
        ev.note(format!("the retry after the race: {}", after.brief()));
        let effects = self.effects(&u, ev).await?;
        Ok(race.verdict(n, &after, effects))
    }
}

/// How many retries were sent, over how long.
struct Retried {
    sent: u32,
    over: Duration,
}

/// Answered "try again" (409 in flight, 425, 429, 503).
fn refused(a: &Answer) -> bool {
    a.try_again_after(MAX_RETRY_AFTER).is_some()
}

/// `409`, or `409 then 503`: the statuses two retries ended with.
fn statuses(first: &Answer, second: &Answer) -> String {
    if first.status == second.status {
        first.status.to_string()
    } else {
        format!("{} then {}", first.status, second.status)
    }
}

/// `retry 2: the same status and body`, or what it got.
fn note_again(ev: &mut Evidence, label: &str, a: &Answer, before: &Answer) {
    ev.note(format!(
        "{label}: {}",
        if a.same(before) {
            "the same status and body".to_owned()
        } else {
            a.brief()
        }
    ));
}

/// What the concurrent requests of one round got.
struct Race<'a> {
    tally: BTreeMap<String, usize>,
    /// The distinct 2xx answers.
    distinct: Vec<&'a Answer>,
    successes: usize,
    /// Answers other than a 2xx or 409.
    others: Vec<&'a Answer>,
    /// Requests without an answer.
    errors: Vec<String>,
}

impl<'a> Race<'a> {
    fn of(answers: &'a [Result<Answer, SendError>]) -> Self {
        let mut race = Race {
            tally: BTreeMap::new(),
            distinct: Vec::new(),
            successes: 0,
            others: Vec::new(),
            errors: Vec::new(),
        };
        for a in answers {
            match a {
                Ok(a) => {
                    let label = format!(
                        "{}{}",
                        a.status,
                        if a.replayed() { " replayed" } else { "" }
                    );
                    *race.tally.entry(label).or_default() += 1;
                    if a.success() {
                        race.successes += 1;
                        if !race.distinct.iter().any(|d| d.same(a)) {
                            race.distinct.push(a);
                        }
                    } else if a.status != 409 {
                        race.others.push(a);
                    }
                }
                Err(e) => race.errors.push(e.to_string()),
            }
        }
        race
    }

    fn note(&self, n: usize, ev: &mut Evidence) {
        let text: Vec<String> = self
            .tally
            .iter()
            .map(|(s, c)| format!("{s} ×{c}"))
            .collect();
        ev.note(format!("{n} answers: {}", text.join(", ")));
        ev.note(format!("distinct 2xx answers: {}", self.distinct.len()));
        for d in self.distinct.iter().take(3) {
            ev.note(format!("2xx: {}", d.brief()));
        }
        if let Some(o) = self.others.first() {
            ev.note(format!(
                "{} answers other than a 2xx or 409, first: {}",
                self.others.len(),
                o.brief()
            ));
        }
        if let Some(e) = self.errors.first() {
            ev.note(format!(
                "{} requests got no answer, first: {e}",
                self.errors.len()
            ));
        }
    }

    /// The round's verdict, given the retry after it and the effects.
    fn verdict(&self, n: usize, after: &Answer, effects: u64) -> (Outcome, String) {
        let differs = self.distinct.len() > 1
            || (after.success() && self.distinct.first().is_some_and(|d| !d.same(after)));
        if effects > 1 {
            return (
                Outcome::Fail,
                format!("{} for {n} requests with one key", effects_text(effects)),
            );
        }
        if effects == 0 {
            return (
                Outcome::Fail,
                if self.successes == 0 && !after.success() {
                    format!(
                        "no effect: no request of the race succeeded, nor the retry after it ({})",
                        after.status
                    )
                } else {
                    "2xx answers, yet no effect was counted".to_owned()
                },
            );
        }
        let garbled = self
            .distinct
            .iter()
            .copied()
            .chain(after.success().then_some(after))
            .find_map(|a| a.garbled.as_ref());
        if let Some(g) = garbled {
            return (Outcome::Fail, format!("an answer is unreadable: {g}"));
        }
        if differs {
            return (
                Outcome::Fail,
                "different 2xx answers to one key: a retry does not get the first answer".into(),
            );
        }
        if refused(after) && self.successes > 0 {
            // A request of the race got its 2xx: the work is done, so the
            // retry's refusal is no "still in flight", and a client whose
            // request was answered 409 never gets the answer.
            return (
                Outcome::Fail,
                format!(
                    "one effect, but its answer is never given back: a request of the race got its {}, yet the retry after the race was still answered {} (try again) at the end of its pauses",
                    self.distinct.first().map_or(0, |d| d.status),
                    after.status
                ),
            );
        }
        if refused(after) {
            return (
                Outcome::Warn,
                format!(
                    "inconclusive: one effect, but the retry after the race was still answered {} (try again)",
                    after.status
                ),
            );
        }
        if !after.success() {
            return (
                Outcome::Fail,
                format!(
                    "one effect, but the retry after the race was answered {}: it should replay the answer",
                    after.status
                ),
            );
        }
        if !self.others.is_empty() || !self.errors.is_empty() {
            let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
            for o in &self.others {
                *statuses.entry(o.status).or_default() += 1;
            }
            let mut seen: Vec<String> =
                statuses.iter().map(|(s, c)| format!("{c} × {s}")).collect();
            if !self.errors.is_empty() {
                seen.push(format!("{} without an answer", self.errors.len()));
            }
            let server_errors = statuses.keys().any(|s| *s >= 500);
            return (
                Outcome::Warn,
                format!(
                    "the contract held (one effect, a retry replays), {}: {} (409 is usual for a request racing its twin)",
                    if server_errors {
                        "server errors seen"
                    } else {
                        "other answers seen"
                    },
                    seen.join(", ")
                ),
            );
        }
        (
            Outcome::Pass,
            format!(
                "one effect; {} × the same 2xx, {} × 409, the retry after replays",
                self.successes,
                n - self.successes
            ),
        )
    }
}
