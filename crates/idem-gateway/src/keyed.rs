//! A request with a key on a keyed route: the leased claim and its wait
//! loop, the forward (or the verification) under a heartbeat, and what the
//! answer does to the key ([`crate::settle`]).

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, header};
use axum::response::Response;
use bytes::Bytes;
use idem_core::leased::{
    LeaseToken, LeasedClaim, LeasedDecision, LeasedKeyStore, OnUnknown, leased_decision,
};
use idem_core::steps::StepKey;
use idem_core::{Clock, Completion, Scope, StoreError, StoredRecord, StoredResponse};
use idem_http::{Keyed, Rejection, RequestOutcome};

use crate::budget::{Held, HeldBody};
use crate::config::Route;
use crate::forward::{Answer, ForwardError};
use crate::problems::{self, reject};
use crate::settle::{self, Verdict};
use crate::verify::Lookup;
use crate::{Gateway, metrics};

/// Whether the derived key was forwarded before this attempt.
#[derive(Debug, Clone, Copy)]
enum Attempt {
    /// A fresh claim: nothing was forwarded with this key's record.
    First,
    /// A takeover: an earlier forward's outcome became unknown at this
    /// time (unix ms); it may have landed.
    Again { unknown_since_ms: i64 },
}

/// One forward under a lease: what it needs, borrowed.
struct Forward<'a> {
    route: &'a Route,
    parts: &'a Parts,
    body: &'a Bytes,
    scope: &'a Scope,
    token: &'a LeaseToken,
    key: (HeaderName, HeaderValue),
}

