//! `idem drill` against a server whose idempotency store lives in each
//! worker process: two real processes (`tests/clients/per_worker_store.py`,
//! standard-library Python) bound to one port with `SO_REUSEPORT`, so the
//! kernel hands each new connection to one of them, as `uvicorn --workers 2`
//! or `gunicorn --reuse-port` do with an in-memory store. Each worker is right
//! about the keys it has seen; a retry or a second body that meets the other
//! worker runs again. The payments (and every request, with the client's
//! port) go to one shared SQLite file, which the test reads itself: the
//! server's own count of effects and of connections.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;

use crate::drill_runner::{drill, drill_args, drill_named, outcome, report};
use crate::fixture::TempDir;
use crate::process::{Proc, free_port};
use crate::try_call;

/// Workers of `per_worker_store.py` on one port, and their shared database.
struct Workers {
    addr: SocketAddr,
    db: sqlx::SqlitePool,
    _procs: Vec<Proc>,
    _dir: TempDir,
}

impl Workers {
    /// `n` worker processes on one port; returns once each has answered.
    async fn start(n: usize) -> Self {
        let dir = TempDir::new("drill-workers");
        let file = dir.path().join("payments.db");
        let port = free_port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/clients/per_worker_store.py"
        );
        let python = std::path::PathBuf::from(idem_testkit::python());
        let args = [
            script.to_owned(),
            port.to_string(),
            file.display().to_string(),
        ];
        let mut procs = Vec::new();
        for _ in 0..n {
            procs.push(Proc::spawn_program(&python, &args, &[]));
            // One at a time: the first creates the tables.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        // Each new connection goes to one worker at random: ask until every
        // worker has answered once.
        let mut seen = HashSet::new();
        for _ in 0..600 {
            if let Ok(r) = try_call(addr, "GET", "/healthz", None, "").await
                && r.status == 200
            {
                seen.insert(r.json()["worker"].as_u64().unwrap());
            }
            if seen.len() == n {
                break;
            }
            for p in &mut procs {
                assert!(p.alive(), "a worker exited early:\n{}", p.log());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(seen.len(), n, "every worker answers on the one port");
        let db = sqlx::SqlitePool::connect(&format!("sqlite://{}", file.display()))
            .await
            .unwrap();
        Workers {
            addr,
            db,
            _procs: procs,
            _dir: dir,
        }
    }

    /// The probe: payments of `customer`, counted in the shared database.
    async fn effects(&self, customer: &str) -> u64 {
        let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM payments WHERE customer = ?")
            .bind(customer)
            .fetch_one(&self.db)
            .await
            .unwrap();
        n as u64
    }

    /// The client ports of the POSTs of `customer`, in the order received.
    async fn post_ports(&self, customer: &str) -> Vec<i64> {
        let rows: Vec<(i64,)> = sqlx::query_as(
            "SELECT client_port FROM requests WHERE customer = ? AND method = 'POST' ORDER BY rowid",
        )
        .bind(customer)
        .fetch_all(&self.db)
        .await
        .unwrap();
        rows.into_iter().map(|(p,)| p).collect()
    }
}

/// Runs the drill against `w` with `extra` flags: exit status, report.
async fn run(w: &Workers, extra: &[&str]) -> (Option<i32>, Value) {
    let mut args = drill_args(w.addr);
    args.extend(["--json", "--concurrency", "4"].map(String::from));
    args.extend(extra.iter().map(|s| s.to_string()));
    let out = drill(args).await;
    (out.status.code(), report(&out))
}

/// Every round of every drill run in rounds: its effects are the
/// server's own count, and it is a contract FAIL exactly where that count
/// is other than one.
async fn assert_rounds_agree_with_the_probe(w: &Workers, r: &Value, names: &[&str]) {
    for name in names {
        let rounds = &drill_named(r, name)["rounds"];
        let each = rounds["each"]
            .as_array()
            .unwrap_or_else(|| panic!("{name} runs in rounds: {rounds}"));
        assert_eq!(each.len() as u64, rounds["run"].as_u64().unwrap());
        for round in each {
            let probe = w.effects(round["unique"].as_str().unwrap()).await;
            assert_eq!(round["effects"], probe, "{name}: {round}");
            if probe != 1 {
                assert_eq!(round["outcome"], "fail", "{name}: {round}");
            } else {
                assert_ne!(round["outcome"], "fail", "{name}, one effect: {round}");
            }
        }
    }
}

const ROUNDS_DRILLS: &[&str] = &[
    "lost-response",
    "abandoned-request",
    "concurrency",
    "key-reuse",
    "reordered-fields",
];

/// Two workers, a store each: another payload under a used key is accepted
/// whenever it meets the worker that has not seen the key. Each connection
/// goes to either worker (the kernel's choice), so one try is a coin toss:
/// over 20 rounds, each on new connections, it happens (all 20 on one
/// worker: one chance in a million).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_per_worker_process_behind_one_port_fails_key_reuse() {
    let w = Workers::start(2).await;
    let (code, r) = run(&w, &["--rounds", "20"]).await;
    let reuse = drill_named(&r, "key-reuse");
    assert_eq!(reuse["outcome"], "fail", "{reuse:#}");
    assert_eq!(code, Some(1), "{r:#}");
    let rounds = &reuse["rounds"];
    assert_eq!(
        rounds["run"], 20,
        "key-reuse runs --rounds times: {reuse:#}"
    );
    let failed = rounds["failed"].as_u64().unwrap();
    assert!(failed >= 1, "{rounds}");
    assert!(
        reuse["summary"]
            .as_str()
            .unwrap()
            .contains(&format!("{failed} of 20 rounds failed")),
        "{reuse:#}"
    );
    assert_rounds_agree_with_the_probe(&w, &r, ROUNDS_DRILLS).await;
    // The second body of every round went out on a connection of its own,
    // as a client retrying after a failure sends it.
    for round in rounds["each"].as_array().unwrap() {
        let ports = w.post_ports(round["unique"].as_str().unwrap()).await;
        assert_eq!(ports.len(), 2, "the first body and the other: {round}");
        assert_ne!(ports[0], ports[1], "a new connection: {round}");
    }
    println!(
        "per-worker store: key-reuse failed {failed} of 20 rounds; lost-response {} of {}; concurrency {} of {}",
        drill_named(&r, "lost-response")["rounds"]["failed"],
        drill_named(&r, "lost-response")["rounds"]["run"],
        drill_named(&r, "concurrency")["rounds"]["failed"],
        drill_named(&r, "concurrency")["rounds"]["run"],
    );
}

/// The control: one worker of the same server is right on every drill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_of_the_same_server_passes_every_round() {
    let w = Workers::start(1).await;
    let (code, r) = run(&w, &["--rounds", "5"]).await;
    assert_eq!(code, Some(0), "{r:#}");
    assert_eq!(r["counts"]["fail"], 0, "{r:#}");
    for name in ROUNDS_DRILLS {
        assert_eq!(outcome(&r, name), "pass", "{name}: {r:#}");
    }
    assert_eq!(drill_named(&r, "key-reuse")["rounds"]["run"], 5, "{r:#}");
    assert_rounds_agree_with_the_probe(&w, &r, ROUNDS_DRILLS).await;
}
