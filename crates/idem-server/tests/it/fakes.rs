//! The other systems of the checkout drills, in the test process: a mail
//! relay with exactly the relay contract that records every accepted POST,
//! and an HTTP proxy in front of the real provider (another `idem serve`)
//! that records every request with its `Idempotency-Key` and can lose,
//! hold, garble or refuse answers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;

type Answer = Result<Response<Full<Bytes>>, std::io::Error>;

/// A lost answer: the connection closes without a response.
fn lost() -> Answer {
    Err(std::io::Error::other("answer lost on purpose"))
}

fn respond(status: u16, body: Value) -> Answer {
    let mut res = Response::new(Full::new(Bytes::from(body.to_string())));
    *res.status_mut() = StatusCode::from_u16(status).unwrap();
    res.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    Ok(res)
}

/// Serves `handle` on a free loopback port, one task per connection.
async fn serve<F, Fut>(handle: F) -> SocketAddr
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Answer> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let handle = handle.clone();
            tokio::spawn(async move {
                let service = service_fn(handle);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// The mail relay: `POST /messages` → 202, every POST kept (no dedupe);
/// `GET /messages/{id}` → 200 / 404.
#[derive(Clone, Default)]
pub struct Relay {
    state: Arc<Mutex<RelayState>>,
    pub addr: Option<SocketAddr>,
}

#[derive(Default)]
struct RelayState {
    accepted: Vec<String>,
    /// The next POSTs: accepted, answer lost.
    lose: u32,
    /// Each POST: accepted, answer lost with this chance (percent).
    lose_percent: u64,
    seed: u64,
}

impl Relay {
    pub async fn start() -> Self {
        let mut relay = Relay::default();
        let state = relay.state.clone();
        let addr = serve(move |req: Request<Incoming>| {
            let state = state.clone();
            async move {
                let path = req.uri().path().to_owned();
                match (req.method().as_str(), path.as_str()) {
                    ("POST", "/messages") => {
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let Ok(v) = serde_json::from_slice::<Value>(&body) else {
                            return respond(400, json!({"error": "not JSON"}));
                        };
                        let Some(id) = v["id"].as_str().filter(|s| !s.is_empty()) else {
                            return respond(400, json!({"error": "no id"}));
                        };
                        let mut s = state.lock().unwrap();
                        s.accepted.push(id.to_owned());
                        s.seed = s
                            .seed
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let chance = (s.seed >> 33) % 100 < s.lose_percent;
                        if s.lose > 0 || chance {
                            s.lose = s.lose.saturating_sub(1);
                            return lost();
                        }
                        respond(202, json!({"id": id}))
                    }
                    ("GET", p) if p.starts_with("/messages/") => {
                        let id = &p["/messages/".len()..];
                        let has = state.lock().unwrap().accepted.iter().any(|a| a == id);
                        if has {
                            respond(200, json!({"id": id}))
                        } else {
                            respond(404, json!({}))
                        }
                    }
                    _ => respond(404, json!({})),
                }
            }
        })
        .await;
        relay.addr = Some(addr);
        relay
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr.unwrap())
    }

    /// Every accepted POST's message id, duplicates kept.
    pub fn accepted(&self) -> Vec<String> {
        self.state.lock().unwrap().accepted.clone()
    }

    /// The next `n` POSTs are accepted and their answers lost.
    pub fn lose_next(&self, n: u32) {
        self.state.lock().unwrap().lose = n;
    }

    /// Each POST's answer is lost with this chance.
    pub fn lose_percent(&self, percent: u64, seed: u64) {
        let mut s = self.state.lock().unwrap();
        s.lose_percent = percent;
        s.seed = seed;
    }
}

/// One request the provider was sent, as the proxy saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub key: Option<String>,
    /// A charge's `reference` (the shop's order id).
    pub reference: Option<String>,
    /// The provider's status, or `None` when it never answered through us.
    pub status: Option<u16>,
    pub replayed: bool,
    /// Whether the answer was withheld from the shop (lost or garbled).
    pub withheld: bool,
    /// Swallowed by the black hole: the provider never saw it.
    pub swallowed: bool,
}