impl<S: LeasedKeyStore> Gateway<S> {
    pub(crate) async fn keyed(
        &self,
        route: &Route,
        parts: &Parts,
        body: Bytes,
        keyed: Keyed,
    ) -> Response {
        let Keyed { scope, fingerprint } = keyed;
        if let Some(v) = &route.verify
            && let Err(why) = v.check(content_type(parts), &body, parts.uri.path(), &route.path)
        {
            return problems::unverifiable(&why);
        }
        let policy = &route.config.policy;
        let lease_ms = millis(route.lease);
        let token = LeaseToken::new();
        let waiting_until = Instant::now() + policy.wait;
        let mut pause = Duration::from_millis(10);
        loop {
            let now = self.clock.now_ms();
            let claimed_at = Instant::now();
            let claim = self
                .store
                .claim_leased(
                    &scope,
                    &fingerprint,
                    policy,
                    &token,
                    now + lease_ms,
                    route.on_unknown,
                    now,
                )
                .await;
            let attempt = match claim {
                Err(e) => {
                    if matches!(e, StoreError::OutcomeUnknown { .. }) {
                        // The claim may have committed; nothing was
                        // forwarded under it. Give it back, or the key
                        // reads as a forward whose answer was lost.
                        give_back(self.store.clone(), scope.clone(), token.clone());
                    }
                    return reject(Rejection::for_store(&e));
                }
                Ok(LeasedClaim::Claimed) => Some(Attempt::First),
                Ok(LeasedClaim::TakenOver { lease_ended_at_ms }) => {
                    metrics::takeover();
                    Some(Attempt::Again {
                        unknown_since_ms: lease_ended_at_ms,
                    })
                }
                Ok(LeasedClaim::Existing(record)) => {
                    // The record's own policy, when stricter than the
                    // route's (configured otherwise since it was claimed).
                    let policy = record
                        .on_unknown
                        .filter(|p| p.strictness() > route.on_unknown.strictness())
                        .unwrap_or(route.on_unknown);
                    let retry_after = match leased_decision(record, &fingerprint, now) {
                        LeasedDecision::Replay(r) => return self.replay(&r),
                        LeasedDecision::Mismatch => {
                            return reject(Rejection::FingerprintMismatch);
                        }
                        LeasedDecision::Abandoned if policy != route.on_unknown => {
                            // Stricter than this route can act on: held.
                            return problems::outcome_unknown(OnUnknown::Reject, None);
                        }
                        LeasedDecision::Abandoned if !policy.takes_over() => {
                            return problems::outcome_unknown(policy, None);
                        }
                        // Another claimer took it over between our
                        // statements: it is in flight.
                        LeasedDecision::Abandoned => Duration::from_secs(1),
                        LeasedDecision::InFlight { retry_after } => retry_after,
                    };
                    if Instant::now() + pause > waiting_until {
                        return reject(Rejection::InFlight(retry_after));
                    }
                    None
                }
            };
            if let Some(attempt) = attempt {
                let key = StepKey::derive(&self.namespace, &scope, &self.step);
                let Ok(value) = HeaderValue::from_str(key.as_str()) else {
                    return reject(Rejection::Internal);
                };
                let held = Forward {
                    route,
                    parts,
                    body: &body,
                    scope: &scope,
                    token: &token,
                    key: (route.key_header.clone(), value),
                };
                return self.holding(&held, attempt, claimed_at).await;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    /// A stored answer, its bytes taken from the budget while its client
    /// reads it.
    fn replay(&self, record: &StoredRecord) -> Response {
        let len = record.response.as_ref().map_or(0, |r| r.body.len());
        let Some(held) = self.budget.try_take(len) else {
            return problems::busy();
        };
        RequestOutcome::Replayed.mark(held_response(idem_http::replay::<Bytes>(record), held))
    }

    /// The lease is ours: verify first when the route says so and an
    /// earlier forward may have landed, else forward; then settle.
    async fn holding(&self, h: &Forward<'_>, attempt: Attempt, claimed_at: Instant) -> Response {
        let Some(mut bytes) = self.budget.try_take(h.route.config.max_response_bytes) else {
            self.restore(h, attempt).await;
            return problems::busy();
        };
        // A lease is ours for its length from before the claim was sent.
        // A claim that took longer than a heartbeat's period (a stalled
        // database, a paused process) may have been taken over or resolved
        // meanwhile: then the lease is renewed, and so proven ours, before
        // anything is sent. Otherwise no write is needed.
        if claimed_at.elapsed() >= h.route.lease / 3 {
            match self.renew(h).await {
                Ok(true) => {}
                Ok(false) => return reject(Rejection::InFlight(Duration::from_secs(1))),
                Err(e) => {
                    self.restore(h, attempt).await;
                    return reject(Rejection::for_store(&e));
                }
            }
        }
        if let Attempt::Again { unknown_since_ms } = attempt
            && h.route.on_unknown == OnUnknown::Verify
        {
            match self.verify(h, &mut bytes).await {
                Ok(found) => return found,
                Err(lookup) => {
                    let Some(verify) = &h.route.verify else {
                        return reject(Rejection::Internal);
                    };
                    let landed_by = unknown_since_ms + millis(verify.landing);
                    let now = self.clock.now_ms();
                    if lookup != Lookup::NotFound || now < landed_by {
                        // Still unknown: the record keeps the time it
                        // became so, and the next retry looks again.
                        self.abandon(h, unknown_since_ms, None).await;
                        let wait = match lookup {
                            Lookup::NotFound => (landed_by - now).max(0) as u64,
                            _ => 2_000,
                        };
                        return problems::outcome_unknown(
                            OnUnknown::Verify,
                            Some(wait.div_ceil(1000)),
                        );
                    }
                    // Known not to have landed, and nothing sent can land
                    // any more: forwarded again, as a first time — by the
                    // lease's holder only. The lookup took time; a retry
                    // may have taken the lease over meanwhile (this process
                    // paused past it) and be forwarding itself.
                    match self.renew(h).await {
                        Ok(true) => {}
                        Ok(false) => return reject(Rejection::InFlight(Duration::from_secs(1))),
                        Err(e) => {
                            self.abandon(h, unknown_since_ms, None).await;
                            return reject(Rejection::for_store(&e));
                        }
                    }
                }
            }
        }
        idem_core::failpoint::hit("gateway.before_forward");
        let sent = self.upstream.forward(
            h.parts,
            h.body.clone(),
            h.key.clone(),
            h.route.config.max_response_bytes,
        );
        let answer = self.under_lease(h, sent).await;
        idem_core::failpoint::hit("gateway.after_forward");
        self.settle(h, attempt, answer, bytes).await
    }

    /// What the forward's answer does to the key, and the client's answer.
    async fn settle(
        &self,
        h: &Forward<'_>,
        attempt: Attempt,
        answer: Result<Answer, ForwardError>,
        mut bytes: Held,
    ) -> Response {
        let again = matches!(attempt, Attempt::Again { .. });
        let answer = match answer {
            Ok(a) => a,
            Err(e) if !e.may_have_acted() => {
                self.restore(h, attempt).await;
                let then = match attempt {
                    Attempt::First => "the key was released: retrying is safe",
                    Attempt::Again { .. } => "an earlier forward's outcome is still unknown",
                };
                return RequestOutcome::NotStored.mark(e.into_response(then, None));
            }
            Err(e) => {
                let reason = e.reason();
                return self.unknown(h, &reason, First::Failed(e), &mut bytes).await;
            }
        };
        match settle::verdict(h.route, answer.status, &answer.headers, again) {
            Verdict::Store => {
                let completion = h.route.config.completion(
                    answer.status.as_u16(),
                    &answer.headers,
                    &answer.body,
                );
                self.complete(h, &completion).await;
                bytes.shrink_to(answer.body.len());
                RequestOutcome::Executed.mark(held_response(answer_response(answer), bytes))
            }
            Verdict::NotProcessed => {
                self.restore(h, attempt).await;
                bytes.shrink_to(answer.body.len());
                RequestOutcome::NotStored.mark(held_response(answer_response(answer), bytes))
            }
            Verdict::InProgress => {
                // Something still runs upstream — an earlier attempt, or
                // this one — and may land from now: the outcome is unknown.
                let now = self.clock.now_ms();
                self.abandon(h, now, Some("in progress upstream")).await;
                problems::upstream_in_progress(
                    answer.status.as_u16(),
                    settle::retry_after(&answer.headers),
                )
            }
            Verdict::Unknown(reason) => {
                self.unknown(h, &reason, First::Answered(answer), &mut bytes)
                    .await
            }
        }
    }

    /// The forward may have reached the upstream and there is no answer to
    /// store: the key is kept. A `verify` route asks at once whether it
    /// landed; otherwise (and when the lookup finds nothing) the lease ends
    /// now and the client learns what a retry will do.
    async fn unknown(
        &self,
        h: &Forward<'_>,
        reason: &str,
        first: First,
        bytes: &mut Held,
    ) -> Response {
        let policy = h.route.on_unknown;
        metrics::unknown(h.route.config.operation.as_str(), policy);
        tracing::warn!(
            reason,
            on_unknown = policy.as_str(),
            "a forward's outcome is unknown: the upstream may have acted; the key is kept"
        );
        let mut lookup_failed = false;
        if policy == OnUnknown::Verify {
            match self.verify(h, bytes).await {
                Ok(found) => return found,
                Err(lookup) => lookup_failed = matches!(lookup, Lookup::Failed(_)),
            }
        }
        let now = self.clock.now_ms();
        self.abandon(h, now, Some(reason)).await;
        let landing = h.route.verify.as_ref().map_or(0, |v| v.landing.as_secs());
        let retry_after = (policy == OnUnknown::Verify).then_some(landing.max(1));
        match first {
            First::Failed(e) => {
                let then = problems::unknown_then(policy, landing, lookup_failed);
                RequestOutcome::OutcomeUnknown.mark(e.into_response(&then, retry_after))
            }
            // The upstream's own 5xx, passed on (not stored), its bytes
            // held like any answer's.
            First::Answered(answer) => {
                bytes.shrink_to(answer.body.len());
                let held = std::mem::replace(bytes, Held::none());
                RequestOutcome::NotStored.mark(held_response(answer_response(answer), held))
            }
        }
    }

    /// Asks the route's lookup whether the intent landed; `Ok` with the
    /// answer when it did (stored), else what the lookup said.
    async fn verify(&self, h: &Forward<'_>, bytes: &mut Held) -> Result<Response, Lookup> {
        let Some(verify) = &h.route.verify else {
            return Err(Lookup::Failed("the route has no lookup".into()));
        };
        let operation = h.route.config.operation.as_str();
        let target = verify
            .target(
                h.key.1.to_str().unwrap_or_default(),
                content_type(h.parts),
                h.body,
                h.parts.uri.path(),
                &h.route.path,
            )
            .map_err(Lookup::Failed)?;
        let looked = self.upstream.lookup(
            h.parts,
            &target,
            h.key.clone(),
            h.route.config.max_response_bytes,
        );
        let lookup = match self.under_lease(h, looked).await {
            Ok(a) => {
                let content_type = a
                    .headers
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok());
                verify.read(
                    a.status,
                    content_type,
                    &a.body,
                    self::content_type(h.parts),
                    h.body,
                )
            }
            Err(e) => {
                e.log();
                Lookup::Failed(e.reason())
            }
        };
        let (content_type, body) = match lookup {
            Lookup::Found { content_type, body } => (content_type, body),
            Lookup::NotFound => {
                metrics::verified(operation, "not_found");
                return Err(Lookup::NotFound);
            }
            Lookup::Failed(why) => {
                metrics::verified(operation, "failed");
                tracing::warn!(
                    why,
                    "a verify route's lookup failed; the outcome stays unknown"
                );
                return Err(Lookup::Failed(why));
            }
        };
        metrics::verified(operation, "found");
        let stored = StoredResponse {
            status: verify.status.as_u16(),
            headers: vec![("content-type".into(), content_type)],
            body,
        };
        self.complete(h, &Completion::completed(stored.clone()))
            .await;
        bytes.shrink_to(stored.body.len());
        let res = idem_http::stored_response::<Bytes>(&stored);
        let res = held_response(res, std::mem::replace(bytes, Held::none()));
        Ok(RequestOutcome::Verified.mark(res))
    }

    /// Runs `work` while a heartbeat renews the lease.
    async fn under_lease<T>(&self, h: &Forward<'_>, work: impl Future<Output = T>) -> T {
        tokio::select! {
            done = work => done,
            never = self.heartbeat(h) => match never {},
        }
    }

    /// Renews the lease every third of it while a forward runs; never
    /// ends. A lease lost (a retry took it over) is said once, and then
    /// nothing is renewed any more.
    async fn heartbeat(&self, h: &Forward<'_>) -> std::convert::Infallible {
        loop {
            tokio::time::sleep(h.route.lease / 3).await;
            match self.renew(h).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(
                        "a forward lost its lease (it outlived it and a retry took over); \
                         its answer will not be stored"
                    );
                    return std::future::pending().await;
                }
                Err(e) => tracing::warn!(
                    error = &e as &(dyn std::error::Error + 'static),
                    "could not renew a forward's lease"
                ),
            }
        }
    }

    /// Moves the lease a whole `lease` from now; whether it is still ours.
    async fn renew(&self, h: &Forward<'_>) -> Result<bool, StoreError> {
        let now = self.clock.now_ms();
        let renewed = self
            .store
            .renew_leased(h.scope, h.token, now + millis(h.route.lease), now)
            .await;
        if let Ok(false) = renewed {
            metrics::fence_rejected();
        }
        renewed
    }

    async fn complete(&self, h: &Forward<'_>, completion: &Completion) {
        let now = self.clock.now_ms();
        match self
            .store
            .complete_leased(
                h.scope,
                h.token,
                completion,
                now,
                h.route.config.policy.expires_at_ms(now),
            )
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                metrics::fence_rejected();
                tracing::warn!(
                    "a forward's answer was not stored: its lease was taken over by a retry"
                );
            }
            // The record stays pending until its lease runs out; a retry
            // then finds it abandoned and the route's policy applies.
            Err(e) => tracing::warn!(
                error = &e as &(dyn std::error::Error + 'static),
                "a forward's answer could not be stored"
            ),
        }
    }

