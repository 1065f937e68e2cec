//! Test support for Idem's integration suites: every SQLite test gets its own
//! directory and file, every PostgreSQL test its own database on the server
//! that `cargo xtask test` starts (`IDEM_TEST_POSTGRES_URL`). Both are removed
//! when the handle is dropped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use sqlx::Connection;

static SEQ: AtomicU32 = AtomicU32::new(0);

fn unique(tag: &str) -> String {
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    )
}

/// A fresh directory under the system temp dir, deleted on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `idem-<tag>-<pid>-<n>`.
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("idem-{}", unique(tag)));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `sqlite://<dir>/idem.db` (the file does not exist yet).
    pub fn sqlite_url(&self) -> String {
        format!("sqlite://{}", self.0.join("idem.db").display())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The suite's PostgreSQL server, as an admin URL ending in `/postgres`.
pub fn postgres_admin_url() -> String {
    std::env::var("IDEM_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!("IDEM_TEST_POSTGRES_URL is not set: run the suite with `cargo xtask test`")
    })
}

/// A fresh, empty database on the suite's server, dropped (with its
/// connections) when this is dropped.
#[derive(Debug)]
pub struct PgDatabase {
    /// The database name.
    pub name: String,
    /// `postgres://…/<name>`.
    pub url: String,
}

impl PgDatabase {
    /// Creates `<tag>_<pid>_<n>`.
    pub async fn create(tag: &str) -> Self {
        let admin = postgres_admin_url();
        let name = unique(tag);
        let mut conn = sqlx::PgConnection::connect(&admin).await.unwrap();
        sqlx::raw_sql(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .unwrap();
        let (base, _) = admin
            .rsplit_once('/')
            .expect("IDEM_TEST_POSTGRES_URL must end in /<database>");
        Self {
            url: format!("{base}/{name}"),
            name,
        }
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Best effort, on a thread of its own: drop may run inside a runtime.
        // The throwaway server is deleted at the end of the run anyway.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(mut conn) = sqlx::PgConnection::connect(&postgres_admin_url()).await {
                    let _ = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&mut conn)
                        .await;
                }
            });
        })
        .join();
    }
}

/// The suite's shared NATS server (JetStream on), as a `nats://` URL. Tests on
/// it use their own stream names and subjects ([`unique_name`]).
pub fn nats_url() -> String {
    std::env::var("IDEM_TEST_NATS_URL").unwrap_or_else(|_| {
        panic!("IDEM_TEST_NATS_URL is not set: run the suite with `cargo xtask test`")
    })
}

/// The suite's Kafka-protocol broker (a Tansu that `cargo xtask test`
/// starts), as a `kafka://` URL. Tests on it use topics and consumer groups
/// of their own ([`unique_name`]).
pub fn kafka_url() -> String {
    std::env::var("IDEM_TEST_KAFKA_URL").unwrap_or_else(|_| {
        panic!("IDEM_TEST_KAFKA_URL is not set: run the suite with `cargo xtask test`")
    })
}

/// A Tansu broker (Kafka protocol) of this test's own, storing in an
/// SQLite file, for tests that kill and restart the broker. Killed on drop.
#[derive(Debug)]
pub struct TansuServer(ChildServer);

impl TansuServer {
    /// Starts `tansu` (from `IDEM_TEST_TANSU`) on a free loopback port with
    /// `sqlite://tansu.db` in its own directory.
    pub fn start() -> Self {
        let mut server = Self(ChildServer::new("tansu"));
        server.restart();
        server
    }

    /// `kafka://127.0.0.1:<port>`; the same across restarts.
    pub fn url(&self) -> String {
        format!("kafka://127.0.0.1:{}", self.0.port)
    }

    /// Kills the broker with SIGKILL.
    pub fn kill(&mut self) {
        self.0.kill();
    }

    /// Starts it again on the same port and file (its records survive).
    pub fn restart(&mut self) {
        let binary = std::env::var("IDEM_TEST_TANSU").unwrap_or_else(|_| {
            panic!("IDEM_TEST_TANSU is not set: run the suite with `cargo xtask test`")
        });
        let listener = format!("tcp://127.0.0.1:{}", self.0.port);
        let mut cmd = std::process::Command::new(binary);
        cmd.args(["broker", "--listener-url", &listener])
            .args(["--advertised-listener-url", &listener])
            .args(["--storage-engine", "sqlite://tansu.db"])
            .current_dir(self.0.dir.path());
        self.0.spawn(cmd);
    }
}

