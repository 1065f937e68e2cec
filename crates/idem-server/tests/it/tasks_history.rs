//! The history test of issue 23: a fleet of the Python reference agent
//! (`examples/polling-agent/agent.py`) as real processes — three pollers
//! over one source of changing items, four workers notifying through `idem
//! mail-sink` (which does not deduplicate) — against `idem serve` on a real
//! SQLite file and a real PostgreSQL, while a seeded RNG `kill -9`s and
//! restarts agents and SIGSTOPs workers past their lease.
//!
//! Checked below the API (the database, the sink's list): every change
//! became exactly one task, every task was completed exactly once (one
//! `completed` event), every notification reached the sink exactly once
//! (verify mode) or at most once (at-most-once mode, the rest parked in
//! `needs_attention`), and the poller's cursor never moved backward (read
//! every 50 ms while the fleet runs). `IDEM_HISTORY_SEED` replays a seed;
//! `IDEM_TEST_PYTHON` names the interpreter (default `python3`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use idem_testkit::{PgDatabase, TempDir};
use serde_json::{Value, json};

use crate::fixture::serve;
use crate::process::{Proc, Server, free_port};
use crate::{call, try_exchange};

const LEASE: Duration = Duration::from_secs(3);
const TENANT: &str = "agents";

/// splitmix64: the fault schedule and the source's changes, from one seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// In `lo..hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
}

/// The source: `GET /changes?after=N` (at most 100, by `seq`) from a list
/// the test appends to while the fleet runs.
#[derive(Clone, Default)]
struct Source(Arc<Mutex<Vec<Value>>>);

async fn changes(
    State(s): State<Source>,
    Query(q): Query<HashMap<String, String>>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let Some(after) = q.get("after").and_then(|a| a.parse::<u64>().ok()) else {
        return (axum::http::StatusCode::BAD_REQUEST, "after=N").into_response();
    };
    let list = s.0.lock().unwrap();
    let out: Vec<&Value> = list
        .iter()
        .filter(|c| c["seq"].as_u64().unwrap() > after)
        .take(100)
        .collect();
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        json!({ "changes": out }).to_string(),
    )
        .into_response()
}

impl Source {
    async fn start(&self) -> SocketAddr {
        let router = axum::Router::new()
            .route("/changes", axum::routing::get(changes))
            .with_state(self.clone());
        serve(router).await
    }
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    fn append(&self, change: Value) {
        let mut list = self.0.lock().unwrap();
        let seq = list.len() + 1;
        let mut change = change;
        change["seq"] = seq.into();
        list.push(change);
    }
}

/// `n` changes over `items` items named `{prefix}{i}`: each change is the
/// next version of a random item (item i gets versions 1..k).
/// `n` changes over `items` items: every item changes at least once (when
/// `n >= items`), the rest fall on items drawn at random, in a shuffled order.
fn plan(rng: &mut Rng, prefix: &str, items: u64, n: usize) -> Vec<Value> {
    let mut versions = vec![0u64; items as usize];
    let mut order: Vec<usize> = (0..n)
        .map(|k| match k < items as usize {
            true => k,
            false => rng.range(0, items) as usize,
        })
        .collect();
    for k in (1..order.len()).rev() {
        order.swap(k, rng.range(0, k as u64 + 1) as usize);
    }
    order
        .into_iter()
        .map(|i| {
            versions[i] += 1;
            json!({"item": format!("{prefix}{i}"), "version": versions[i]})
        })
        .collect()
}

fn key_of(change: &Value) -> String {
    format!(
        "item:{}:v{}",
        change["item"].as_str().unwrap(),
        change["version"]
    )
}

/// One `python3 agent.py …` process; SIGKILLed on drop, its log printed
/// when the test fails.
pub(crate) struct Agent {
    args: Vec<String>,
    child: Child,
    log: PathBuf,
    stopped_until: Option<Instant>,
}

impl Agent {
    pub(crate) fn spawn(dir: &TempDir, name: &str, args: Vec<String>) -> Self {
        let log = dir.path().join(format!("{name}.log"));
        let python = std::env::var("IDEM_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/polling-agent/agent.py"
        );
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = Command::new(python)
            .arg(script)
            .args(&args)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        Self {
            args,
            child,
            log,
            stopped_until: None,
        }
    }
    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
    pub(crate) fn restart(&mut self, dir: &TempDir, name: &str) {
        self.kill9();
        *self = Self::spawn(dir, name, self.args.clone());
    }
    /// What it printed so far.
    pub(crate) fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig}");
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.stopped_until.is_some() {
            self.signal("-CONT");
        }
        self.kill9();
        if std::thread::panicking() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            eprintln!(
                "--- agent.py {} (last 30 lines) ---\n{}",
                self.args.join(" "),
                lines[lines.len().saturating_sub(30)..].join("\n")
            );
        }
    }
}

