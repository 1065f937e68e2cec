//! A TCP proxy in front of the real PostgreSQL server that can cut every
//! connection and refuse new ones: the database going away, as a client sees it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio::task::JoinSet;

pub struct Proxy {
    pub addr: SocketAddr,
    down: Arc<AtomicBool>,
    links: Arc<Mutex<JoinSet<()>>>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let down = Arc::new(AtomicBool::new(false));
        let links = Arc::new(Mutex::new(JoinSet::new()));
        let (d, l) = (down.clone(), links.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if d.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                l.lock().await.spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Self { addr, down, links }
    }

    /// The database is gone: open connections are closed, new ones dropped.
    pub async fn cut(&self) {
        self.down.store(true, Ordering::SeqCst);
        self.links.lock().await.abort_all();
    }

    /// The database is back.
    pub fn restore(&self) {
        self.down.store(false, Ordering::SeqCst);
    }
}
