//! Runs the example binary against the suite's NATS server: three orders are
//! relayed and shipped once each; then every message is published again
//! under a new broker id (as a relay that lost its "sent" mark past the
//! stream's duplicate window would) — delivered twice, each is skipped by
//! the inbox and still shipped once.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{ChildStdout, Command};

/// Reads lines until one equals `want`; the lines before it.
async fn until(lines: &mut Lines<BufReader<ChildStdout>>, want: &str) -> Vec<String> {
    let mut seen = Vec::new();
    let read = async {
        while let Some(line) = lines.next_line().await.expect("read") {
            if line == want {
                return;
            }
            seen.push(line);
        }
        panic!("the example exited before `{want}`: {seen:?}");
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .unwrap_or_else(|_| panic!("no `{want}` within 30 s"));
    seen
}

#[tokio::test]
async fn each_order_ships_once_even_when_its_message_is_delivered_twice() {
    let dir =
        std::env::temp_dir().join(format!("example-outbox-relay-inbox-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let prefix = idem_testkit::unique_name("EXOUTBOX");
    let mut child = Command::new(env!("CARGO_BIN_EXE_example-outbox-relay-inbox"))
        .env("NATS_URL", idem_testkit::nats_url())
        .env("IDEM_DIR", &dir)
        .env("SUBJECTS", &prefix)
        .env("ORDERS", "3")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the example");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();

    let before = until(&mut lines, "applied 3, duplicates 0").await;
    let enqueued: Vec<(String, String)> = before
        .iter()
        .filter_map(|l| l.strip_prefix("enqueued "))
        .map(|l| {
            let (order, id) = l.split_once(' ').expect("`<order> <message id>`");
            (order.to_owned(), id.to_owned())
        })
        .collect();
    assert_eq!(enqueued.len(), 3, "{before:?}");

    // Every message again, same Idem-Message-Id, a broker id JetStream has
    // not seen: the stream stores it and the consumer receives it twice.
    let client = async_nats::connect(idem_testkit::nats_url())
        .await
        .expect("nats");
    let js = async_nats::jetstream::new(client);
    for (order, id) in &enqueued {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Idem-Message-Id", id.as_str());
        headers.insert("Idem-Message-Key", order.as_str());
        headers.insert("Nats-Msg-Id", format!("{id}-again").as_str());
        let payload = order.trim_start_matches("order-").to_owned();
        js.publish_with_headers(format!("{prefix}.orders.placed"), headers, payload.into())
            .await
            .expect("publish")
            .await
            .expect("the stream stored the copy");
    }
    until(&mut lines, "applied 3, duplicates 3").await;
    child.kill().await.expect("stop the example");

    let url = format!("sqlite://{}", dir.join("shipping.db").display());
    let pool = sqlx::SqlitePool::connect(&url).await.expect("shipping.db");
    let shipped: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT order_id, COUNT(*) FROM shipments GROUP BY order_id ORDER BY order_id",
    )
    .fetch_all(&pool)
    .await
    .expect("shipments");
    assert_eq!(
        shipped,
        vec![(1, 1), (2, 1), (3, 1)],
        "one shipment per order"
    );
    pool.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}
