//! The drills that check what a used key answers: another payload, the
//! same payload reordered, a replay after the resource changed, a late
//! retry, the replay header and what is stored for a refused body.

use std::time::Duration;

use super::answer::{Answer, REPLAY_HEADERS};
use super::client::Key;
use super::config::{Fields, ID, UNIQUE};
use super::report::Outcome;
use super::{Evidence, Runner, Stop, Verdict, effects_text};

/// `idempotency-replayed` as it is usually written: `Idempotency-Replayed:`.
fn header_name(lower: &str) -> String {
    let words: Vec<String> = lower
        .split('-')
        .map(|w| {
            let mut c = w.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect();
    format!("{}:", words.join("-"))
}

impl Runner {
    /// The first request of a drill that needs a stored answer: a 2xx or
    /// the verdict that the drill cannot go on.
    pub(super) async fn first(
        &self,
        u: &str,
        key: &str,
        ev: &mut Evidence,
    ) -> Result<Result<Answer, (Outcome, String)>, Stop> {
        let a = self.retry(u, key, "first", ev).await?;
        ev.note(format!("first: {}", a.brief()));
        Ok(if a.success() {
            Ok(a)
        } else {
            // The baseline passed: this is the target's mood (a rate limit,
            // a hiccup), not a property of its keys.
            Err((
                Outcome::Skip,
                format!(
                    "the first request was answered {}, so this drill could not run",
                    a.status
                ),
            ))
        })
    }

    pub(super) fn fields(&self, u: &str) -> Option<Fields> {
        self.body(u).and_then(|b| Fields::of(&b))
    }

    /// A round of key-reuse: the first request, then the key with another
    /// payload on a new connection.
    pub(super) async fn key_reuse(&self, case: &str, ev: &mut Evidence) -> Verdict {
        let (u, key) = (self.unique(case), self.key(case));
        let Some(fields) = self.fields(&u) else {
            return Ok((Outcome::Skip, "needs a --body that is a JSON object".into()));
        };
        let (other, what) = fields.changed(&u);
        let first = match self.first(&u, &key, ev).await? {
            Ok(a) => a,
            Err(v) => return Ok(v),
        };
        let a = self.send_body(&u, Key::One(&key), &other).await?;
        ev.note(format!("same key, {what}: {}", a.brief()));
        let n = self.effects(&u, ev).await?;
        Ok(match a.status {
            _ if n != 1 => (
                Outcome::Fail,
                format!("{}: the other payload ran", effects_text(n)),
            ),
            s if a.success() && a.same(&first) && what.starts_with("an extra field") => (
                Outcome::Warn,
                format!(
                    "{s}: the first answer, replayed to a payload that only adds a field ({what}); a fingerprint of the known fields may ignore it, but a changed value would tell more (give --body a number or a string field)"
                ),
            ),
            s if a.success() && a.same(&first) => (
                Outcome::Fail,
                format!(
                    "{s}: another payload got the first request's answer, so its caller believes a request that never ran succeeded"
                ),
            ),
            s if a.success() => (
                Outcome::Fail,
                format!("{s}: another payload under a used key was accepted"),
            ),
            422 => (Outcome::Pass, "422 and no new effect".into()),
            s => (
                Outcome::Warn,
                format!("refused with {s} and no new effect (422 is the usual answer)"),
            ),
        })
    }

    /// A round of reordered-fields.
    pub(super) async fn reordered(&self, case: &str, ev: &mut Evidence) -> Verdict {
        let (u, key) = (self.unique(case), self.key(case));
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
        let a = self
            .retry_body(&u, &key, Some(&reversed), "fields reversed", ev)
            .await?;
        ev.note(format!(
            "fields reversed: {}",
            if a.same(&first) {
                "the same status and body".to_owned()
            } else {
                a.brief()
            }
        ));
        // Refused: a byte-level fingerprint only if the same bytes replay.
        let again = if !a.success() && !a.same(&first) {
            let again = self.retry(&u, &key, "the same body again", ev).await?;
            ev.note(format!("the same body again: {}", again.brief()));
            Some(again)
        } else {
            None
        };
        let n = self.effects(&u, ev).await?;
        Ok(if n == 1 && a.same(&first) {
            (Outcome::Pass, "a replay; one effect".into())
        } else if n != 1 {
            (
                Outcome::Fail,
                format!("{}: the reordered body ran again", effects_text(n)),
            )
        } else if a.success() {
            (
                Outcome::Fail,
                format!(
                    "answered {} with another body and no new effect: a retry does not get the first answer",
                    a.status
                ),
            )
        } else if again.as_ref().is_some_and(|g| !g.same(&first)) {
            (
                Outcome::Warn,
                format!(
                    "refused with {} and no new effect, but the same body again was answered {} too: no replay to compare with",
                    a.status,
                    again.as_ref().map_or(0, |g| g.status)
                ),
            )
        } else {
            (
                Outcome::Warn,
                format!(
                    "refused with {} and no new effect while the same bytes replay: the fingerprint reads the body's bytes, so the same JSON in another order is another request here",
                    a.status
                ),
            )
        })
    }

    /// A round of replay-after-mutation.
    pub(super) async fn after_mutation(&self, case: &str, ev: &mut Evidence) -> Verdict {
        let Some((line, body)) = &self.config.mutate else {
            return Ok((Outcome::Skip, "needs --mutate".into()));
        };
        let (u, key) = (self.unique(case), self.key(case));
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
                Key::One(&self.key(&format!("{case}-mutation"))),
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

    pub(super) async fn late_retry(&self, ev: &mut Evidence) -> Verdict {
        let Some(ttl) = self.config.ttl else {
            return Ok((Outcome::Skip, "needs --ttl".into()));
        };
        let (u, key) = (self.unique("late-retry"), self.key("late-retry"));
        let first = match self.first(&u, &key, ev).await? {
            Ok(a) => a,
            Err((_, why)) => return Ok((Outcome::Info, why)),
        };
        let wait = ttl + Duration::from_secs(1);
        ev.note(format!("waited {}", idem_core::duration_text(wait)));
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

    pub(super) async fn replay_marker(&self, ev: &mut Evidence) -> Verdict {
        let (u, key) = (self.unique("replay-marker"), self.key("replay-marker"));
        let first = match self.first(&u, &key, ev).await? {
            Ok(a) => a,
            Err((_, why)) => return Ok((Outcome::Info, why)),
        };
        let second = self.retry(&u, &key, "second", ev).await?;
        ev.note(format!("second: {}", second.brief()));
        let n = self.effects(&u, ev).await?;
        let marked = |a: &Answer| match a.replay_header() {
            Some((name, v)) if name == REPLAY_HEADERS[0] => format!("{} {v}", header_name(name)),
            Some((name, v)) => format!(
                "{} {v} (a variant of Idempotent-Replayed)",
                header_name(name)
            ),
            None => "no replay header".to_owned(),
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

    pub(super) async fn storage_policy(&self, ev: &mut Evidence) -> Verdict {
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
