//! A throwaway RabbitMQ node of a test's own (Debian's `rabbitmq-server`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{TempDir, free_port};

/// A RabbitMQ node on free loopback ports, its data and logs in a temporary
/// directory, run as the `rabbitmq` user when the tests run as root. Its
/// port-mapper daemon (`epmd`) is its own, on its own loopback port, and
/// stopped with it. `kill` is `kill -9` of the whole node; `restart` starts
/// it again on the same data (durable queues and persistent messages
/// survive). Stopped on drop.
#[derive(Debug)]
pub struct RabbitNode {
    child: Option<Child>,
    epmd: Option<Child>,
    dir: TempDir,
    name: String,
    port: u16,
    dist_port: u16,
    epmd_port: u16,
}

/// The server script: `IDEM_TEST_RABBITMQ_SERVER`, else Debian's.
fn server_script() -> PathBuf {
    std::env::var_os("IDEM_TEST_RABBITMQ_SERVER").map_or_else(
        || PathBuf::from("/usr/lib/rabbitmq/bin/rabbitmq-server"),
        PathBuf::from,
    )
}

/// The uid and gid of the `rabbitmq` user, when running as root.
fn rabbitmq_user() -> Option<(u32, u32)> {
    let me = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&me.stdout).trim() != "0" {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.first() == Some(&"rabbitmq"))
            .then(|| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))?
    })
}

impl RabbitNode {
    /// Starts a node and waits until it speaks AMQP (about 6 s).
    pub fn start() -> Self {
        let dir = TempDir::new("rabbit");
        std::fs::write(dir.path().join("enabled_plugins"), "[].\n").unwrap();
        // guest may log in over loopback; the listener comes from the environment.
        std::fs::write(dir.path().join("rabbitmq.conf"), "loopback_users = none\n").unwrap();
        let mut node = Self {
            name: format!("idem{}", crate::unique("r").to_lowercase().replace('_', "")),
            child: None,
            epmd: None,
            dir,
            port: free_port(),
            dist_port: free_port(),
            epmd_port: free_port(),
        };
        if let Some((uid, gid)) = rabbitmq_user() {
            let _ = Command::new("chown")
                .arg("-R")
                .arg(format!("{uid}:{gid}"))
                .arg(node.dir.path())
                .status();
        }
        node.start_epmd();
        node.restart();
        node
    }

    /// The node's port mapper, in the foreground and in a process group of
    /// its own, so that a killed node leaves it running (as a host's does)
    /// and dropping the node stops it.
    fn start_epmd(&mut self) {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new("epmd");
        cmd.args([
            "-port",
            &self.epmd_port.to_string(),
            "-address",
            "127.0.0.1",
        ])
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        if let Some((uid, gid)) = rabbitmq_user() {
            cmd.uid(uid).gid(gid);
        }
        let epmd = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("failed to start epmd: {e}"));
        watch_over(epmd.id());
        self.epmd = Some(epmd);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.epmd_port)).is_err() {
            assert!(Instant::now() < deadline, "epmd did not listen within 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `amqp://guest:guest@127.0.0.1:<port>/%2f`; the same across restarts.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// The AMQP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    fn env(&self, cmd: &mut Command) {
        let d = self.dir.path();
        let path = |p: &str| d.join(p);
        cmd.env("RABBITMQ_NODENAME", format!("{}@localhost", self.name))
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            // Erlang's distribution listener binds every interface unless told.
            .env(
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                "-kernel inet_dist_use_interface {127,0,0,1}",
            )
            .env("RABBITMQ_MNESIA_BASE", path("mnesia"))
            .env("RABBITMQ_LOG_BASE", path("log"))
            .env("RABBITMQ_CONFIG_FILE", path("rabbitmq"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", path("enabled_plugins"))
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .env("ERL_EPMD_PORT", self.epmd_port.to_string())
            .env("HOME", d);
        if let Some((uid, gid)) = rabbitmq_user() {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(gid);
        }
    }

    /// Kills the node with SIGKILL, all its processes (its `epmd` stays, as
    /// a real host's does).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-9", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same ports and data, and waits until it
    /// speaks AMQP.
    pub fn restart(&mut self) {
        use std::os::unix::process::CommandExt;
        self.kill();
        let mut cmd = Command::new(server_script());
        self.env(&mut cmd);
        let log = std::fs::File::create(self.dir.path().join("console.log")).unwrap();
        let child = cmd
            .current_dir(self.dir.path())
            .process_group(0)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("failed to start {:?}: {e}", server_script()));
        watch_over(child.id());
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !speaks_amqp(self.port) {
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(self.dir.path().join("console.log"))
                    .unwrap_or_default();
                panic!(
                    "RabbitMQ did not answer on {} within 60 s:\n{log}",
                    self.port
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // A test's servers listen on loopback only.
        for port in [self.port, self.dist_port, self.epmd_port] {
            let wide = listening_beyond_loopback(port);
            assert!(
                wide.is_empty(),
                "RabbitMQ listens on {wide:?} (port {port})"
            );
        }
    }

    /// The node's directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// The local addresses other than loopback with a listening TCP socket on
/// `port` (from `/proc/net/tcp` and `tcp6`).
fn listening_beyond_loopback(port: u16) -> Vec<String> {
    let mut wide = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state)) = (fields.get(1), fields.get(3)) else {
                continue;
            };
            let Some((addr, p)) = local.rsplit_once(':') else {
                continue;
            };
            let loopback = addr == "0100007F" || addr == "00000000000000000000000001000000";
            if *state == "0A" && u16::from_str_radix(p, 16) == Ok(port) && !loopback {
                wide.push(format!("{table} {local}"));
            }
        }
    }
    wide
}

/// Whether a server on `port` answers AMQP 0-9-1's protocol header.
fn speaks_amqp(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"AMQP\x00\x00\x09\x01").is_err() {
        return false;
    }
    let mut frame = [0u8; 1];
    s.read(&mut frame).is_ok_and(|n| n == 1)
}

/// A watchdog that kills the process group `pgid` once this test process
/// is gone: a test killed by its timeout (no destructor runs) leaves no
/// node behind.
fn watch_over(pgid: u32) {
    use std::os::unix::process::CommandExt;
    let script = format!(
        "while kill -0 {me} 2>/dev/null; do sleep 1; done; kill -9 -- -{pgid} 2>/dev/null",
        me = std::process::id()
    );
    let _ = Command::new("sh")
        .args(["-c", &script])
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

impl Drop for RabbitNode {
    fn drop(&mut self) {
        self.kill();
        if let Some(mut epmd) = self.epmd.take() {
            let _ = epmd.kill();
            let _ = epmd.wait();
        }
    }
}
