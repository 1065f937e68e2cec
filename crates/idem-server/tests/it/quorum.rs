//! Readiness after quorum loss: `idem relay` and `idem consume` (each with
//! `--metrics-listen`, `--nats-replicas 3`) on a three-node NATS cluster of
//! the test's own, whose nodes are killed with SIGKILL and restarted.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use async_nats::jetstream::Context;
use idem_testkit::{NatsCluster, TempDir};

use crate::messaging::eventually;
use crate::process::{Proc, free_port};
use crate::try_call;

/// The deadline a relay or a consumer has to say it is not ready.
const WITHIN: Duration = Duration::from_secs(3);

/// What `/readyz` at `addr` answers: its status, 0 without an answer
/// within 5 s.
async fn readyz(addr: SocketAddr) -> u16 {
    let ask = try_call(addr, "GET", "/readyz", None, "");
    match tokio::time::timeout(Duration::from_secs(5), ask).await {
        Ok(Ok(r)) => r.status,
        _ => 0,
    }
}

/// Asks `/readyz` at `addr` every 100 ms from `since`, until it has
/// answered 503 for 2 s straight past the deadline (at most 15 s): when it
/// last answered anything else (`None`: never), and how many answers.
async fn last_ready(addr: SocketAddr, since: Instant) -> (Option<Duration>, usize) {
    let (mut last, mut answers, mut refusing) = (None, 0, None);
    loop {
        let status = readyz(addr).await;
        let at = since.elapsed();
        answers += 1;
        if status == 503 {
            let from: Duration = *refusing.get_or_insert(at);
            if at - from >= Duration::from_secs(2) && at > WITHIN + Duration::from_secs(1) {
                return (last, answers);
            }
        } else {
            last = Some(at);
            refusing = None;
        }
        if at > Duration::from_secs(15) {
            return (last, answers);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The node that leads the events stream now.
async fn leader(js: &Context) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(mut stream) = js.get_stream(idem_server::messaging::STREAM).await
            && let Ok(info) = stream.info().await
            && let Some(leader) = info.cluster.as_ref().and_then(|c| c.leader.clone())
        {
            return leader;
        }
        assert!(Instant::now() < deadline, "the events stream has no leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn migrate(url: &str) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["migrate", "--database-url", url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The README: relays and consumers are not ready while two of three
/// nodes are down. Whichever two die — the stream leader's two followers
/// (the leader left still answers about the stream, its followers
/// "current" for 10 s in NATS 2.9), or the leader and a follower (the node
/// left is a follower that answers nothing) — both answer `/readyz` 503
/// within 3 s, asked every 100 ms, and stay so; once the nodes are back,
/// both are ready again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_and_consumers_are_not_ready_within_3_s_of_their_stream_losing_quorum() {
    let mut cluster = NatsCluster::start(3);
    let dir = TempDir::new("quorum");
    let db = dir.sqlite_url();
    migrate(&db);
    let (mut probes, mut procs) = (Vec::new(), Vec::new());
    for command in ["relay", "consume"] {
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let args: Vec<String> = [
            command,
            "--database-url",
            &db,
            "--nats-url",
            &cluster.urls(),
            "--nats-replicas",
            "3",
            "--metrics-listen",
            &addr.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        procs.push(Proc::spawn(&args, None));
        probes.push((command, addr));
    }
    let all_ready = || {
        let probes = &probes;
        async move {
            for (_, addr) in probes {
                if readyz(*addr).await != 200 {
                    return false;
                }
            }
            true
        }
    };
    eventually(
        Duration::from_secs(60),
        "the relay and the consumer are ready",
        all_ready,
    )
    .await;
    let js = idem_nats::connect(&cluster.urls(), "quorum-test", false)
        .await
        .unwrap();

    let (mut report, mut late) = (Vec::new(), Vec::new());
    for case in ["the leader's two followers", "the leader and a follower"] {
        let lead = leader(&js).await;
        let others: Vec<String> = cluster.names().into_iter().filter(|n| *n != lead).collect();
        let victims = if case.starts_with("the leader's") {
            others
        } else {
            vec![lead, others[0].clone()]
        };
        for node in &victims {
            cluster.kill(node);
        }
        let killed = Instant::now();
        let watching: Vec<_> = probes
            .iter()
            .map(|(_, addr)| tokio::spawn(last_ready(*addr, killed)))
            .collect();
        let mut watched = Vec::new();
        for w in watching {
            watched.push(w.await.unwrap());
        }
        for node in &victims {
            cluster.restart(node);
        }
        for ((command, _), (last, answers)) in probes.iter().zip(watched) {
            let said = match last {
                None => "503 from the first answer".to_owned(),
                Some(at) => format!("last not-503 answer {:.1} s after", at.as_secs_f64()),
            };
            report.push(format!(
                "{case} killed: idem {command}: {said} ({answers} answers)"
            ));
            if last.is_some_and(|at| at >= WITHIN) {
                late.push(report.last().cloned().unwrap_or_default());
            }
        }
        eventually(
            Duration::from_secs(60),
            "the relay and the consumer are ready again with the nodes back",
            all_ready,
        )
        .await;
    }
    println!("quorum:\n  {}", report.join("\n  "));
    assert!(
        late.is_empty(),
        "ready (or no answer) 3 s or more after the stream lost its quorum:\n  {}",
        late.join("\n  ")
    );
}
