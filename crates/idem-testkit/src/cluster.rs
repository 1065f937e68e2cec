//! A NATS JetStream cluster of this test's own: `nats-server` processes on
//! free loopback ports, each routed to the others, each with its own store,
//! killed with SIGKILL and restarted one by one.

use std::process::{Child, Command, Stdio};

use crate::{TempDir, free_port, unique};

/// One node: its name (`-n`, what stream info calls it), client and route
/// ports, and its process while it runs.
#[derive(Debug)]
struct Node {
    name: String,
    port: u16,
    route: u16,
    child: Option<Child>,
}

/// A JetStream cluster (`nats-server -js --cluster …`), every node killed on
/// drop.
#[derive(Debug)]
pub struct NatsCluster {
    cluster: String,
    nodes: Vec<Node>,
    dir: TempDir,
}

impl NatsCluster {
    /// Starts `size` nodes named `n1`, `n2`, … (from `IDEM_TEST_NATS_SERVER`,
    /// else the PATH) and waits until each listens. JetStream elects its
    /// leaders afterwards: the first stream request may wait a few seconds.
    pub fn start(size: usize) -> Self {
        let nodes = (1..=size)
            .map(|i| Node {
                name: format!("n{i}"),
                port: free_port(),
                route: free_port(),
                child: None,
            })
            .collect();
        let mut cluster = Self {
            cluster: unique("q"),
            nodes,
            dir: TempDir::new("nats-cluster"),
        };
        for name in cluster.names() {
            cluster.restart(&name);
        }
        cluster
    }

    /// The nodes' names.
    pub fn names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.name.clone()).collect()
    }

    /// Every node's `nats://127.0.0.1:PORT`, comma-separated (as
    /// `--nats-url` takes them); the same across restarts.
    pub fn urls(&self) -> String {
        let urls: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.port))
            .collect();
        urls.join(",")
    }

    /// The node `name`'s own `nats://127.0.0.1:PORT` (a client that must
    /// stay on that node).
    pub fn url(&self, name: &str) -> String {
        let node = self.nodes.iter().find(|n| n.name == name);
        let node = node.unwrap_or_else(|| panic!("no node {name} in the cluster"));
        format!("nats://127.0.0.1:{}", node.port)
    }

    fn node(&mut self, name: &str) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name} in the cluster"))
    }

    /// Kills the node `name` with SIGKILL (no goodbye to its peers); a
    /// paused one too.
    pub fn kill(&mut self, name: &str) {
        if let Some(mut child) = self.node(name).child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the node `name` with SIGSTOP: its process and sockets stay,
    /// it answers nothing (a node paused by its host, swapping, or frozen
    /// by a debugger) until [`NatsCluster::resume`].
    /// Returns once every thread of the process is stopped (`T` in
    /// `/proc/PID/task/*/stat`): a signal is queued before each thread
    /// takes it, and a thread still running could answer one more request.
    pub fn pause(&mut self, name: &str) {
        let pid = self.signal(name, "-STOP");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !all_threads_stopped(pid) {
            assert!(
                std::time::Instant::now() < deadline,
                "node {name} (pid {pid}) not stopped 10 s after SIGSTOP"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Lets a node paused by [`NatsCluster::pause`] run again (SIGCONT).
    pub fn resume(&mut self, name: &str) {
        self.signal(name, "-CONT");
    }

    fn signal(&mut self, name: &str, signal: &str) -> u32 {
        let node = self.node(name);
        let pid = node
            .child
            .as_ref()
            .unwrap_or_else(|| panic!("node {name} is not running"))
            .id();
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap_or_else(|e| panic!("kill {signal} {pid}: {e}"));
        assert!(status.success(), "kill {signal} {pid}: {status}");
        pid
    }

    /// Starts the node `name` again on its ports and store (its JetStream
    /// state survives) and waits until it listens.
    pub fn restart(&mut self, name: &str) {
        self.kill(name);
        let routes: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| n.name != name)
            .map(|n| format!("nats://127.0.0.1:{}", n.route))
            .collect();
        let store = self.dir.path().join(name);
        let cluster = self.cluster.clone();
        let binary =
            std::env::var("IDEM_TEST_NATS_SERVER").unwrap_or_else(|_| "nats-server".into());
        let node = self.node(name);
        let child = Command::new(&binary)
            .args(["-js", "-a", "127.0.0.1", "-p", &node.port.to_string()])
            .args(["-n", &node.name, "--cluster_name", &cluster])
            .args(["--cluster", &format!("nats://127.0.0.1:{}", node.route)])
            .args(["--routes", &routes.join(",")])
            .arg("-sd")
            .arg(&store)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("failed to start {binary}: {e}"));
        node.child = Some(child);
        let port = node.port;
        for _ in 0..300 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        panic!("nats-server {name} did not listen on {port} within 6 s");
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for name in self.names() {
            self.kill(&name);
        }
    }
}

/// Whether every thread of `pid` is stopped: the state after the command's
/// name in each `/proc/PID/task/TID/stat` is `T` (`t` when traced).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
            // "TID (comm) S ...": the comm may hold spaces and parentheses.
            stat.rfind(')')
                .and_then(|end| stat[end + 1..].split_whitespace().next())
                .is_some_and(|state| state == "T" || state == "t")
        })
    })
}