/// A server process of a test's own on one loopback port and directory,
/// started again on both (its data survives); SIGKILLed on drop.
#[derive(Debug)]
struct ChildServer {
    child: Option<std::process::Child>,
    dir: TempDir,
    port: u16,
}

impl ChildServer {
    fn new(tag: &str) -> Self {
        Self {
            child: None,
            dir: TempDir::new(tag),
            port: free_port(),
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills what runs, starts `cmd` (its output dropped) and waits until
    /// the port listens (at most 6 s).
    fn spawn(&mut self, mut cmd: std::process::Command) {
        self.kill();
        let what = cmd.get_program().to_string_lossy().into_owned();
        let child = cmd
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("failed to start {what}: {e}"));
        self.child = Some(child);
        for _ in 0..300 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        panic!("{what} did not listen on {} within 6 s", self.port);
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The Python of the venv `cargo xtask test` fills with the real HTTP
/// clients the gateway is tested with (requests, urllib3, stripe).
pub fn python() -> String {
    std::env::var("IDEM_TEST_PYTHON").unwrap_or_else(|_| {
        panic!("IDEM_TEST_PYTHON is not set: run the suite with `cargo xtask test`")
    })
}

/// A name unique to this test process and call, usable as a NATS stream name
/// or subject token: `<TAG>_<pid>_<n>`.
pub fn unique_name(tag: &str) -> String {
    unique(tag)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A NATS server (JetStream on) of this test's own, for tests that stop and
/// restart the broker. Killed on drop.
#[derive(Debug)]
pub struct NatsServer(ChildServer);

impl NatsServer {
    /// Starts `nats-server` (from `IDEM_TEST_NATS_SERVER`, else the PATH) on a
    /// free loopback port with its own store directory.
    pub fn start() -> Self {
        let mut server = Self(ChildServer::new("nats"));
        server.restart();
        server
    }

    /// `nats://127.0.0.1:<port>`; the same across restarts.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.0.port)
    }

    /// Kills the server with SIGKILL (the broker goes down hard).
    pub fn kill(&mut self) {
        self.0.kill();
    }

    /// Starts it again on the same port and store (JetStream state survives).
    pub fn restart(&mut self) {
        let binary =
            std::env::var("IDEM_TEST_NATS_SERVER").unwrap_or_else(|_| "nats-server".into());
        let mut cmd = std::process::Command::new(binary);
        cmd.args([
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            &self.0.port.to_string(),
            "-sd",
        ])
        .arg(self.0.dir.path());
        self.0.spawn(cmd);
    }
}

pub use cluster::NatsCluster;
pub use proxy::Proxy;
pub use rabbit::RabbitNode;

mod cluster;
mod rabbit;

mod proxy {
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::{Mutex, watch};
    use tokio::task::JoinSet;

    /// The end of a PostgreSQL simple-query message that commits: `COMMIT`
    /// alone, as sqlx sends it, or after the statements sent with it (Idem
    /// sends the key record and `COMMIT` in one message).
    const COMMIT: &[u8] = b"COMMIT\0";

    /// What happens once an armed pattern passes.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Fault {
        /// The answer is lost and the connections are cut.
        Cut,
        /// Everything freezes, sockets open, until `thaw`.
        Freeze,
    }

    #[derive(Debug)]
    struct Flags {
        /// New connections are refused.
        down: AtomicBool,
        /// The next client message holding these bytes is delivered, its
        /// answer is not.
        cut_after: std::sync::Mutex<Option<(Vec<u8>, Fault)>>,
        /// Server-to-client bytes are dropped (a commit's answer in flight).
        swallow: AtomicBool,
        /// Nothing moves in either direction, but sockets stay open.
        frozen: watch::Sender<bool>,
    }

    /// A TCP proxy in front of a real server (PostgreSQL, NATS) that can cut
    /// every connection and refuse new ones (the server going away, as a
    /// client sees it), freeze traffic with the sockets open (a silent
    /// network), or let one `COMMIT` through and lose its answer.
    #[derive(Debug)]
    pub struct Proxy {
        /// Where clients connect.
        pub addr: SocketAddr,
        flags: Arc<Flags>,
        links: Arc<Mutex<JoinSet<()>>>,
    }

    impl Proxy {
        /// Listens on a free loopback port and forwards to `upstream`.
        pub async fn start(upstream: SocketAddr) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let flags = Arc::new(Flags {
                down: AtomicBool::new(false),
                cut_after: std::sync::Mutex::new(None),
                swallow: AtomicBool::new(false),
                frozen: watch::Sender::new(false),
            });
            let links = Arc::new(Mutex::new(JoinSet::new()));
            let (f, l) = (flags.clone(), links.clone());
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    if f.down.load(Ordering::SeqCst) {
                        drop(client);
                        continue;
                    }
                    let (f2, l2) = (f.clone(), l.clone());
                    l.lock().await.spawn(async move {
                        if let Ok(server) = TcpStream::connect(upstream).await {
                            link(client, server, f2, l2).await;
                        }
                    });
                }
            });
            Self { addr, flags, links }
        }

        /// The database is gone: open connections are closed, new ones dropped.
        pub async fn cut(&self) {
            self.flags.down.store(true, Ordering::SeqCst);
            self.links.lock().await.abort_all();
        }

        /// The database is back (and traffic flows again).
        pub fn restore(&self) {
            self.flags.down.store(false, Ordering::SeqCst);
            self.flags.frozen.send_replace(false);
        }

        /// Stops forwarding in both directions, keeping every socket open:
        /// the peer neither answers nor hangs up.
        pub fn freeze(&self) {
            self.flags.frozen.send_replace(true);
        }

        /// Forwards again what waited while frozen.
        pub fn thaw(&self) {
            self.flags.frozen.send_replace(false);
        }

        /// Arms a one-shot fault: the next `COMMIT` a client sends reaches the
        /// server, the server's answer never reaches the client, and the
        /// connections are then cut (the server has committed; the client
        /// cannot know). New connections are accepted as before.
        pub fn cut_after_next_commit(&self) {
            self.cut_after_next(COMMIT);
        }

        /// The same for the next client message holding `bytes` (the text of
        /// a statement sent for the first time, say): it reaches the server,
        /// its answer is lost, the connections are cut.
        pub fn cut_after_next(&self, bytes: &[u8]) {
            *self.flags.cut_after.lock().unwrap() = Some((bytes.to_vec(), Fault::Cut));
        }

        /// The next client message holding `bytes` reaches the server, and
        /// then the network goes silent (as [`Proxy::freeze`]) until
        /// [`Proxy::thaw`]: a database that stops answering mid-statement.
        pub fn freeze_after_next(&self, bytes: &[u8]) {
            *self.flags.cut_after.lock().unwrap() = Some((bytes.to_vec(), Fault::Freeze));
        }
    }

    async fn link(
        client: TcpStream,
        server: TcpStream,
        flags: Arc<Flags>,
        links: Arc<Mutex<JoinSet<()>>>,
    ) {
        let (mut client_read, mut client_write) = client.into_split();
        let (mut server_read, mut server_write) = server.into_split();
        let up = {
            let flags = flags.clone();
            async move {
                let mut buf = vec![0u8; 16 * 1024];
                // The tail of the previous read, so a message split across
                // two reads is still recognised.
                let mut tail: Vec<u8> = Vec::new();
                loop {
                    let n = match client_read.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    wait_thawed(&flags).await;
                    let mut window = std::mem::take(&mut tail);
                    let fresh_from = window.len();
                    window.extend_from_slice(&buf[..n]);
                    let armed = {
                        let mut pattern = flags.cut_after.lock().unwrap();
                        // Only a match that ends in the bytes just read:
                        // the tail was forwarded before the fault was armed.
                        let hit = pattern.as_ref().is_some_and(|(p, _)| {
                            window
                                .windows(p.len())
                                .enumerate()
                                .any(|(i, w)| w == p.as_slice() && i + p.len() > fresh_from)
                        });
                        if hit {
                            pattern.take().map(|(_, fault)| fault)
                        } else {
                            None
                        }
                    };
                    if armed == Some(Fault::Freeze) {
                        // Delivered; from now on nothing moves.
                        let _ = server_write.write_all(&buf[..n]).await;
                        flags.frozen.send_replace(true);
                        tail.clear();
                        continue;
                    }
                    if armed == Some(Fault::Cut) {
                        flags.swallow.store(true, Ordering::SeqCst);
                        let _ = server_write.write_all(&buf[..n]).await;
                        // Long enough for the server to commit; then every
                        // connection goes, the answer with it.
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        flags.swallow.store(false, Ordering::SeqCst);
                        links.lock().await.abort_all();
                        return;
                    }
                    if server_write.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                    // Long enough for any statement prefix a test matches on.
                    let keep = window.len().min(255);
                    tail = window[window.len() - keep..].to_vec();
                }
            }
        };
        let down = async move {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = match server_read.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                wait_thawed(&flags).await;
                if flags.swallow.load(Ordering::SeqCst) {
                    continue;
                }
                if client_write.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        };
        tokio::select! { _ = up => {}, _ = down => {} }
    }

    async fn wait_thawed(flags: &Flags) {
        let mut frozen = flags.frozen.subscribe();
        let _ = frozen.wait_for(|f| !*f).await;
    }
}

