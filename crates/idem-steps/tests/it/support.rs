//! Databases, an executor that can crash, the fakes of the external systems
//! (a provider that honours keys, a sink that does not), and one workflow
//! whose plan each test sets.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_core::steps::{Failure, RunStore};
use idem_core::{
    BoxFuture, Completion, FingerprintSpec, IdempotencyKey, Operation, Policy, RequestParts, Scope,
    StoredResponse, Tenant,
};
use idem_postgres::{PgConfig, PgStore};
use idem_sql::patterns::PatternExec;
use idem_sqlite::{SqliteConfig, SqliteStore};
use idem_steps::{
    Ended, LookupCtx, Run, RunHandle, Runs, RunsConfig, Started, StepError, Stop, UndoCtx,
    Workflow, WorkflowPolicy,
};
use idem_testkit::{PgDatabase, TempDir};
use tokio::sync::watch;

pub const OP: &str = "orders.create";
pub const STOCK: i64 = 10;

/// A database for one test: a fresh SQLite file or PostgreSQL database.
pub enum Db {
    Sqlite(TempDir),
    Postgres(PgDatabase),
}

impl Db {
    pub fn url(&self) -> String {
        match self {
            Db::Sqlite(dir) => dir.sqlite_url(),
            Db::Postgres(db) => db.url.clone(),
        }
    }
}

/// A store the tests open by URL (migrated, with the `stock` table).
pub trait TestStore: RunStore<Tx: PatternExec> {
    fn db() -> impl Future<Output = Db>;
    fn open(url: &str) -> impl Future<Output = Self>;
    fn stock(&self) -> impl Future<Output = i64>;
}

impl TestStore for SqliteStore {
    async fn db() -> Db {
        Db::Sqlite(TempDir::new("steps-it"))
    }
    async fn open(url: &str) -> Self {
        let store = SqliteStore::connect(url, SqliteConfig::default())
            .await
            .unwrap();
        store.migrate().await.unwrap();
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS stock (id TEXT PRIMARY KEY, n INTEGER NOT NULL);
             INSERT INTO stock VALUES ('a', 10) ON CONFLICT DO NOTHING;",
        )
        .execute(store.pool())
        .await
        .unwrap();
        store
    }
    async fn stock(&self) -> i64 {
        sqlx::query_scalar("SELECT n FROM stock WHERE id = 'a'")
            .fetch_one(self.pool())
            .await
            .unwrap()
    }
}

impl TestStore for PgStore {
    async fn db() -> Db {
        Db::Postgres(PgDatabase::create("steps_it").await)
    }
    async fn open(url: &str) -> Self {
        let store = PgStore::connect(url, PgConfig::default()).await.unwrap();
        store.migrate().await.unwrap();
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS stock (id TEXT PRIMARY KEY, n BIGINT NOT NULL);
             INSERT INTO stock VALUES ('a', 10) ON CONFLICT DO NOTHING;",
        )
        .execute(store.pool())
        .await
        .unwrap();
        store
    }
    async fn stock(&self) -> i64 {
        sqlx::query_scalar("SELECT n FROM stock WHERE id = 'a'")
            .fetch_one(self.pool())
            .await
            .unwrap()
    }
}

pub fn scope(key: &str) -> Scope {
    Scope::new(
        Tenant::new("acme").unwrap(),
        Operation::new(OP).unwrap(),
        IdempotencyKey::new(key).unwrap(),
    )
}

pub fn fingerprint(body: &[u8]) -> idem_core::Fingerprint {
    let op = Operation::new(OP).unwrap();
    FingerprintSpec::default().fingerprint(&RequestParts {
        method: "POST",
        operation: &op,
        target: "/orders",
        json: true,
        body,
    })
}

/// A gate a step waits at until the test opens it (or never: a crash window).
#[derive(Clone)]
pub struct Gate(Arc<watch::Sender<bool>>);

impl Gate {
    pub fn new() -> Self {
        Self(Arc::new(watch::Sender::new(false)))
    }
    pub fn open(&self) {
        self.0.send_replace(true);
    }
    pub async fn wait(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|open| *open).await;
    }
}

/// A payment provider that honours `Idempotency-Key`: one payment per key,
/// one refund per key; it records every request.
#[derive(Clone, Default)]
pub struct Provider(pub Arc<Mutex<ProviderState>>);