/// GET with the agents' tenant.
async fn get_as_agents(addr: SocketAddr, path: &str) -> Option<Value> {
    let raw = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nX-Tenant-Id: {TENANT}\r\n\r\n"
    );
    let r = try_exchange(addr, &raw).await.ok()?;
    (r.status == 200).then(|| r.json())
}

/// Reads the poller every 50 ms until `stop`; (reads, times it moved back).
fn watch_cursor(
    addr: SocketAddr,
    poller: &'static str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(u64, u64)> {
    tokio::spawn(async move {
        let (mut reads, mut backward, mut last) = (0u64, 0u64, (0i64, 0i64));
        while !stop.load(Ordering::Relaxed) {
            if let Some(p) = get_as_agents(addr, &format!("/v1/pollers/{poller}")).await {
                let now = (
                    p["version"].as_i64().unwrap(),
                    p["cursor"]["after"].as_i64().unwrap(),
                );
                if now.0 < last.0 || now.1 < last.1 {
                    eprintln!("cursor moved backward: {last:?} -> {now:?}");
                    backward += 1;
                }
                last = last.max(now);
                reads += 1;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (reads, backward)
    })
}

/// The queue's tasks below the API: key → (state, `completed` events).
async fn tasks_of(url: &str, queue: &str) -> BTreeMap<String, (String, i64)> {
    use sqlx::Connection;
    let sql = format!(
        "SELECT t.task_key, t.state, (SELECT COUNT(*) FROM idem_task_events e \
         WHERE e.task_id = t.id AND e.kind = 'completed') FROM idem_tasks t \
         WHERE t.tenant_id = '{TENANT}' AND t.queue = '{queue}'"
    );
    let rows: Vec<(String, String, i64)> = if url.starts_with("sqlite:") {
        let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::query_as(&sql).fetch_all(&mut c).await.unwrap()
    } else {
        let mut c = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query_as(&sql).fetch_all(&mut c).await.unwrap()
    };
    let n = rows.len();
    let map: BTreeMap<_, _> = rows.into_iter().map(|(k, s, c)| (k, (s, c))).collect();
    assert_eq!(map.len(), n, "task keys are unique");
    map
}

/// The sink's messages: subject (the task's key) → message ids.
pub(crate) async fn sink_messages(sink: SocketAddr) -> BTreeMap<String, Vec<String>> {
    let r = call(sink, "GET", "/messages", None, "").await;
    assert_eq!(r.status, 200);
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for m in r.json()["data"].as_array().unwrap() {
        out.entry(m["subject"].as_str().unwrap().to_owned())
            .or_default()
            .push(m["id"].as_str().unwrap().to_owned());
    }
    out
}

/// The fleet of one scenario and its fault schedule.
struct Fleet {
    dir: TempDir,
    agents: Vec<(String, Agent)>,
    /// Agents the faults may kill (index from here on).
    killable_from: usize,
    stops_left: u32,
    /// Faults injected: (kill -9 and restart, SIGSTOP past the lease).
    injected: (u32, u32),
    /// A fault every this many ms (a random pick in the range).
    faults: (u64, u64),
    /// The scenario fails when it is not finished by then.
    bound: Duration,
}

impl Fleet {
    fn add(&mut self, name: &str, args: &[&str]) {
        let args = args.iter().map(|s| s.to_string()).collect();
        self.agents
            .push((name.into(), Agent::spawn(&self.dir, name, args)));
    }

    /// One fault: every fourth one (while stops are left) SIGSTOPs a random
    /// worker past its lease; the others `kill -9` a random agent (not a
    /// paused one) and start it again.
    fn fault(&mut self, rng: &mut Rng) {
        let stop = self.stops_left > 0 && (self.injected.0 + self.injected.1) % 4 == 3;
        let candidates: Vec<usize> = (self.killable_from..self.agents.len())
            .filter(|&i| {
                let agent = &self.agents[i].1;
                agent.stopped_until.is_none() && (!stop || agent.args[0] == "work")
            })
            .collect();
        if candidates.is_empty() {
            return;
        }
        let i = candidates[rng.range(0, candidates.len() as u64) as usize];
        let (name, agent) = &mut self.agents[i];
        if stop {
            self.stops_left -= 1;
            self.injected.1 += 1;
            agent.signal("-STOP");
            agent.stopped_until = Some(Instant::now() + LEASE + Duration::from_secs(1));
        } else {
            self.injected.0 += 1;
            agent.restart(&self.dir, name);
        }
    }

    /// SIGCONT the workers whose pause is over (all with `all`).
    fn resume(&mut self, all: bool) {
        for (_, agent) in &mut self.agents {
            if agent
                .stopped_until
                .is_some_and(|until| all || Instant::now() >= until)
            {
                agent.signal("-CONT");
                agent.stopped_until = None;
            }
        }
    }
}

/// Runs a fleet over `source` until every change of `plan` is a task in a
/// final state (`finished`) — appending the plan in bursts of 15 to 40
/// every 300 ms and injecting a fault every `faults` ms — then resumes the
/// paused workers and gives a late one 3 s to misbehave.
async fn run(
    mut fleet: Fleet,
    rng: &mut Rng,
    source: &Source,
    plan: &[Value],
    finished: impl Fn(&BTreeMap<String, (String, i64)>) -> bool,
    check: (&str, &str),
) -> (u32, u32) {
    let (faults, bound) = (fleet.faults, fleet.bound);
    let started = Instant::now();
    let (mut next_burst, mut next_fault, mut next_check) = (started, started, started);
    loop {
        let now = Instant::now();
        assert!(
            now < started + bound,
            "the fleet did not finish within {bound:?}: {} of {} changes appended, tasks: {:?}",
            source.len(),
            plan.len(),
            tasks_of(check.0, check.1).await.values().fold(
                BTreeMap::<&str, u32>::new(),
                |mut m, (s, _)| {
                    *m.entry(s.as_str()).or_default() += 1;
                    m
                }
            )
        );
        if source.len() < plan.len() && now >= next_burst {
            let burst = rng.range(15, 41) as usize;
            for c in plan.iter().skip(source.len()).take(burst) {
                source.append(c.clone());
            }
            next_burst = now + Duration::from_millis(300);
        }
        fleet.resume(false);
        if now >= next_fault {
            fleet.fault(rng);
            next_fault = now + Duration::from_millis(rng.range(faults.0, faults.1));
        }
        if source.len() == plan.len() && now >= next_check {
            let tasks = tasks_of(check.0, check.1).await;
            if tasks.len() == plan.len() && finished(&tasks) {
                break;
            }
            next_check = now + Duration::from_millis(500);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    fleet.resume(true);
    tokio::time::sleep(LEASE + Duration::from_secs(1)).await;
    fleet.injected
}

async fn fleet_history(url: &str) {
    let started = Instant::now();
    let seed = std::env::var("IDEM_HISTORY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("tasks_history: seed={seed} (IDEM_HISTORY_SEED={seed} replays it)");
    let mut rng = Rng(seed);
    let server = Server::start(url, &[]).await;
    let sink_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let _sink = Proc::spawn(
        // Its body read timeout shorter than the workers' send margin: a
        // worker paused mid-send cannot have its message accepted late.
        &[
            "mail-sink".into(),
            "--listen".into(),
            sink_addr.to_string(),
            "--body-read-timeout".into(),
            "1s".into(),
        ],
        None,
    );
    for _ in 0..200 {
        if crate::try_call(sink_addr, "GET", "/messages", None, "")
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let idem = format!("http://{}", server.addr);
    let sink = format!("http://{sink_addr}");

    // Verify mode: 3 pollers, 4 workers, 700 changes over 500 items (each
    // item changes at least once).
    let source = Source::default();
    let src = format!("http://{}", source.start().await);
    let changes = plan(&mut rng, "a", 500, 700);
    let mut fleet = Fleet {
        dir: TempDir::new("agents"),
        agents: Vec::new(),
        killable_from: 0,
        stops_left: 3,
        injected: (0, 0),
        faults: (300, 700),
        bound: Duration::from_secs(90),
    };
    for n in 1..=3 {
        let args = [
            "poll", "--idem", &idem, "--source", &src, "--poller", "feed", "--queue", "notify",
        ];
        fleet.add(&format!("poller-{n}"), &args);
    }
    for n in 1..=4 {
        let args = [
            "work",
            "--idem",
            &idem,
            "--queue",
            "notify",
            "--sink",
            &sink,
            "--mode",
            "verify",
            "--lease",
            "3s",
            "--send-margin",
            "1500ms",
        ];
        fleet.add(&format!("worker-{n}"), &args);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_cursor(server.addr, "feed", stop.clone());
    let all_done = |t: &BTreeMap<String, (String, i64)>| t.values().all(|(s, _)| s == "done");
    let (kills, stops) = run(
        fleet,
        &mut rng,
        &source,
        &changes,
        all_done,
        (url, "notify"),
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let (reads, backward) = watcher.await.unwrap();

    let tasks = tasks_of(url, "notify").await;
    let planned: BTreeSet<String> = changes.iter().map(key_of).collect();
    assert_eq!(planned.len(), changes.len(), "the plan's keys are unique");
    assert_eq!(
        tasks.keys().cloned().collect::<BTreeSet<_>>(),
        planned,
        "every change became exactly one task"
    );
    let completed: i64 = tasks.values().map(|(_, c)| c).sum();
    for (key, (state, c)) in &tasks {
        assert_eq!(
            (state.as_str(), *c),
            ("done", 1),
            "{key}: done, completed once"
        );
    }
    let messages = sink_messages(sink_addr).await;
    let sent: usize = messages.values().map(Vec::len).sum();
    let duplicated: usize = messages.values().map(|m| m.len() - 1).sum();
    let lost = planned
        .iter()
        .filter(|k| !messages.contains_key(*k))
        .count();
    let stray = messages.keys().filter(|k| !planned.contains(*k)).count();
    println!(
        "seed={seed} changes={} tasks={} completed={completed} sink_messages={sent} \
         duplicated={duplicated} lost={lost} backward={backward} \
         (cursor reads={reads}, kill -9={kills}, SIGSTOP={stops})",
        changes.len(),
        tasks.len()
    );
    assert_eq!((duplicated, lost, stray, backward), (0, 0, 0, 0));
    assert!(reads > 20, "the cursor was watched ({reads} reads)");
    assert!(kills > 3 && stops > 0, "faults were injected");
    for (key, ids) in &messages {
        assert_eq!(ids.len(), 1, "{key}: one message");
        assert!(
            ids[0].starts_with("idem:notify:"),
            "{key}: sent under the action's key"
        );
    }

    // At-most-once mode: 2 pollers, 2 workers killed often; at most one
    // message per task, every task not done is parked.
    let source = Source::default();
    let src = format!("http://{}", source.start().await);
    let changes = plan(&mut rng, "b", 40, 80);
    let mut fleet = Fleet {
        dir: TempDir::new("agents-amo"),
        agents: Vec::new(),
        killable_from: 2,
        stops_left: 1,
        injected: (0, 0),
        faults: (150, 400),
        bound: Duration::from_secs(45),
    };
    for n in 1..=2 {
        let args = [
            "poll",
            "--idem",
            &idem,
            "--source",
            &src,
            "--poller",
            "feed-amo",
            "--queue",
            "notify-amo",
        ];
        fleet.add(&format!("amo-poller-{n}"), &args);
    }
    for n in 1..=2 {
        let args = [
            "work",
            "--idem",
            &idem,
            "--queue",
            "notify-amo",
            "--sink",
            &sink,
            "--mode",
            "at-most-once",
            "--lease",
            "3s",
            "--send-margin",
            "1500ms",
        ];
        fleet.add(&format!("amo-worker-{n}"), &args);
    }
    let settled = |t: &BTreeMap<String, (String, i64)>| {
        t.values()
            .all(|(s, _)| s == "done" || s == "needs_attention")
    };
    let (amo_kills, _) = run(
        fleet,
        &mut rng,
        &source,
        &changes,
        settled,
        (url, "notify-amo"),
    )
    .await;
    let tasks = tasks_of(url, "notify-amo").await;
    assert_eq!(tasks.len(), changes.len(), "every change became one task");
    let messages = sink_messages(sink_addr).await;
    let (mut done, mut parked, mut sent) = (0, 0, 0);
    for (key, (state, c)) in &tasks {
        let copies = messages.get(key).map_or(0, Vec::len);
        assert!(copies <= 1, "{key}: at most one message, {copies} sent");
        sent += copies;
        match state.as_str() {
            "done" => {
                assert_eq!((*c, copies), (1, 1), "{key}: done once, sent once");
                done += 1;
            }
            "needs_attention" => {
                assert_eq!(*c, 0, "{key}: parked, not completed");
                parked += 1;
            }
            other => panic!("{key}: {other}, neither done nor needs_attention"),
        }
    }
    println!(
        "at-most-once: changes={} tasks={} done={done} needs_attention={parked} \
         sink_messages={sent} duplicated=0 kill -9={amo_kills} ({:.1} s in all)",
        changes.len(),
        tasks.len(),
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_history_fleet_on_sqlite() {
    let dir = TempDir::new("tasks-history");
    fleet_history(&dir.sqlite_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_history_fleet_on_postgres() {
    let db = PgDatabase::create("idem_tasks_history").await;
    fleet_history(&db.url).await;
}