/// The URL's parts: scheme, `user@` (or nothing), address, path.
fn url_parts(url: &str) -> (&str, &str, SocketAddr, &str) {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let (user, rest) = match rest.find('@') {
        Some(i) => (&rest[..=i], &rest[i + 1..]),
        None => ("", rest),
    };
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    (
        scheme,
        user,
        hostport.parse().expect("an IP address and port"),
        path,
    )
}

/// The address of a `postgres://user@host:port/db` or `nats://host:port` URL.
pub fn url_addr(url: &str) -> SocketAddr {
    url_parts(url).2
}

/// The same URL pointing at `addr` instead (to go through a [`Proxy`]).
pub fn url_via(url: &str, addr: SocketAddr) -> String {
    let (scheme, user, _, path) = url_parts(url);
    format!("{scheme}://{user}{addr}{path}")
}

/// The environment that starts a child process with its wall clock
/// `offset_secs` ahead of this host's (behind, when negative): libfaketime
/// (`IDEM_TEST_LIBFAKETIME`, the path of `libfaketime.so.1`, which `cargo
/// xtask test` provides) preloaded with a fixed offset. Only the wall clock
/// moves: the monotonic clock stays the host's
/// (`FAKETIME_DONT_FAKE_MONOTONIC`), as between two hosts whose clocks
/// disagree — libfaketime would otherwise shift `CLOCK_MONOTONIC` to
/// epoch-sized values.
pub fn clock_offset_env(offset_secs: i64) -> Vec<(&'static str, String)> {
    let lib = std::env::var("IDEM_TEST_LIBFAKETIME").unwrap_or_else(|_| {
        panic!("IDEM_TEST_LIBFAKETIME is not set: run the suite with `cargo xtask test`")
    });
    assert!(
        Path::new(&lib).exists(),
        "IDEM_TEST_LIBFAKETIME={lib}: no such file"
    );
    vec![
        ("LD_PRELOAD", lib),
        ("FAKETIME", format!("{offset_secs:+}")),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
    ]
}

/// The seed of a randomised test: `IDEM_SEED` or the clock. Printed, so a
/// failure can be replayed with the same faults.
pub fn seed() -> u64 {
    let seed = std::env::var("IDEM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        });
    eprintln!("seed: {seed} (IDEM_SEED={seed} replays it)");
    seed
}

/// splitmix64: a small seeded generator for fault injection. Shared between
/// tasks; the sequence is deterministic for one task.
#[derive(Debug)]
pub struct Rng(std::sync::atomic::AtomicU64);

impl Rng {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(std::sync::atomic::AtomicU64::new(seed))
    }

    /// The next number.
    pub fn next(&self) -> u64 {
        const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut z = self
            .0
            .fetch_add(GAMMA, Ordering::SeqCst)
            .wrapping_add(GAMMA);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// True with probability `percent` / 100.
    pub fn chance(&self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    /// A number in `lo..hi`.
    pub fn range(&self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo).max(1)
    }
}
