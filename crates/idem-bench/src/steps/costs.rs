//! What one run costs on PostgreSQL, besides its time: the commits and the
//! statement round trips, counted through a proxy on the wire.

use std::net::SocketAddr;

use super::workload::{baseline, clients, fakes, recorded, runs, sqlx_table};
use crate::measure::Op;

/// What `n` operations cost on PostgreSQL: write transactions (transaction
/// ids consumed, read off the server) and statement round trips (counted on
/// the wire), each divided by `n`.
pub async fn costs(url: &str, run_id: u64, n: u64) -> anyhow::Result<()> {
    let upstream: SocketAddr = {
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        let host = rest.split('@').next_back().unwrap_or(rest);
        host.split('/').next().unwrap_or(host).parse()?
    };
    let (proxy, counts) = wire::proxy(upstream).await?;
    let via = url.replacen(&upstream.to_string(), &proxy.to_string(), 1);
    let store = idem_postgres::PgStore::connect(
        &via,
        idem_postgres::PgConfig {
            max_connections: 4,
            ..Default::default()
        },
    )
    .await?;
    store.migrate().await?;
    sqlx_table(&store).await?;
    let (p, r) = fakes().await?;
    let (provider, mail) = clients(p, r)?;
    let xid = || async {
        let v: i64 = sqlx::query_scalar("SELECT txid_current()")
            .fetch_one(store.pool())
            .await?;
        anyhow::Ok(v)
    };
    println!("| backend | path | commits per run | round trips per run |");
    println!("|---|---|---:|---:|");
    let cases: [(&str, Op); 2] = [
        (
            "unrecorded: insert + 2 calls",
            baseline(store.clone(), provider.clone(), mail.clone(), run_id ^ 1),
        ),
        (
            "recorded run: 3 steps",
            recorded(runs(store.clone(), provider, mail)?, run_id ^ 1),
        ),
    ];
    for (name, op) in cases {
        // Warm: connections open, statements prepared.
        op(u64::MAX - 1).await?;
        let before = xid().await?;
        counts.reset().await;
        for i in 0..n {
            op(i).await?;
        }
        let statements = counts.read().await;
        // Each xid query consumes one id itself.
        let commits = (xid().await? - before - 1) as f64 / n as f64;
        let trips = statements as f64 / n as f64;
        println!("| postgres | {name} | {commits:.2} | {trips:.2} |");
    }
    Ok(())
}

/// Counts statement round trips: each simple `Query`, and each `Sync` that
/// closes a batch with an `Execute` (pings — a lone `Sync` — are left out,
/// as they are in `idem-postgres`'s wire test).
mod wire {
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    #[derive(Default)]
    pub struct Counts(AtomicUsize);

    impl Counts {
        pub async fn reset(&self) {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            self.0.store(0, Ordering::SeqCst);
        }
        pub async fn read(&self) -> usize {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            self.0.load(Ordering::SeqCst)
        }
    }

    pub async fn proxy(upstream: SocketAddr) -> anyhow::Result<(SocketAddr, Arc<Counts>)> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let counts = Arc::new(Counts::default());
        let c = counts.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut sr, &mut cw).await;
                });
                let c = c.clone();
                tokio::spawn(async move {
                    let (mut buf, mut started, mut executed) = (Vec::new(), false, false);
                    let mut chunk = [0u8; 8192];
                    loop {
                        let n = match cr.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if sw.write_all(&chunk[..n]).await.is_err() {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        loop {
                            let head = usize::from(started);
                            let Some(len) = buf
                                .get(head..head + 4)
                                .and_then(|b| <[u8; 4]>::try_from(b).ok())
                                .map(|b| i32::from_be_bytes(b) as usize)
                            else {
                                break;
                            };
                            if buf.len() < head + len {
                                break;
                            }
                            if started {
                                match buf[0] {
                                    b'E' => executed = true,
                                    b'Q' => {
                                        c.0.fetch_add(1, Ordering::SeqCst);
                                    }
                                    b'S' if std::mem::take(&mut executed) => {
                                        c.0.fetch_add(1, Ordering::SeqCst);
                                    }
                                    _ => {}
                                }
                            } else {
                                // Protocol 3.0's startup message; SSL requests
                                // and the like come before it.
                                started = buf.get(4..8) == Some(&196_608i32.to_be_bytes()[..]);
                            }
                            buf.drain(..head + len);
                        }
                    }
                });
            }
        });
        Ok((addr, counts))
    }
}
