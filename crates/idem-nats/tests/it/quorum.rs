//! Whether a stream has a quorum, asked of a three-node JetStream cluster of
//! the test's own whose nodes are killed with SIGKILL.

use std::time::{Duration, Instant};

use async_nats::jetstream::Context;
use idem_nats::{StreamSettings, ensure_stream_with, stream_has_quorum};
use idem_testkit::NatsCluster;

/// Creates `name` with three copies, waiting while the new cluster elects
/// its leaders (at most 30 s).
async fn create_r3(js: &Context, name: &str) {
    let settings = StreamSettings {
        replicas: 3,
        ..StreamSettings::new(Duration::from_secs(120))
    };
    let subject = format!("{name}.>");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match ensure_stream_with(js, name, &[&subject], &settings).await {
            Ok(_) => return,
            Err(e) => assert!(Instant::now() < deadline, "stream {name}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The node that leads `name` now.
async fn leader(js: &Context, name: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(mut stream) = js.get_stream(name).await
            && let Ok(info) = stream.info().await
            && let Some(leader) = info.cluster.as_ref().and_then(|c| c.leader.clone())
        {
            return leader;
        }
        assert!(Instant::now() < deadline, "stream {name} has no leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One readiness question, as `/readyz` asks it: within a second.
async fn has_quorum(js: &Context, name: &str) -> Result<bool, String> {
    match tokio::time::timeout(Duration::from_secs(1), stream_has_quorum(js, name)).await {
        Ok(Ok(held)) => Ok(held),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer within 1 s".into()),
    }
}

/// A healthy cluster keeps its quorum while the stream is written at
/// irregular intervals (a leader skips its heartbeat after sending entries,
/// so a live follower can go about two heartbeat intervals unheard) and
/// polled every 100 ms for 10 s: not one answer says otherwise. Then the
/// leader's two followers are killed: the leader left still answers about
/// the stream, and within 3 s that answer says it has no quorum (NATS 2.9
/// keeps the followers "current" for 10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_has_a_quorum_only_while_a_majority_of_its_copies_is_heard_from() {
    let mut cluster = NatsCluster::start(3);
    let js = idem_nats::connect(&cluster.urls(), "quorum-test", false)
        .await
        .unwrap();
    let name = idem_testkit::unique_name("QUORUM");
    create_r3(&js, &name).await;
    // Asked of the leader itself, as a relay connected to the node left is.
    let lead = leader(&js, &name).await;
    let at_leader = idem_nats::connect(&cluster.url(&lead), "quorum-leader", false)
        .await
        .unwrap();

    let rng = idem_testkit::Rng::new(idem_testkit::seed());
    let writer = {
        let (js, subject) = (js.clone(), format!("{name}.x"));
        let pauses: Vec<u64> = (0..20).map(|_| rng.range(900, 2400)).collect();
        tokio::spawn(async move {
            for pause in pauses {
                let ack = js.publish(subject.clone(), "x".into()).await.unwrap();
                ack.await.unwrap();
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
        })
    };
    let healthy = Instant::now();
    let (mut asked, mut wrong) = (0usize, Vec::new());
    while healthy.elapsed() < Duration::from_secs(10) {
        asked += 1;
        let answer = has_quorum(&at_leader, &name).await;
        if answer != Ok(true) {
            wrong.push((healthy.elapsed(), answer));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    writer.abort();
    assert_eq!(
        wrong,
        Vec::new(),
        "a healthy cluster answered otherwise in {} of {asked} questions",
        wrong.len()
    );
    assert_eq!(leader(&js, &name).await, lead, "no election meanwhile");

    for node in cluster.names() {
        if node != lead {
            cluster.kill(&node);
        }
    }
    let killed = Instant::now();
    let lost = loop {
        let answer = has_quorum(&at_leader, &name).await;
        if answer != Ok(true) {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(15),
            "the leader alone still has a quorum 15 s after its followers died"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "quorum: {asked} questions to a healthy cluster, all yes; the leader alone says no after {:.1} s",
        lost.as_secs_f64()
    );
    assert!(
        lost < Duration::from_secs(3),
        "the leader alone said it had a quorum for {:.1} s after its followers died",
        lost.as_secs_f64()
    );
}

/// Paused rather than killed (SIGSTOP: the processes and their sockets
/// stay, nothing answers): the leader's two followers paused, the leader
/// left says it has no quorum within 3 s; resumed, it has one again. Then
/// the leader itself paused: a question through it gets no answer within
/// the second readiness waits (not a yes), and once resumed the stream has
/// a quorum again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_nodes_count_as_gone_until_they_run_again() {
    let mut cluster = NatsCluster::start(3);
    let js = idem_nats::connect(&cluster.urls(), "quorum-pause", false)
        .await
        .unwrap();
    let name = idem_testkit::unique_name("PAUSED");
    create_r3(&js, &name).await;
    let lead = leader(&js, &name).await;
    let at_leader = idem_nats::connect(&cluster.url(&lead), "quorum-pause-leader", false)
        .await
        .unwrap();
    assert_eq!(has_quorum(&at_leader, &name).await, Ok(true));
    let followers: Vec<String> = cluster.names().into_iter().filter(|n| *n != lead).collect();
    for f in &followers {
        cluster.pause(f);
    }
    let paused = Instant::now();
    let lost = loop {
        if has_quorum(&at_leader, &name).await != Ok(true) {
            break paused.elapsed();
        }
        assert!(
            paused.elapsed() < Duration::from_secs(15),
            "the leader still has a quorum 15 s after its followers were paused"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        lost < Duration::from_secs(3),
        "the leader said it had a quorum for {:.1} s after its followers were paused",
        lost.as_secs_f64()
    );
    for f in &followers {
        cluster.resume(f);
    }
    let resumed = Instant::now();
    while has_quorum(&js, &name).await != Ok(true) {
        assert!(
            resumed.elapsed() < Duration::from_secs(30),
            "no quorum 30 s after the followers ran again"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let lead = leader(&js, &name).await;
    let at_leader = idem_nats::connect(&cluster.url(&lead), "quorum-pause-leader-2", false)
        .await
        .unwrap();
    cluster.pause(&lead);
    for _ in 0..5 {
        let answer = has_quorum(&at_leader, &name).await;
        assert_ne!(answer, Ok(true), "a paused leader's node answered yes");
    }
    cluster.resume(&lead);
    let back = Instant::now();
    while has_quorum(&js, &name).await != Ok(true) {
        assert!(
            back.elapsed() < Duration::from_secs(30),
            "no quorum 30 s after the leader ran again"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "paused: no quorum {:.1} s after the followers stopped; back after they ran again",
        lost.as_secs_f64()
    );
}

/// A healthy cluster whose stream is written as fast as publishers can
/// (a relay draining a backlog): followers acknowledge entries all the
/// time but may trail the leader by a few; asked every 100 ms for 10 s,
/// not one answer says the quorum is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_written_flat_out_keeps_its_quorum() {
    let cluster = NatsCluster::start(3);
    let js = idem_nats::connect(&cluster.urls(), "quorum-busy", false)
        .await
        .unwrap();
    let name = idem_testkit::unique_name("BUSY");
    create_r3(&js, &name).await;
    let lead = leader(&js, &name).await;
    let at_leader = idem_nats::connect(&cluster.url(&lead), "quorum-busy-leader", false)
        .await
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let (js, subject, stop) = (js.clone(), format!("{name}.w{w}"), stop.clone());
            tokio::spawn(async move {
                let mut sent = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // 32 in flight, then their acks.
                    let mut acks = Vec::with_capacity(32);
                    for _ in 0..32 {
                        acks.push(
                            js.publish(subject.clone(), vec![b'x'; 512].into())
                                .await
                                .unwrap(),
                        );
                    }
                    for ack in acks {
                        ack.await.unwrap();
                        sent += 1;
                    }
                }
                sent
            })
        })
        .collect();
    let started = Instant::now();
    let (mut asked, mut wrong) = (0usize, Vec::new());
    while started.elapsed() < Duration::from_secs(10) {
        asked += 1;
        let answer = has_quorum(&at_leader, &name).await;
        if answer != Ok(true) {
            wrong.push((started.elapsed(), answer));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut sent = 0;
    for w in writers {
        sent += w.await.unwrap();
    }
    println!(
        "busy: {sent} messages written over 10 s; {asked} questions, {} not yes",
        wrong.len()
    );
    assert_eq!(
        wrong,
        Vec::new(),
        "a healthy cluster written flat out ({sent} messages) answered otherwise in {} of {asked} questions",
        wrong.len()
    );
}