/// What the proxy does to answers.
#[derive(Default)]
struct Faults {
    /// Charges' answers are lost until then (the charge reaches the provider).
    lose_charges_until: Option<Instant>,
    /// Charges are refused with 503 (not forwarded) until then.
    refuse_charges_until: Option<Instant>,
    /// The next charge answers: replaced by a body that is not JSON.
    garble: u32,
    /// The next charge answers: held this long before they are sent.
    delay_next: Option<(u32, Duration)>,
    /// Each answer (charge or refund) is lost with this chance (percent).
    lose_percent: u64,
    seed: u64,
    /// Latency added to every request.
    latency: Duration,
    /// Until then every request (any method) is read and dropped: never
    /// forwarded, never answered (a black hole, not a delay: nothing it
    /// swallowed reaches the provider later).
    black_hole_until: Option<Instant>,
}

/// An HTTP proxy in front of the provider that records what it forwards.
#[derive(Clone)]
pub struct ProviderProxy {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    faults: Arc<Mutex<Faults>>,
    /// While false, answers wait (requests are forwarded at once).
    gate: Arc<watch::Sender<bool>>,
    in_flight: Arc<Mutex<(HashMap<String, u32>, u32)>>,
}

impl ProviderProxy {
    pub async fn start(provider: SocketAddr) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let faults = Arc::new(Mutex::new(Faults::default()));
        let gate = Arc::new(watch::Sender::new(true));
        let in_flight = Arc::new(Mutex::new((HashMap::new(), 0)));
        let client: Client<HttpConnector, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let (s, f, g, fl) = (
            seen.clone(),
            faults.clone(),
            gate.clone(),
            in_flight.clone(),
        );
        let addr = serve(move |req: Request<Incoming>| {
            let (seen, faults, gate, in_flight, client) =
                (s.clone(), f.clone(), g.clone(), fl.clone(), client.clone());
            async move {
                let (parts, body) = req.into_parts();
                let body = body.collect().await.unwrap().to_bytes();
                let key = parts
                    .headers
                    .get("idempotency-key")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                let path = parts.uri.path().to_owned();
                let charge = parts.method == "POST" && path == "/v1/payments";
                let reference = serde_json::from_slice::<Value>(&body)
                    .ok()
                    .and_then(|v| v["reference"].as_str().map(str::to_owned));
                let index = {
                    let mut seen = seen.lock().unwrap();
                    seen.push(Seen {
                        method: parts.method.to_string(),
                        path: path.clone(),
                        key: key.clone(),
                        reference,
                        status: None,
                        replayed: false,
                        withheld: false,
                        swallowed: false,
                    });
                    seen.len() - 1
                };
                let (latency, refuse, hole) = {
                    let f = faults.lock().unwrap();
                    (
                        f.latency,
                        charge && f.refuse_charges_until.is_some_and(|t| Instant::now() < t),
                        f.black_hole_until.filter(|t| Instant::now() < *t),
                    )
                };
                if let Some(until) = hole {
                    // Read, never forwarded; the connection stays silent
                    // until the hole closes, then it is dropped unanswered.
                    seen.lock().unwrap()[index].swallowed = true;
                    tokio::time::sleep_until(until.into()).await;
                    return lost();
                }
                if refuse {
                    return respond(503, json!({"error": "provider unavailable"}));
                }
                let counted = key.clone().filter(|_| charge);
                if let Some(k) = &counted {
                    let mut m = in_flight.lock().unwrap();
                    let n = m.0.entry(k.clone()).or_default();
                    *n += 1;
                    let n = *n;
                    m.1 = m.1.max(n);
                }
                tokio::time::sleep(latency).await;
                let mut out = Request::builder()
                    .method(parts.method.clone())
                    .uri(format!("http://{provider}{}", parts.uri));
                for name in ["content-type", "idempotency-key", "x-tenant-id"] {
                    if let Some(v) = parts.headers.get(name) {
                        out = out.header(name, v);
                    }
                }
                let answer = client.request(out.body(Full::new(body)).unwrap()).await;
                if let Some(k) = &counted {
                    *in_flight.lock().unwrap().0.entry(k.clone()).or_default() -= 1;
                }
                let Ok(res) = answer else {
                    return respond(502, json!({"error": "provider unreachable"}));
                };
                let status = res.status();
                let replayed = res.headers().contains_key("idempotent-replayed");
                let mut headers = res.headers().clone();
                let bytes = res.into_body().collect().await.unwrap().to_bytes();
                {
                    let mut seen = seen.lock().unwrap();
                    seen[index].status = Some(status.as_u16());
                    seen[index].replayed = replayed;
                }
                let mut rx = gate.subscribe();
                let _ = rx.wait_for(|open| *open).await;
                let (withhold, garble, delay) = {
                    let mut f = faults.lock().unwrap();
                    f.seed = f
                        .seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let chance = (f.seed >> 33) % 100 < f.lose_percent;
                    let lose = chance
                        || (charge && f.lose_charges_until.is_some_and(|t| Instant::now() < t));
                    let garble = charge && !lose && f.garble > 0;
                    if garble {
                        f.garble -= 1;
                    }
                    let delay = match f.delay_next {
                        Some((n, d)) if charge && n > 0 => {
                            f.delay_next = (n > 1).then_some((n - 1, d));
                            Some(d)
                        }
                        _ => None,
                    };
                    (lose, garble, delay)
                };
                if withhold || garble {
                    seen.lock().unwrap()[index].withheld = true;
                }
                if let Some(d) = delay {
                    tokio::time::sleep(d).await;
                }
                if withhold {
                    return lost();
                }
                if garble {
                    return Ok(Response::new(Full::new(Bytes::from_static(b"<html>oops"))));
                }
                let mut back = Response::new(Full::new(bytes));
                *back.status_mut() = status;
                headers.remove("content-length");
                headers.remove("transfer-encoding");
                *back.headers_mut() = headers;
                Ok(back)
            }
        })
        .await;
        Self {
            addr,
            seen,
            faults,
            gate,
            in_flight,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The charges the provider received, in order.
    pub fn charges(&self) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.method == "POST" && s.path == "/v1/payments")
            .collect()
    }

    /// The refunds the provider received, in order.
    pub fn refunds(&self) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.method == "POST" && s.path.ends_with("/refunds"))
            .collect()
    }

    pub fn lose_charges_for(&self, d: Duration) {
        self.faults.lock().unwrap().lose_charges_until = Some(Instant::now() + d);
    }

    pub fn refuse_charges_for(&self, d: Duration) {
        self.faults.lock().unwrap().refuse_charges_until = Some(Instant::now() + d);
    }

    pub fn garble_next(&self, n: u32) {
        self.faults.lock().unwrap().garble = n;
    }

    pub fn delay_next(&self, n: u32, d: Duration) {
        self.faults.lock().unwrap().delay_next = Some((n, d));
    }

    pub fn lose_percent(&self, percent: u64, seed: u64) {
        let mut f = self.faults.lock().unwrap();
        f.lose_percent = percent;
        f.seed = seed;
    }

    /// For `d`, every request is swallowed: read, never forwarded, never
    /// answered.
    pub fn black_hole_for(&self, d: Duration) {
        self.faults.lock().unwrap().black_hole_until = Some(Instant::now() + d);
    }

    /// The lookups of payments the provider was sent (`GET /v1/payments?…`).
    pub fn lookups(&self) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.method == "GET" && s.path == "/v1/payments")
            .collect()
    }

    pub fn latency(&self, d: Duration) {
        self.faults.lock().unwrap().latency = d;
    }

    /// Answers wait until [`ProviderProxy::open`].
    pub fn hold(&self) {
        self.gate.send_replace(false);
    }

    pub fn open(&self) {
        self.gate.send_replace(true);
    }

    /// The most charges with one key ever in flight at the provider at once.
    pub fn max_in_flight_per_key(&self) -> u32 {
        self.in_flight.lock().unwrap().1
    }

    /// Forgets what was seen (after a phase of the test).
    pub fn reset_counts(&self) {
        self.seen.lock().unwrap().clear();
        *self.in_flight.lock().unwrap() = (HashMap::new(), 0);
    }
}
