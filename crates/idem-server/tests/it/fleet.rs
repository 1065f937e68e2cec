//! The fleet: `deploy/fleet/Procfile` as written — a three-node NATS
//! JetStream cluster, three `idem serve` on one PostgreSQL, two relays and
//! two consumers, each a real process, on free loopback ports — under
//! clients that retry on another instance (as a load balancer sends them):
//! payments and refunds, checkouts (a run whose instance dies is taken over
//! by another), webhooks received by one instance and forwarded by
//! whichever instance's worker claims them. Meanwhile: `kill -9` of a NATS
//! node (restarted on its store), of an instance, a relay, a consumer, and
//! PostgreSQL paused (every connection to it frozen with its socket open,
//! as a stopped server looks to its clients). Then, deterministically: a
//! webhook whose receiving instance is killed right after its `202` is
//! forwarded by another, and a checkout whose instance is killed while the
//! provider holds its charge is taken over by another. Checked as a
//! history: every acknowledged intent has one effect, every event is
//! applied once by the ledger, each payment's events are in order.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idem_testkit::{Proxy, Rng, TempDir, url_addr, url_via};

use crate::checkout::{ShopDb, World, is_final, order_body, set_stock, sold, stock};
use crate::history::{effects_by_payment, misordered, tally};
use crate::messaging::{consumer_state, eventually, outbox_of, replay_stream};
use crate::process::{Proc, free_port};
use crate::webhooks::{payment, sign, try_deliver};
use crate::{Reply, exchange, payments_of, try_call};

/// Where the sample files are.
const FLEET_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/fleet");

/// One line of the Procfile, its ports mapped to free ones.
struct Line {
    name: String,
    program: PathBuf,
    args: Vec<String>,
}

/// The Procfile's processes and the environment file's settings.
struct Fleet {
    lines: Vec<Line>,
    env: Vec<(String, String)>,
    procs: BTreeMap<String, Proc>,
    _dir: TempDir,
}