#[derive(Default)]
pub struct ProviderState {
    /// `("charge" | "vanished" | "lookup" | "refund", key)` for every
    /// request, in order (`vanished`: a charge the black hole swallowed).
    pub requests: Vec<(String, String)>,
    /// Payment per charge key.
    pub payments: BTreeMap<String, String>,
    /// Payment refunded per refund key.
    pub refunds: BTreeMap<String, String>,
    in_flight: HashMap<String, u32>,
    /// The most requests with one key ever in flight at once.
    pub max_in_flight: u32,
    /// Until then, charges take effect but their answers are lost.
    pub lose_charge_answers_until: Option<Instant>,
    /// Until then, charges are refused before anything happens.
    pub refuse_charges_until: Option<Instant>,
    /// How long a charge takes.
    pub charge_delay: Duration,
    /// Until then, charges vanish: no answer ever comes (the call times
    /// out), and nothing happens — unless `land_after` is set.
    pub black_hole_charges_until: Option<Instant>,
    /// A vanished charge takes effect this long after it was sent (a
    /// request the network held).
    pub land_after: Option<Duration>,
    /// Until then, lookups fail with an unknown outcome.
    pub lookups_fail_until: Option<Instant>,
}

impl Provider {
    pub fn state<T>(&self, f: impl FnOnce(&ProviderState) -> T) -> T {
        f(&self.0.lock().unwrap())
    }

    pub fn charges(&self, key: Option<&str>) -> usize {
        self.state(|s| {
            s.requests
                .iter()
                .filter(|(op, k)| op == "charge" && key.is_none_or(|key| key == k))
                .count()
        })
    }

    pub fn requests(&self, op: &str) -> usize {
        self.state(|s| s.requests.iter().filter(|(o, _)| o == op).count())
    }

    pub async fn charge(&self, key: &str) -> Result<String, StepError> {
        if self.vanishes(key) {
            return std::future::pending().await;
        }
        let delay = {
            let mut s = self.0.lock().unwrap();
            if s.refuse_charges_until.is_some_and(|t| Instant::now() < t) {
                return Err(StepError::Retry("connection refused".into()));
            }
            s.requests.push(("charge".into(), key.into()));
            let n = s.in_flight.entry(key.into()).or_default();
            *n += 1;
            let n = *n;
            s.max_in_flight = s.max_in_flight.max(n);
            s.charge_delay
        };
        tokio::time::sleep(delay).await;
        let mut s = self.0.lock().unwrap();
        *s.in_flight.entry(key.into()).or_default() -= 1;
        let next = s.payments.len() + 1;
        let id = s
            .payments
            .entry(key.into())
            .or_insert_with(|| format!("pay_{next}"))
            .clone();
        if s.lose_charge_answers_until
            .is_some_and(|t| Instant::now() < t)
        {
            return Err(StepError::Unknown("the answer was lost".into()));
        }
        Ok(id)
    }

    /// Whether the black hole swallows this charge (it may land later).
    fn vanishes(&self, key: &str) -> bool {
        let mut s = self.0.lock().unwrap();
        if s.black_hole_charges_until
            .is_none_or(|t| Instant::now() >= t)
        {
            return false;
        }
        s.requests.push(("vanished".into(), key.into()));
        if let Some(after) = s.land_after {
            let (state, key) = (self.0.clone(), key.to_owned());
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let mut s = state.lock().unwrap();
                let next = s.payments.len() + 1;
                s.payments
                    .entry(key)
                    .or_insert_with(|| format!("pay_{next}"));
            });
        }
        true
    }

    /// The payment made with charge key `key`, if any: read-only.
    pub async fn find(&self, key: &str) -> Result<Option<String>, StepError> {
        let mut s = self.0.lock().unwrap();
        s.requests.push(("lookup".into(), key.into()));
        if s.lookups_fail_until.is_some_and(|t| Instant::now() < t) {
            return Err(StepError::Unknown("the lookup timed out".into()));
        }
        Ok(s.payments.get(key).cloned())
    }

    pub async fn refund(&self, key: &str, payment: &str) -> Result<(), StepError> {
        let mut s = self.0.lock().unwrap();
        s.requests.push(("refund".into(), key.into()));
        s.refunds
            .entry(key.into())
            .or_insert_with(|| payment.into());
        Ok(())
    }
}

