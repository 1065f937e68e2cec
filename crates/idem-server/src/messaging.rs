//! The demo's events on the broker `--broker-url` names ([`idem_broker`]):
//! payment events on `payments.…`, and the ledger consumer `demo-ledger`.

use std::time::Duration;

pub use idem_broker::{Broker, BrokerUrl, ConsumeConfig, Routes};

/// The NATS stream holding payment events.
pub const STREAM: &str = "IDEM_PAYMENTS";
/// The NATS stream holding dead letters.
pub const DLQ_STREAM: &str = "IDEM_DLQ";
/// The ledger consumer: its inbox subscriber, durable consumer (NATS),
/// queue (RabbitMQ), consumer group (Kafka).
pub const SUBSCRIBER: &str = "demo-ledger";
/// JetStream's duplicate window: a relay's lease must be shorter.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(300);

/// The demo's routes: stream `IDEM_PAYMENTS` (`payments.>`, created with
/// `replicas` copies), exchange `idem.events` (`payments.#`), Kafka topic
/// `idem.payments`.
pub fn routes(replicas: usize) -> Routes {
    Routes {
        nats_replicas: replicas,
        nats_duplicate_window: DUPLICATE_WINDOW,
        ..Routes::new(STREAM, "payments")
    }
}

/// The ledger consumer's settings.
pub fn ledger(ack_wait: Duration, max_deliver: u32) -> ConsumeConfig {
    ConsumeConfig {
        ack_wait,
        max_deliver,
        ..ConsumeConfig::new(SUBSCRIBER)
    }
}

/// `url` as `flag` names it: an error is one line, without the URL.
pub fn parse_url(url: &str, flag: &str) -> anyhow::Result<BrokerUrl> {
    BrokerUrl::parse(url).map_err(|e| anyhow::anyhow!("{flag}: {e}"))
}