/// `text` with the port of every `127.0.0.1:PORT` replaced by a free one
/// (the same one wherever the same port is named).
fn map_ports(text: &str, ports: &mut BTreeMap<u16, u16>) -> String {
    const HOST: &str = "127.0.0.1:";
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(HOST) {
        out.push_str(&rest[..at + HOST.len()]);
        rest = &rest[at + HOST.len()..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if let Ok(port) = digits.parse::<u16>() {
            out.push_str(&ports.entry(port).or_insert_with(free_port).to_string());
            rest = &rest[digits.len()..];
        }
    }
    out.push_str(rest);
    out
}

impl Fleet {
    /// Reads `deploy/fleet/Procfile` and `fleet.env`; `overrides` replace
    /// or add settings (the test's database, its provider).
    fn load(overrides: &[(&str, String)]) -> Self {
        let dir = TempDir::new("fleet");
        let mut ports = BTreeMap::new();
        let procfile = std::fs::read_to_string(format!("{FLEET_DIR}/Procfile")).unwrap();
        let mut lines = Vec::new();
        for raw in procfile.lines().map(str::trim) {
            if raw.is_empty() || raw.starts_with('#') {
                continue;
            }
            let (name, command) = raw.split_once(':').unwrap();
            let mut words = command.split_whitespace();
            let program = match words.next().unwrap() {
                "idem" => PathBuf::from(env!("CARGO_BIN_EXE_idem")),
                "nats-server" => PathBuf::from(
                    std::env::var("IDEM_TEST_NATS_SERVER").unwrap_or_else(|_| "nats-server".into()),
                ),
                other => panic!("the Procfile runs {other}, which the test does not know"),
            };
            let (mut args, mut previous) = (Vec::new(), "");
            for word in words {
                let arg = if let Some(var) = word.strip_prefix('$') {
                    // The shell's expansion, from the environment file: read
                    // below, mapped then.
                    format!("${var}")
                } else if previous == "-p" {
                    let port: u16 = word.parse().unwrap();
                    ports.entry(port).or_insert_with(free_port).to_string()
                } else if let Some(store) = word.strip_prefix(".fleet/") {
                    dir.path().join(store).display().to_string()
                } else {
                    map_ports(word, &mut ports)
                };
                previous = word;
                args.push(arg);
            }
            lines.push(Line {
                name: name.trim().to_owned(),
                program,
                args,
            });
        }
        let text = std::fs::read_to_string(format!("{FLEET_DIR}/fleet.env")).unwrap();
        let mut env: Vec<(String, String)> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| {
                let (k, v) = l.split_once('=').unwrap();
                (k.to_owned(), map_ports(v, &mut ports))
            })
            .collect();
        for (key, value) in overrides {
            env.retain(|(k, _)| k != key);
            env.push(((*key).to_owned(), value.clone()));
        }
        for line in &mut lines {
            for arg in &mut line.args {
                if let Some(var) = arg.strip_prefix('$') {
                    let found = env.iter().find(|(k, _)| k == var);
                    *arg = found
                        .unwrap_or_else(|| panic!("${var} is not in fleet.env"))
                        .1
                        .clone();
                }
            }
        }
        Self {
            lines,
            env,
            procs: BTreeMap::new(),
            _dir: dir,
        }
    }

    fn line(&self, name: &str) -> &Line {
        self.lines.iter().find(|l| l.name == name).unwrap()
    }

    fn names(&self, prefix: &str) -> Vec<String> {
        let lines = self.lines.iter().map(|l| l.name.clone());
        lines.filter(|n| n.starts_with(prefix)).collect()
    }

    fn setting(&self, key: &str) -> String {
        self.env.iter().find(|(k, _)| k == key).unwrap().1.clone()
    }

    /// The address after `flag` on the line `name` (`--listen`, …).
    fn addr(&self, name: &str, flag: &str) -> SocketAddr {
        let args = &self.line(name).args;
        let at = args.iter().position(|a| a == flag).unwrap();
        args[at + 1].parse().unwrap()
    }

    /// Where `name` answers `/healthz`: an API's `--listen`, a relay's or
    /// consumer's `--metrics-listen`.
    fn probe(&self, name: &str) -> Option<SocketAddr> {
        let args = &self.line(name).args;
        ["--listen", "--metrics-listen"]
            .iter()
            .find(|f| args.iter().any(|a| a == *f))
            .map(|f| self.addr(name, f))
    }

    /// Starts the line `name` (again).
    fn start(&mut self, name: &str) {
        let line = self.line(name);
        let proc = Proc::spawn_program(&line.program, &line.args, &self.env);
        self.procs.insert(name.to_owned(), proc);
    }

    fn kill9(&mut self, name: &str) {
        if let Some(p) = self.procs.get_mut(name) {
            p.kill9();
        }
    }

    /// Waits until `name` answers (its `/healthz`, or a NATS node its port).
    async fn ready(&mut self, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let up = match self.probe(name) {
                Some(addr) => try_call(addr, "GET", "/healthz", None, "")
                    .await
                    .is_ok_and(|r| r.status == 200),
                None => {
                    let port: u16 = {
                        let args = &self.line(name).args;
                        let at = args.iter().position(|a| a == "-p").unwrap();
                        args[at + 1].parse().unwrap()
                    };
                    tokio::net::TcpStream::connect(("127.0.0.1", port))
                        .await
                        .is_ok()
                }
            };
            if up {
                return;
            }
            let alive = self.procs.get_mut(name).is_some_and(Proc::alive);
            assert!(alive, "{name} exited");
            assert!(Instant::now() < deadline, "{name} not up within 60 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Restarts whatever is not running.
    async fn revive(&mut self) {
        for name in self
            .lines
            .iter()
            .map(|l| l.name.clone())
            .collect::<Vec<_>>()
        {
            if !self.procs.get_mut(&name).is_some_and(Proc::alive) {
                self.start(&name);
            }
            self.ready(&name).await;
        }
    }
}

/// What a client sends.
enum Ask<'a> {
    /// `POST path` with an idempotency key.
    Post {
        path: &'a str,
        key: &'a str,
        body: &'a str,
    },
    /// A signed webhook delivery to the `github` endpoint.
    Webhook {
        headers: &'a [(String, String)],
        body: &'a str,
    },
}

impl Ask<'_> {
    async fn send(&self, addr: SocketAddr) -> std::io::Result<Reply> {
        match self {
            Ask::Post { path, key, body } => try_call(addr, "POST", path, Some(key), body).await,
            Ask::Webhook { headers, body } => try_deliver(addr, "github", headers, body).await,
        }
    }
}