/// A mail relay that does **not** deduplicate: every accepted send is a
/// message; it can say whether it has a message id.
#[derive(Clone, Default)]
pub struct Sink(pub Arc<Mutex<SinkState>>);

#[derive(Default)]
pub struct SinkState {
    /// Every accepted message id, duplicates kept.
    pub accepted: Vec<String>,
    /// Sends that are accepted but whose answer is lost.
    pub lose_answers: u32,
    /// Sends that vanish (not accepted) with no answer.
    pub swallow: u32,
}

impl Sink {
    pub fn accepted(&self) -> Vec<String> {
        self.0.lock().unwrap().accepted.clone()
    }

    pub async fn send(&self, id: &str) -> Result<(), StepError> {
        let mut s = self.0.lock().unwrap();
        if s.swallow > 0 {
            s.swallow -= 1;
            return Err(StepError::Unknown("no answer".into()));
        }
        s.accepted.push(id.into());
        if s.lose_answers > 0 {
            s.lose_answers -= 1;
            return Err(StepError::Unknown("the answer was lost".into()));
        }
        Ok(())
    }

    pub async fn has(&self, id: &str) -> Result<bool, StepError> {
        Ok(self.0.lock().unwrap().accepted.iter().any(|a| a == id))
    }
}

#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub enum Ship {
    #[default]
    Ok,
    Permanent,
    /// Unknown this many times, then done.
    UnknownTimes(u32),
}

#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub enum Mail {
    #[default]
    None,
    Verify,
    AtMostOnce,
}

/// What the test workflow does.
#[derive(Clone, Default)]
pub struct Plan {
    pub ship: Ship,
    /// After the provider's effect, the charge waits here.
    pub hold_charge: Option<Gate>,
    /// After the provider's effect, the refund waits here.
    pub hold_refund: Option<Gate>,
    /// Before the refund is sent (after its lookup), it waits here.
    pub hold_before_refund: Option<Gate>,
    /// The charge has no lookup.
    pub no_lookup: bool,
    pub mail: Mail,
    pub mail_id: Option<String>,
    /// The mail is the point of no return.
    pub ponr: bool,
    /// A step after the mail fails for good.
    pub fail_after_mail: bool,
    /// A step after the mail never learns its outcome.
    pub unknown_after_mail: bool,
}

/// reserve (phase, undo: release) → charge (call, undo: refund) → ship
/// (call) → mail (send) → the answer. An input of `invalid` is answered
/// 400 at once.
#[derive(Clone, Default)]
pub struct Flow {
    pub provider: Provider,
    pub sink: Sink,
    pub plan: Plan,
    pub log: Arc<Mutex<Vec<String>>>,
    ship_tries: Arc<Mutex<u32>>,
}

impl Flow {
    pub fn new(plan: Plan) -> Self {
        Self {
            plan,
            ..Self::default()
        }
    }