    /// The key goes back to where it was before this forward: released
    /// after a first one, unknown since the same time after a takeover.
    async fn restore(&self, h: &Forward<'_>, attempt: Attempt) {
        match attempt {
            Attempt::First => self.release(h).await,
            Attempt::Again { unknown_since_ms } => self.abandon(h, unknown_since_ms, None).await,
        }
    }

    async fn release(&self, h: &Forward<'_>) {
        if let Err(e) = self.store.release_leased(h.scope, h.token).await {
            // Not released: the lease runs out and a retry takes it over.
            tracing::warn!(
                error = &e as &(dyn std::error::Error + 'static),
                "could not release a key after a forward that did nothing"
            );
        }
    }

    /// Ends the lease at `until_ms` (the outcome unknown from then on).
    async fn abandon(&self, h: &Forward<'_>, until_ms: i64, reason: Option<&str>) {
        let now = self.clock.now_ms();
        match self
            .store
            .abandon_leased(h.scope, h.token, until_ms, reason, now)
            .await
        {
            Ok(true) => {}
            Ok(false) => metrics::fence_rejected(),
            // Not written: the lease runs out by itself, with the same
            // meaning, a lease later.
            Err(e) => tracing::warn!(
                error = &e as &(dyn std::error::Error + 'static),
                "could not end a forward's lease after an unknown outcome"
            ),
        }
    }
}

/// What came back from a forward that may have acted.
enum First {
    /// No usable answer.
    Failed(ForwardError),
    /// An answer that does not say whether it acted (a 5xx).
    Answered(Answer),
}

/// The upstream's answer as the client's. An upstream's own replay mark
/// is about the derived key, not the client's: the gateway's replays say
/// so themselves.
fn answer_response(mut answer: Answer) -> Response<Bytes> {
    answer.headers.remove(idem_http::IDEMPOTENT_REPLAYED);
    answer.headers.remove("idempotency-replayed");
    let mut res = Response::new(answer.body);
    *res.status_mut() = answer.status;
    *res.headers_mut() = answer.headers;
    res
}

/// A response whose whole body holds `held` until it is dropped.
fn held_response(res: Response<Bytes>, held: Held) -> Response {
    let (parts, body) = res.into_parts();
    Response::from_parts(parts, Body::new(HeldBody::new(body, held)))
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The request's `Content-Type`, as the upstream reads its body by it.
fn content_type(parts: &Parts) -> Option<&str> {
    parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
}

/// At most this many claims are given back at once ([`give_back`]); past
/// it, a claim whose answer was lost stays held until an operator resolves
/// it (`idem keys release`), as the 409 that its retries get says.
const GIVING_BACK_MAX: usize = 1024;

/// How long [`give_back`] keeps trying while the database does not answer.
const GIVE_BACK_FOR: Duration = Duration::from_secs(300);

/// Claims being given back now.
static GIVING_BACK: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Releases, in a task of its own, the claim `token` made on `scope` when
/// the claim's answer was lost: the insert may have committed, but nothing
/// was forwarded under it. The release deletes only a pending record
/// holding `token`, so it cannot free a key another request holds, and no
/// forward ever runs under this token. Until it has deleted the record it
/// tries again, 100 ms doubling to a minute, for [`GIVE_BACK_FOR`]: while
/// the database does not answer, and when there is nothing to delete yet
/// (the insert may still be running in a database that was stalled, and
/// commit after the first try).
fn give_back<S: LeasedKeyStore>(store: S, scope: Scope, token: LeaseToken) {
    use std::sync::atomic::Ordering;
    if GIVING_BACK.fetch_add(1, Ordering::SeqCst) >= GIVING_BACK_MAX {
        GIVING_BACK.fetch_sub(1, Ordering::SeqCst);
        tracing::warn!("a claim whose answer was lost is left held: too many given back at once");
        return;
    }
    tokio::spawn(async move {
        let until = Instant::now() + GIVE_BACK_FOR;
        let mut pause = Duration::from_millis(100);
        loop {
            let released = store.release_leased(&scope, &token).await;
            if let Ok(true) = released {
                break;
            }
            if Instant::now() + pause >= until {
                if let Err(e) = released {
                    tracing::warn!(
                        error = &e as &(dyn std::error::Error + 'static),
                        "a claim whose answer was lost could not be given back: an operator resolves its key"
                    );
                }
                break;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(60));
        }
        GIVING_BACK.fetch_sub(1, Ordering::SeqCst);
    });
}
