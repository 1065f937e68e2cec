//! NATS JetStream: the events stream and its dead-letter stream, the
//! connection and its watch, a consumer's durable consumer.

use std::time::Duration;

use idem_nats::{Context, NatsSource, SourceConfig};
use tokio::sync::watch;

use crate::{ConsumeConfig, Routes, stopped, without_credentials};

/// Connects (retrying in the background while the server is down) and makes
/// sure both streams exist — created with the routes' replicas when they do
/// not — retrying until they do or `shutdown`, which ends the wait at
/// once (`Ok(None)`), whatever the broker is doing. A setting the broker
/// can never satisfy (more than one replica from a server that is not in a
/// cluster) is an error, not a wait.
pub(crate) async fn prepare(
    url: &str,
    name: &str,
    routes: &Routes,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<Option<Context>> {
    let replicas = routes.nats_replicas;
    let shown = without_credentials(url);
    let connect = idem_nats::connect(url, name, true);
    let js = tokio::select! {
        _ = stopped(shutdown.clone()) => return Ok(None),
        js = connect => match js {
            Ok(js) => js,
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!("invalid NATS settings ({shown})")));
            }
        },
    };
    // The client connects in the background; until it has, a stream request
    // would only wait for its own timeout. Say what is wrong meanwhile.
    let mut waited = 0u32;
    while !idem_nats::is_connected(&js) {
        // After a second (a healthy server is connected by then), then
        // every five.
        if waited % 25 == 5 {
            let reach = probe(url).await;
            tracing::warn!(url = %shown, reach, "NATS not reachable; retrying");
        }
        waited += 1;
        tokio::select! {
            _ = stopped(shutdown.clone()) => return Ok(None),
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
    if waited > 0 {
        tracing::info!(url = %shown, "connected to NATS");
    }
    let mut delay = Duration::from_millis(200);
    let mut attempts = 0u32;
    let settings = idem_nats::StreamSettings {
        replicas,
        ..idem_nats::StreamSettings::new(routes.nats_duplicate_window)
    };
    let (stream, dlq_stream) = (routes.nats_stream.as_str(), routes.nats_dlq_stream.as_str());
    let subjects: Vec<&str> = routes.nats_subjects.iter().map(String::as_str).collect();
    let dlq_subjects: Vec<&str> = routes
        .nats_dlq_subjects
        .iter()
        .map(String::as_str)
        .collect();
    loop {
        let ready = async {
            let events = idem_nats::ensure_stream_with(&js, stream, &subjects, &settings).await?;
            let dlq =
                idem_nats::ensure_stream_with(&js, dlq_stream, &dlq_subjects, &settings).await?;
            Ok::<_, idem_nats::NatsError>([(stream, events), (dlq_stream, dlq)])
        };
        let result = tokio::select! {
            _ = stopped(shutdown.clone()) => return Ok(None),
            r = ready => r,
        };
        match result {
            Ok(streams) => {
                for (stream, ready) in streams {
                    if ready.created {
                        tracing::info!(stream, replicas = ready.replicas, "stream created");
                    } else if ready.replicas != replicas {
                        tracing::warn!(
                            stream,
                            replicas = ready.replicas,
                            asked = replicas,
                            "the stream exists with another replica count than --nats-replicas; \
                             it keeps its own (change it with the nats CLI: nats stream edit)"
                        );
                    }
                }
                if attempts > 0 {
                    tracing::info!(url = %shown, "NATS reachable; streams ready");
                }
                tokio::spawn(watch_connection(url.to_owned(), js.clone(), shutdown));
                return Ok(Some(js));
            }
            Err(e)
                if e.0
                    .downcast_ref::<idem_nats::ReplicasUnsupported>()
                    .is_some() =>
            {
                return Err(anyhow::Error::new(e).context("--nats-replicas"));
            }
            Err(e) => {
                attempts += 1;
                // The client reconnects in the background and only reports
                // timeouts; say what is wrong with the address itself.
                let reach = probe(url).await;
                tracing::warn!(
                    url = %shown,
                    reach,
                    attempts,
                    error = &e as &dyn std::error::Error,
                    "NATS streams not ready; retrying"
                );
            }
        }
        tokio::select! {
            _ = stopped(shutdown.clone()) => return Ok(None),
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// Says when the connection to NATS is lost (with what the address answers)
/// and when it is back, until `shutdown`. The client reconnects by itself;
/// meanwhile events wait in the outbox and deliveries in the stream.
async fn watch_connection(url: String, js: Context, shutdown: watch::Receiver<bool>) {
    let shown = without_credentials(&url);
    let mut connected = true;
    let mut down_for = 0u32;
    loop {
        tokio::select! {
            _ = stopped(shutdown.clone()) => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        match (connected, idem_nats::is_connected(&js)) {
            (true, false) => {
                connected = false;
                down_for = 0;
                let reach = probe(&url).await;
                tracing::warn!(url = %shown, reach, "lost the connection to NATS; reconnecting");
            }
            (false, false) => {
                down_for += 1;
                if down_for.is_multiple_of(30) {
                    let reach = probe(&url).await;
                    tracing::warn!(
                        url = %shown,
                        reach,
                        seconds = down_for,
                        "still not connected to NATS"
                    );
                }
            }
            (false, true) => {
                connected = true;
                tracing::info!(url = %shown, "connected to NATS again");
            }
            (true, true) => {}
        }
    }
}

/// Whether the first server of a NATS URL accepts TCP connections, as a
/// sentence for the log (`connection refused`, `reachable`, …).
async fn probe(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let first = rest.split(',').next().unwrap_or(rest);
    let host_port = first.rsplit_once('@').map_or(first, |(_, h)| h);
    let host_port = host_port.split('/').next().unwrap_or(host_port);
    let target = if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:4222")
    };
    match tokio::time::timeout(
        Duration::from_secs(1),
        tokio::net::TcpStream::connect(&target),
    )
    .await
    {
        Ok(Ok(_)) => format!("{target} accepts connections (is JetStream enabled, -js?)"),
        Ok(Err(e)) => format!("cannot connect to {target}: {e}"),
        Err(_) => format!("no answer from {target} within 1s"),
    }
}

/// The consumer's durable consumer on the events stream, bound (retrying
/// while NATS is not ready) until `shutdown` (`None`).
pub(crate) async fn source(
    js: Context,
    routes: &Routes,
    config: &ConsumeConfig,
    shutdown: watch::Receiver<bool>,
) -> Option<NatsSource> {
    let source_config = SourceConfig {
        stream: routes.nats_stream.clone(),
        durable: config.name.clone(),
        filter_subject: String::new(),
        ack_wait: config.ack_wait,
        dead_letter_subject: config.dead_letters(),
    };
    loop {
        let bound = tokio::select! {
            _ = stopped(shutdown.clone()) => return None,
            s = NatsSource::new(js.clone(), source_config.clone()) => s,
        };
        match bound {
            Ok(s) => return Some(s),
            Err(e) => tracing::warn!(
                error = &e as &dyn std::error::Error,
                "consumer not ready; retrying"
            ),
        }
        tokio::select! {
            _ = stopped(shutdown.clone()) => return None,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// What JetStream says about the events stream within `within`, and how
/// long that holds: a cluster that lost two of three nodes keeps the
/// connection up, and the node left may still answer as the stream's
/// stalled leader (its answer says which copies it has heard from lately)
/// or not answer at all.
pub(crate) async fn readiness(
    js: &Context,
    stream: &str,
    within: Duration,
) -> (&'static str, Duration) {
    let quorum = idem_nats::stream_quorum(js, stream);
    match tokio::time::timeout(within, quorum).await {
        Ok(Ok(q)) if q.held => ("ok", q.holds_for),
        Ok(Ok(_)) => ("no quorum", within),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "readiness: JetStream refused");
            ("unavailable", within)
        }
        Err(_) => ("no answer", within),
    }
}
