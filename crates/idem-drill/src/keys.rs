//! The bad-key drills: a missing, empty, long, control-character or
//! doubled `Idempotency-Key`. A refusal other than 400, or a malformed key
//! accepted, is a convention (WARN); only more effects than requests would
//! be a contract failure. Where the key is optional (missing-key accepted),
//! an empty key handled as a missing one is what missing-key found, and
//! says so the same way (INFO).

use super::Stop;
use super::answer::Answer;
use super::client::Key;
use super::error::SendError;

/// The answer to a malformed request; a connection dropped or an answer
/// that is not HTTP is a refusal too (status 0), as a proxy in front of
/// the target may give. The budget and an unreachable target still stop.
fn refusal(sent: Result<Answer, SendError>) -> Result<Answer, Stop> {
    match sent {
        Ok(a) => Ok(a),
        Err(e @ (SendError::Budget | SendError::Connect { .. })) => Err(e.into()),
        Err(e) => Ok(Answer {
            status: 0,
            headers: Vec::new(),
            body: bytes::Bytes::from(format!("(no answer: {e})")),
            garbled: None,
        }),
    }
}
use super::report::Outcome;
use super::{Evidence, Runner, Verdict, effects_text};

impl Runner {
    /// A round of missing-key.
    pub(super) async fn missing_key(&self, case: &str, ev: &mut Evidence) -> Verdict {
        let u = self.unique(case);
        let a = self.send(&u, Key::None).await?;
        let _ = self.key_optional.set(a.success());
        self.judge_bad_key("missing-key", &u, vec![a], ev).await
    }

    /// A round of bad-key drill `name`.
    pub(super) async fn bad_key(&self, name: &str, case: &str, ev: &mut Evidence) -> Verdict {
        let u = self.unique(case);
        let answers = match name {
            "empty-key" => vec![refusal(
                self.send_raw(&u, &[b"Idempotency-Key: ".to_vec()]).await,
            )?],
            "long-key" => vec![self.send(&u, Key::One(&"k".repeat(256))).await?],
            "control-key" => {
                let mut answers = Vec::new();
                for (i, sep) in [b'\t', 0x01].into_iter().enumerate() {
                    let mut line = b"Idempotency-Key: idem".to_vec();
                    line.push(sep);
                    line.extend_from_slice(self.key(&format!("{case}-{i}")).as_bytes());
                    answers.push(refusal(self.send_raw(&u, &[line]).await)?);
                }
                answers
            }
            _ => {
                let lines = [
                    format!("Idempotency-Key: {}", self.key(&format!("{case}-a"))).into_bytes(),
                    format!("Idempotency-Key: {}", self.key(&format!("{case}-b"))).into_bytes(),
                ];
                vec![refusal(self.send_raw(&u, &lines).await)?]
            }
        };
        self.judge_bad_key(name, &u, answers, ev).await
    }

    /// The verdict on `answers` to requests of case `u` with a bad key (or
    /// none): 400 and no effect passes.
    async fn judge_bad_key(
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
        let sent = answers.len();
        let statuses: Vec<String> = answers
            .iter()
            .map(|a| match a.status {
                0 => "a dropped connection".to_owned(),
                s => s.to_string(),
            })
            .collect();
        let statuses = statuses.join(", ");
        let accepted = answers.iter().filter(|a| a.success()).count();
        let requests = format!("{sent} request{}", super::report::plural(sent));
        let optional = self.key_optional.get().copied().unwrap_or(false);
        Ok(if n > sent as u64 {
            (
                Outcome::Fail,
                format!(
                    "{} from {requests}: a request ran more than once",
                    effects_text(n)
                ),
            )
        } else if accepted == 0 && n == 0 {
            if answers.iter().all(|a| a.status == 400) {
                (Outcome::Pass, "400 and no effect".into())
            } else {
                (
                    Outcome::Warn,
                    format!("refused with {statuses} (400 is usual); no effect"),
                )
            }
        } else if accepted == 0 {
            // Told it failed, its caller tries again (with a key that works)
            // and makes a second effect.
            (
                Outcome::Fail,
                format!(
                    "refused with {statuses}, yet {} from {requests} happened: the caller is told it failed",
                    effects_text(n)
                ),
            )
        } else if name == "missing-key" {
            (
                Outcome::Info,
                format!(
                    "the key is optional here: accepted without one ({} from {requests})",
                    effects_text(n)
                ),
            )
        } else if name == "empty-key" && optional {
            (
                Outcome::Info,
                format!(
                    "the key is optional here and an empty one is handled as missing ({} from {requests})",
                    effects_text(n)
                ),
            )
        } else {
            let why = match (name, optional) {
                ("empty-key", _) => "an empty key was accepted while a missing one is refused",
                (_, true) => "a malformed key was accepted (the key is optional here)",
                _ => "a malformed key was accepted",
            };
            (
                Outcome::Warn,
                format!(
                    "{why}: answered {statuses}, {} from {requests}, none repeated (400 is usual)",
                    effects_text(n)
                ),
            )
        })
    }
}