/// One intent, sent to `apis[first]` and retried on the next instance
/// whenever one fails to answer finally (down, restarting, in flight, its
/// database paused): (the final answer, whether another instance gave it).
async fn settle_across(
    apis: &[SocketAddr],
    first: usize,
    ask: Ask<'_>,
    is_done: impl Fn(&Reply) -> bool,
) -> (Reply, bool) {
    let until = Instant::now() + Duration::from_secs(150);
    for attempt in 0.. {
        let addr = apis[(first + attempt) % apis.len()];
        if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(15), ask.send(addr)).await
            && is_done(&r)
        {
            return (r, attempt % apis.len() != 0);
        }
        assert!(
            Instant::now() < until,
            "an intent was not answered in 150 s"
        );
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    unreachable!()
}

/// The sum of a metric's samples in a Prometheus text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `GET path` with the admin token.
async fn get_with_token(addr: SocketAddr, path: &str, token: &str) -> Reply {
    let raw = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    exchange(addr, &raw).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_history_on_postgres() {
    let seed = idem_testkit::seed();
    let rng = Arc::new(Rng::new(seed));
    // The checkout's provider, its recording proxy and the mail relay; the
    // fleet's database, reached through a proxy that can pause it.
    let world = World::new(ShopDb::postgres().await).await;
    world.proxy.latency(Duration::from_millis(20));
    let db_url = world.db.url();
    let pg = Proxy::start(url_addr(&db_url)).await;
    // Where the webhooks are forwarded: the demo API of a shop of its own.
    let (upstream, _up) = crate::webhooks::upstream().await;
    let files = TempDir::new("fleet-config");
    let config = files.path().join("idem.toml");
    std::fs::write(
        &config,
        format!(
            r#"
            [webhooks.github]
            scheme = "github"
            secrets = ["github-secret"]
            forward_to = "http://{upstream}/v1/payments"
            forward_timeout_secs = 4
            [worker]
            lease_secs = 5
            poll_interval_ms = 50
            "#
        ),
    )
    .unwrap();
    let mut fleet = Fleet::load(&[
        ("IDEM_DATABASE_URL", url_via(&db_url, pg.addr)),
        // What the README has the reader put there.
        (
            "IDEM_ADMIN_TOKEN",
            format!("{:016x}{:016x}", rng.next(), rng.next()),
        ),
        ("IDEM_PROVIDER_URL", world.proxy.url()),
        ("IDEM_MAIL_URL", world.relay.url()),
        ("IDEM_RUN_LEASE", "1s".into()),
        ("IDEM_CALL_TIMEOUT", "2s".into()),
        ("IDEM_LANDING_MARGIN", "2s".into()),
        ("IDEM_CONFIG", config.display().to_string()),
        // Shorter than the sample's, so a killed relay's batch and a killed
        // consumer's deliveries come back within the run.
        ("IDEM_RELAY_LEASE", "3s".into()),
        ("IDEM_ACK_WAIT", "3s".into()),
    ]);
    let started = Instant::now();
    for name in fleet.names("nats") {
        fleet.start(&name);
    }
    for name in fleet.names("nats") {
        fleet.ready(&name).await;
    }
    // The APIs apply the migrations; then the relays and consumers.
    for name in fleet.names("api") {
        fleet.start(&name);
    }
    for name in fleet.names("api") {
        fleet.ready(&name).await;
    }
    for prefix in ["relay", "consume"] {
        for name in fleet.names(prefix) {
            fleet.start(&name);
        }
    }
    fleet.revive().await;
    let startup = started.elapsed();
    let apis: Arc<Vec<SocketAddr>> = Arc::new(
        fleet
            .names("api")
            .iter()
            .map(|n| fleet.addr(n, "--listen"))
            .collect(),
    );
    let skus = [("plenty", 10_000i64), ("scarce", 30)];
    for (sku, n) in skus {
        set_stock(apis[0], sku, n).await;
    }

    // The clients go on until the last fault is over.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let next = Arc::new(AtomicUsize::new(0));
    let moved = Arc::new(AtomicUsize::new(0));
    // What each client task holds.
    let shared = || {
        (
            apis.clone(),
            rng.clone(),
            next.clone(),
            moved.clone(),
            stop.clone(),
        )
    };
    // Payments, half of them refunded.
    let mut payers = Vec::new();
    for _ in 0..3 {
        let (apis, rng, next, moved, stop) = shared();
        payers.push(tokio::spawn(async move {
            let mut done = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let body = format!(
                    r#"{{"amount":{},"currency":"EUR","customer":"cus_fleet","reference":"fleet-{i}"}}"#,
                    1000 + i
                );
                let first = rng.range(0, 3) as usize;
                let key = format!("f-{i}");
                let (r, other) = settle_across(
                    &apis,
                    first,
                    Ask::Post {
                        path: "/v1/payments",
                        key: &key,
                        body: &body,
                    },
                    |r| r.status < 500 && r.status != 409,
                )
                .await;
                moved.fetch_add(usize::from(other), Ordering::SeqCst);
                assert_eq!(r.status, 201, "payment {i}: {}", String::from_utf8_lossy(&r.body));
                let id = r.json()["id"].as_str().unwrap().to_owned();
                let refunded = rng.chance(50);
                if refunded {
                    let (path, key) = (format!("/v1/payments/{id}/refunds"), format!("fr-{i}"));
                    let (r, other) = settle_across(
                        &apis,
                        rng.range(0, 3) as usize,
                        Ask::Post {
                            path: &path,
                            key: &key,
                            body: r#"{"amount":10}"#,
                        },
                        |r| r.status < 500 && r.status != 409,
                    )
                    .await;
                    moved.fetch_add(usize::from(other), Ordering::SeqCst);
                    assert_eq!(r.status, 201, "refund {i}");
                }
                done.push((id, refunded));
            }
            done
        }));
    }
    // Checkouts.
    let mut buyers = Vec::new();
    for _ in 0..2 {
        let (apis, rng, next, moved, stop) = shared();
        buyers.push(tokio::spawn(async move {
            let mut done = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let sku = if rng.chance(70) { "plenty" } else { "scarce" };
                let quantity = rng.range(1, 4) as i64;
                let body = order_body(&format!("cus_fo{i}"), sku, quantity, 100 + i as i64);
                let key = format!("fo-{i}");
                let (r, other) = settle_across(
                    &apis,
                    rng.range(0, 3) as usize,
                    Ask::Post {
                        path: "/v1/orders",
                        key: &key,
                        body: &body,
                    },
                    is_final,
                )
                .await;
                moved.fetch_add(usize::from(other), Ordering::SeqCst);
                done.push((i, sku, quantity, r));
            }
            done
        }));
    }
    // Webhooks: one instance receives, any instance's worker forwards; the
    // provider sends a third of them again, to another instance.
    let hooks = {
        let (apis, rng, next, _, stop) = shared();
        tokio::spawn(async move {
            let (mut acked, mut resent) = (Vec::new(), 0usize);
            while !stop.load(Ordering::SeqCst) {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let body = payment(&format!("cus_fw{i}"), "");
                let headers = sign::github("github-secret", &format!("fw-{i}"), &body);
                let copies = if rng.chance(33) { 2 } else { 1 };
                for copy in 0..copies {
                    let (r, _) = settle_across(
                        &apis,
                        rng.range(0, 3) as usize + copy,
                        Ask::Webhook {
                            headers: &headers,
                            body: &body,
                        },
                        |r| r.status < 300,
                    )
                    .await;
                    assert!(r.status < 300, "webhook {i}: {}", r.status);
                }
                resent += copies - 1;
                acked.push(i);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (acked, resent)
        })
    };

    // The faults, in an order the seed shuffles: each kind at least once.
    let mut plan = vec![
        "nats", "api", "relay", "consume", "pause", "nats", "api", "relay", "consume", "api",
    ];
    for i in (1..plan.len()).rev() {
        plan.swap(i, rng.range(0, i as u64 + 1) as usize);
    }
    let mut faults: BTreeMap<&str, usize> = BTreeMap::new();
    let mut not_ready_seen = 0usize;
    let token = fleet.setting("IDEM_ADMIN_TOKEN");
    let chaos = Instant::now();
    for fault in plan {
        tokio::time::sleep(Duration::from_millis(rng.range(800, 1600))).await;
        match fault {
            "pause" => {
                pg.freeze();
                let paused = Instant::now();
                // Past the second an answer of /readyz is reused.
                tokio::time::sleep(Duration::from_millis(1100)).await;
                // An API asked while its database is paused is not ready.
                let api = apis[rng.range(0, 3) as usize];
                let r = tokio::time::timeout(
                    Duration::from_secs(5),
                    try_call(api, "GET", "/readyz", None, ""),
                )
                .await;
                if let Ok(Ok(r)) = r {
                    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
                    assert_eq!(r.json()["database"], "no answer");
                    not_ready_seen += 1;
                }
                tokio::time::sleep(Duration::from_secs(3).saturating_sub(paused.elapsed())).await;
                pg.thaw();
            }
            kind => {
                let names = fleet.names(kind);
                let victim = names[rng.range(0, names.len() as u64) as usize].clone();
                fleet.kill9(&victim);
                let down = match kind {
                    "nats" => rng.range(1000, 3000),
                    "api" => rng.range(200, 800),
                    _ => rng.range(100, 500),
                };
                tokio::time::sleep(Duration::from_millis(down)).await;
                fleet.start(&victim);
                if kind != "nats" {
                    fleet.ready(&victim).await;
                }
            }
        }
        *faults.entry(fault).or_default() += 1;
    }

    let chaos = chaos.elapsed();
    stop.store(true, Ordering::SeqCst);
    let mut done = Vec::new();
    for p in payers {
        done.extend(p.await.unwrap());
    }
    let mut orders = Vec::new();
    for b in buyers {
        orders.extend(b.await.unwrap());
    }
    let (acked_hooks, resent) = hooks.await.unwrap();

    // Calm: everything up; the outbox, the runs, the deliveries drain.
    fleet.revive().await;
    let js = idem_nats::connect(&fleet.setting("NATS_URLS"), "fleet-test", false)
        .await
        .unwrap();
    eventually(Duration::from_secs(90), "the outbox drains", || async {
        outbox_of(&db_url)["pending"] == 0
    })
    .await;
    eventually(Duration::from_secs(90), "every run finishes", || async {
        world.unfinished_runs().await == 0
    })
    .await;
    // Duplicates on top: every seventh event published again under a new
    // broker id, which only the inbox can catch.
    let replayed = replay_stream(&js, |seq| seq % 7 == seed % 7).await;
    eventually(
        Duration::from_secs(90),
        "every delivery is acked",
        || async { matches!(consumer_state(&js).await, Some((0, 0, _))) },
    )
    .await;
    for i in &acked_hooks {
        let customer = format!("cus_fw{i}");
        eventually(
            Duration::from_secs(60),
            "every webhook is forwarded",
            || async { !payments_of(upstream, &customer).await.is_empty() },
        )
        .await;
    }

    // A webhook whose receiver dies right after its 202: another
    // instance's worker forwards it while the receiver is down.
    let receiver = fleet.names("api")[0].clone();
    let body = payment("cus_fw_orphan", "");
    let headers = sign::github("github-secret", "fw-orphan", &body);
    let r = try_deliver(apis[0], "github", &headers, &body)
        .await
        .unwrap();
    assert_eq!(r.status, 202, "{}", String::from_utf8_lossy(&r.body));
    fleet.kill9(&receiver);
    eventually(
        Duration::from_secs(30),
        "a webhook whose receiver died is forwarded by another instance",
        || async { !payments_of(upstream, "cus_fw_orphan").await.is_empty() },
    )
    .await;
    fleet.start(&receiver);
    fleet.ready(&receiver).await;

    // A checkout whose instance dies while the provider holds its charge:
    // the client retries on another instance, which takes the run over
    // after its lease; one charge.
    world.proxy.latency(Duration::from_millis(1500));
    let victim = fleet.names("api")[1].clone();
    let body = order_body("cus_fo_orphan", "plenty", 1, 4242);
    let in_flight = {
        let (addr, body) = (apis[1], body.clone());
        tokio::spawn(
            async move { try_call(addr, "POST", "/v1/orders", Some("fo-orphan"), &body).await },
        )
    };
    tokio::time::sleep(Duration::from_millis(600)).await;
    fleet.kill9(&victim);
    assert!(
        in_flight.await.unwrap().is_err(),
        "the order was still running when its instance died"
    );
    world.proxy.latency(Duration::from_millis(20));
    let ask = Ask::Post {
        path: "/v1/orders",
        key: "fo-orphan",
        body: &body,
    };
    let (taken_over, _) = settle_across(&apis, 2, ask, is_final).await;
    assert_eq!(
        taken_over.status,
        201,
        "{}",
        String::from_utf8_lossy(&taken_over.body)
    );
    orders.push((usize::MAX, "plenty", 1, taken_over));
    fleet.start(&victim);
    fleet.ready(&victim).await;

    // The history.
    let (payments, effects) = effects_by_payment(&db_url).await;
    let (lost, duplicated) = tally(&done, &effects);
    let misordered = misordered(&js).await;
    let strays = effects.len().saturating_sub(done.len());
    let t = world.tally(&orders).await;
    for (sku, initial) in skus {
        let (available, reserved) = stock(apis[0], sku).await;
        let want = initial - sold(&orders, sku);
        assert_eq!(
            (available + reserved, reserved),
            (want, 0),
            "seed {seed}: stock of {sku}"
        );
    }
    let (mut hooks_lost, mut hooks_duplicated) = (0usize, 0usize);
    let customers = acked_hooks.iter().map(|i| format!("cus_fw{i}"));
    for customer in customers.chain(["cus_fw_orphan".to_owned()]) {
        let n = payments_of(upstream, &customer).await.len();
        hooks_lost += usize::from(n == 0);
        hooks_duplicated += n.saturating_sub(1);
    }
    let dead = outbox_of(&db_url)["dead"].as_u64().unwrap();
    let refunds = done.iter().filter(|(_, r)| *r).count();
    let lost_all = lost as usize + t.lost + hooks_lost;
    let duplicated_all = duplicated as usize
        + t.double_charges
        + t.duplicate_mails
        + t.over_refunded
        + t.stray
        + hooks_duplicated
        + strays;

    // The stream's copies, and what each process says in /metrics.
    let stream = js.get_stream(idem_server::messaging::STREAM).await.unwrap();
    let info = stream.get_info().await.unwrap();
    assert_eq!(
        info.config.num_replicas, 3,
        "the stream has a copy on each node"
    );
    let peers = info.cluster.as_ref().map_or(0, |c| c.replicas.len());
    assert_eq!(peers, 2, "a leader and two replicas");
    // One more event, so the relays that restarted have published since.
    let r = crate::create(
        apis[0],
        "f-last",
        r#"{"amount":1,"currency":"EUR","customer":"cus_fl"}"#,
    )
    .await;
    assert_eq!(r.status, 201);
    eventually(
        Duration::from_secs(30),
        "the last event is published",
        || async { outbox_of(&db_url)["pending"] == 0 },
    )
    .await;
    let (mut lag_samples, mut applied, mut redeliveries) = (0.0, 0.0, 0.0);
    for name in fleet
        .names("relay")
        .into_iter()
        .chain(fleet.names("consume"))
    {
        let addr = fleet.addr(&name, "--metrics-listen");
        let ready = try_call(addr, "GET", "/readyz", None, "").await.unwrap();
        assert_eq!(
            ready.status,
            200,
            "{name}: {}",
            String::from_utf8_lossy(&ready.body)
        );
        let refused = try_call(addr, "GET", "/metrics", None, "").await.unwrap();
        assert_eq!(refused.status, 401, "{name}: /metrics needs the token");
        let m = get_with_token(addr, "/metrics", &token).await;
        assert_eq!(m.status, 200);
        let text = String::from_utf8_lossy(&m.body).into_owned();
        lag_samples += metric(&text, "idem_outbox_publish_lag_seconds_count");
        applied += metric(&text, "idem_inbox_messages_total");
        redeliveries += metric(&text, "idem_inbox_redeliveries_total");
    }
    assert!(
        lag_samples >= 1.0,
        "a relay's /metrics shows its publish lag"
    );
    // Runs whose instance died, taken over by the others (the counters of
    // the instances still up since their last restart).
    let mut takeovers = 0.0;
    for addr in apis.iter() {
        let m = get_with_token(*addr, "/metrics", &token).await;
        assert_eq!(m.status, 200);
        takeovers += metric(
            &String::from_utf8_lossy(&m.body),
            "idem_lease_takeovers_total",
        );
    }
    assert!(takeovers >= 1.0, "the orphaned order's run was taken over");
    println!(
        "fleet: seed={seed} processes={} startup={:.1}s chaos={:.1}s payments={} refunds={refunds} orders={} \
         confirmed={} out_of_stock={} webhooks={} resent={resent} retried_elsewhere={} \
         faults={faults:?} paused_db_not_ready={not_ready_seen} forced_duplicates={replayed} \
         run_takeovers={takeovers} relay_lag_samples={lag_samples} consumer_applied_since_restart={applied} \
         consumer_redeliveries_since_restart={redeliveries} \
         lost={lost_all} duplicated={duplicated_all} misordered={misordered} dead={dead}",
        fleet.lines.len(),
        startup.as_secs_f64(),
        chaos.as_secs_f64(),
        payments.len(),
        orders.len(),
        t.confirmed,
        t.out_of_stock,
        acked_hooks.len(),
        moved.load(Ordering::SeqCst),
    );
    assert_eq!(
        payments.len(),
        done.len(),
        "seed {seed}: one payment per acknowledged intent"
    );
    assert_eq!(
        faults.values().sum::<usize>(),
        10,
        "seed {seed}: every fault happened"
    );
    assert!(
        not_ready_seen >= 1,
        "seed {seed}: an API said it was not ready while its database was paused"
    );
    assert_eq!(
        (lost_all, duplicated_all, misordered, dead, t.key_changes),
        (0, 0, 0, 0, 0),
        "seed {seed}: lost, duplicated, misordered, dead, key changes"
    );

    // Two NATS nodes down: JetStream has no quorum. A relay, connected to
    // the third or reconnecting, is not ready; an API (no NATS) is.
    let nodes = fleet.names("nats");
    for node in &nodes[..2] {
        fleet.kill9(node);
    }
    let relay = fleet.addr(&fleet.names("relay")[0], "--metrics-listen");
    let relay_ready = || async {
        try_call(relay, "GET", "/readyz", None, "")
            .await
            .map_or(0, |r| r.status)
    };
    eventually(
        Duration::from_secs(30),
        "a relay is not ready without a JetStream quorum",
        || async { relay_ready().await == 503 },
    )
    .await;
    assert_eq!(
        crate::call(apis[0], "GET", "/readyz", None, "")
            .await
            .status,
        200
    );
    for node in &nodes[..2] {
        fleet.start(node);
    }
    eventually(
        Duration::from_secs(60),
        "the relay is ready again with the quorum back",
        || async { relay_ready().await == 200 },
    )
    .await;
}