    /// The same fakes, another plan (another executor of the same world).
    pub fn with_plan(&self, plan: Plan) -> Self {
        Self {
            plan,
            ..self.clone()
        }
    }

    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

pub fn json(status: u16, body: serde_json::Value) -> StoredResponse {
    StoredResponse {
        status,
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.to_string().into_bytes(),
    }
}

impl<S: TestStore> Workflow<S> for Flow {
    fn run<'r>(&'r self, run: &'r mut Run<S>) -> BoxFuture<'r, Result<Completion, Stop>> {
        Box::pin(async move {
            if run.input() == b"invalid" {
                return Ok(Completion::failed(json(
                    400,
                    serde_json::json!({"error": "invalid"}),
                )));
            }
            let log = self.log.clone();
            let reserved: i64 = run
                .phase("reserve", |tx| {
                    Box::pin(async move {
                        tx.execute("UPDATE stock SET n = n - 1 WHERE id = 'a'", &[])
                            .await?;
                        Ok(1)
                    })
                })
                .undo("release", move |tx, n: i64| {
                    let log = log.clone();
                    Box::pin(async move {
                        let sql = "UPDATE stock SET n = n + $1 WHERE id = 'a'";
                        tx.execute(sql, &[idem_sql::patterns::Value::Int(n)])
                            .await?;
                        log.lock().unwrap().push("release".into());
                        Ok(())
                    })
                })
                .await?;
            let (provider, hold) = (self.provider.clone(), self.plan.hold_charge.clone());
            let (refunds, log, hold_refund, hold_before) = (
                self.provider.clone(),
                self.log.clone(),
                self.plan.hold_refund.clone(),
                self.plan.hold_before_refund.clone(),
            );
            let lookups = self.provider.clone();
            let mut charge = run
                .call("charge", move |ctx| {
                    let (provider, hold) = (provider.clone(), hold.clone());
                    async move {
                        let id = provider.charge(ctx.key.as_str()).await?;
                        if let Some(gate) = hold {
                            gate.wait().await;
                        }
                        Ok(id)
                    }
                })
                .undo("refund", move |ctx: UndoCtx, payment: String| {
                    let (provider, log, hold, before) = (
                        refunds.clone(),
                        log.clone(),
                        hold_refund.clone(),
                        hold_before.clone(),
                    );
                    async move {
                        if let Some(gate) = before {
                            gate.wait().await;
                        }
                        provider.refund(ctx.key.as_str(), &payment).await?;
                        if let Some(gate) = hold {
                            gate.wait().await;
                        }
                        log.lock().unwrap().push("refund".into());
                        Ok(())
                    }
                });
            if !self.plan.no_lookup {
                // Read-only: the payment the charge's key made, if any.
                charge = charge.lookup(move |ctx: LookupCtx| {
                    let provider = lookups.clone();
                    async move { provider.find(ctx.key.as_str()).await }
                });
            }
            let payment: String = charge.await?;
            let (ship, tries) = (self.plan.ship, self.ship_tries.clone());
            run.call("ship", move |_ctx| {
                let tries = tries.clone();
                async move {
                    let n = {
                        let mut t = tries.lock().unwrap();
                        *t += 1;
                        *t
                    };
                    match ship {
                        Ship::Ok => Ok(()),
                        Ship::Permanent => {
                            Err(StepError::Permanent("no route to the address".into()))
                        }
                        Ship::UnknownTimes(k) if n <= k => {
                            Err(StepError::Unknown("timeout".into()))
                        }
                        Ship::UnknownTimes(_) => Ok(()),
                    }
                }
            })
            .await?;
            let (sink, verify_sink) = (self.sink.clone(), self.sink.clone());
            let send = move |ctx: idem_steps::SendCtx| {
                let sink = sink.clone();
                async move { sink.send(&ctx.message_id).await }
            };
            match self.plan.mail {
                Mail::None => {}
                Mail::Verify => {
                    let verify = move |ctx: idem_steps::SendCtx| {
                        let sink = verify_sink.clone();
                        async move { sink.has(&ctx.message_id).await }
                    };
                    let mut step = run.send("mail", verify, send);
                    if let Some(id) = &self.plan.mail_id {
                        step = step.message_id(id.clone());
                    }
                    if self.plan.ponr {
                        step = step.point_of_no_return();
                    }
                    step.await?;
                }
                Mail::AtMostOnce => {
                    let mut step = run.send_at_most_once("mail", send);
                    if self.plan.ponr {
                        step = step.point_of_no_return();
                    }
                    step.await?;
                }
            }
            if self.plan.fail_after_mail {
                run.call("after", |_| async {
                    Err::<(), _>(StepError::Permanent("the warehouse refused".into()))
                })
                .await?;
            }
            if self.plan.unknown_after_mail {
                run.call("after", |_| async {
                    Err::<(), _>(StepError::Unknown("the warehouse does not answer".into()))
                })
                .await?;
            }
            Ok(Completion::completed(json(
                201,
                serde_json::json!({"payment": payment, "reserved": reserved}),
            )))
        })
    }

    fn failed<'r>(
        &'r self,
        run: &'r mut Run<S>,
        failure: &'r Failure,
    ) -> BoxFuture<'r, Result<Completion, Stop>> {
        Box::pin(async move {
            run.phase("mark-failed", |_tx| Box::pin(async { Ok(()) }))
                .await?;
            Ok(Completion::failed(json(
                402,
                serde_json::json!({"failed": failure.reason}),
            )))
        })
    }
}

