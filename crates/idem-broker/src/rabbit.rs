//! RabbitMQ: the events exchange, a consumer's quorum queue and its dead
//! letters, a link opened (and opened again) until it holds.

use std::sync::Arc;

use idem_rabbitmq::{Link, QueueSpec, RabbitSource, SourceConfig, Topology};
use tokio::sync::watch;

use crate::{ConsumeConfig, Routes, until_ready, without_credentials};

/// What a link declares: the exchange and, for a consumer, its quorum queue
/// bound to the routes' bindings, with its delivery limit and its
/// dead-letter queue `<name>.dead`. Without a consumer the queue is not
/// declared: until a consumer has declared it, an event routes nowhere and
/// waits in the outbox.
pub(crate) fn topology(routes: &Routes, consumer: Option<&ConsumeConfig>) -> Topology {
    let topology = Topology::exchange(&routes.rabbit_exchange);
    match consumer {
        None => topology,
        Some(c) => {
            let bindings: Vec<&str> = routes.rabbit_bindings.iter().map(String::as_str).collect();
            topology.with_queue(QueueSpec::new(&c.name, &bindings, c.max_deliver))
        }
    }
}

/// Opens a link to `url` and declares `topology`, retrying until it holds
/// or `shutdown` (`Ok(None)`).
pub(crate) async fn connect(
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

/// The consumer's source on the link that declared its queue; an error
/// when the link was connected for another consumer or none.
pub(crate) fn source(link: &Arc<Link>, config: &ConsumeConfig) -> anyhow::Result<RabbitSource> {
    let declared = link.topology().queue.as_ref().map(|q| q.name.as_str());
    if declared != Some(config.name.as_str()) {
        anyhow::bail!(
            "RabbitMQ: the link declares no queue {:?}; connect with this consumer's settings \
             (Broker::connect(…, Some(consumer), …)) before consuming",
            config.name
        );
    }
    Ok(RabbitSource::new(
        link.clone(),
        SourceConfig::new(&config.name),
    ))
}
