//! The demo's messaging on RabbitMQ: the events exchange, the ledger's
//! quorum queue and its dead letters, a link opened (and opened again)
//! until it holds.

use idem_rabbitmq::{Link, QueueSpec, RabbitSource, SourceConfig, Topology};
use tokio::sync::watch;

use super::{SUBSCRIBER, until_ready, without_credentials};

/// The topic exchange payment events are published to.
pub const EXCHANGE: &str = idem_rabbitmq::DEFAULT_EXCHANGE;
/// The routing keys of the ledger's queue.
pub const BINDINGS: &[&str] = &["payments.#"];

/// The relay's topology: the exchange alone. The ledger's queue is the
/// consumer's to declare (with its delivery limit); until it exists, a
/// payment event routes nowhere and waits in the outbox.
pub fn relay_topology() -> Topology {
    Topology::exchange(EXCHANGE)
}

/// The consumer's topology: the exchange, the quorum queue `demo-ledger`
/// bound to `payments.#` with `max_deliver` as its delivery limit, and its
/// dead-letter queue `demo-ledger.dead`.
pub fn ledger_topology(max_deliver: u32) -> Topology {
    Topology::exchange(EXCHANGE).with_queue(QueueSpec::new(SUBSCRIBER, BINDINGS, max_deliver))
}

/// Opens a link to `url` and declares `topology`, retrying until it holds
/// or `shutdown` (`Ok(None)`).
pub async fn connect(
    url: &str,
    name: &str,
    topology: Topology,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<Option<Link>> {
    let shown = without_credentials(url);
    let link = Link::new(url, name, topology)
        .map_err(|e| anyhow::anyhow!("invalid RabbitMQ settings ({shown}): {e}"))?;
    let opened = until_ready("RabbitMQ", &shown, shutdown, || link.channel()).await;
    Ok(opened.map(|_| link))
}

/// The ledger's source on its own link (its own connection).
pub async fn source(
    url: &str,
    max_deliver: u32,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<Option<RabbitSource>> {
    let topology = ledger_topology(max_deliver);
    let Some(link) = connect(url, "idem-consume", topology, shutdown).await? else {
        return Ok(None);
    };
    Ok(Some(RabbitSource::new(link, SourceConfig::new(SUBSCRIBER))))
}