/// Short leases and quick retries, so takeovers happen within a test.
pub fn quick() -> RunsConfig {
    RunsConfig {
        lease: Duration::from_secs(1),
        backoff: idem_core::Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(50),
        },
        poll: Duration::from_millis(20),
        // The fakes act at once: a request not seen by now never lands.
        landing_margin: Duration::from_millis(200),
        ..RunsConfig::default()
    }
}

pub fn runs<S: TestStore>(store: S, flow: Flow, config: RunsConfig) -> Runs<S> {
    runs_with(store, flow, config, WorkflowPolicy::default())
}

pub fn runs_with<S: TestStore>(
    store: S,
    flow: Flow,
    config: RunsConfig,
    policy: WorkflowPolicy,
) -> Runs<S> {
    Runs::builder(store)
        .config(config)
        .workflow(Operation::new(OP).unwrap(), flow, policy)
        .build()
        .unwrap()
}

/// Starts the run of `key` and expects it to be running here.
pub async fn start<S: TestStore>(runs: &Runs<S>, key: &str) -> RunHandle {
    match runs
        .start(
            &scope(key),
            &fingerprint(b"{}"),
            &Policy::default(),
            b"{}".to_vec(),
        )
        .await
        .unwrap()
    {
        Started::Running(h) => h,
        other => panic!("{key}: expected a running run, got {other:?}"),
    }
}

/// How a run's execution ended, within 20 s.
pub async fn ended(handle: &mut RunHandle) -> Ended {
    handle
        .ended(Duration::from_secs(20))
        .await
        .expect("the run ended within 20 s")
}

/// Waits until `$cond` (an expression that may `.await`) holds, for at most
/// 20 s.
#[macro_export]
macro_rules! eventually {
    ($what:expr, $cond:expr) => {{
        let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            if $cond {
                break;
            }
            assert!(
                std::time::Instant::now() < until,
                "{}: not within 20 s",
                $what
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }};
}

/// An executor in a runtime of its own, on a thread of its own, with its
/// own pool: [`Doomed::crash`] drops the runtime, and with it every task of
/// the executor — the run in the middle of its step, its heartbeat, its
/// connections — without any of its code running again: a crash.
pub struct Doomed {
    crash: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Doomed {
    /// Starts the runs of `keys`.
    pub fn start<S: TestStore>(
        url: String,
        flow: Flow,
        config: RunsConfig,
        keys: Vec<String>,
    ) -> Self {
        Self::launch::<S>(url, flow, config, WorkflowPolicy::default(), keys, false)
    }

    /// Starts the runs of `keys` under `policy`.
    pub fn start_with<S: TestStore>(
        url: String,
        flow: Flow,
        config: RunsConfig,
        policy: WorkflowPolicy,
        keys: Vec<String>,
    ) -> Self {
        Self::launch::<S>(url, flow, config, policy, keys, false)
    }

    /// A recovery worker: takes over the runs whose lease lapsed.
    pub fn recovering<S: TestStore>(url: String, flow: Flow, config: RunsConfig) -> Self {
        Self::launch::<S>(
            url,
            flow,
            config,
            WorkflowPolicy::default(),
            Vec::new(),
            true,
        )
    }

    fn launch<S: TestStore>(
        url: String,
        flow: Flow,
        config: RunsConfig,
        policy: WorkflowPolicy,
        keys: Vec<String>,
        recover: bool,
    ) -> Self {
        let (crash, crashed) = tokio::sync::oneshot::channel::<()>();
        let (up, is_up) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let store = S::open(&url).await;
                let runs = runs_with(store, flow, config, policy);
                for key in &keys {
                    drop(start(&runs, key).await);
                }
                if recover {
                    let mut recovery = runs.recovery();
                    tokio::spawn(async move {
                        loop {
                            let _ = recovery.recover_once().await;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    });
                }
                let _ = up.send(());
                let _ = crashed.await;
            });
            drop(rt);
        });
        is_up.recv().unwrap();
        Self {
            crash: Some(crash),
            thread: Some(thread),
        }
    }

    pub fn crash(mut self) {
        if let Some(c) = self.crash.take() {
            let _ = c.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Doomed {
    fn drop(&mut self) {
        if let Some(c) = self.crash.take() {
            let _ = c.send(());
        }
    }
}
