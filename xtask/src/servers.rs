//! Throwaway servers on free loopback ports (PostgreSQL 15, NATS with
//! JetStream, Tansu for Kafka, Redis), stopped when dropped, and the sweep of those an
//! interrupted run left behind.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::shell::{Result, is_root, run};
use crate::tools::postgres_bindir;

/// Removes what runs killed without a chance to clean up left in `root`: a
/// `pg-<pid>`, `nats-<pid>`, `tansu-<pid>` or `redis-<pid>` directory whose xtask is gone,
/// stopping its server first.
pub(crate) fn sweep(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("pg-")
            .or_else(|| name.strip_prefix("nats-"))
            .or_else(|| name.strip_prefix("tansu-"))
            .or_else(|| name.strip_prefix("redis-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let dir = entry.path();
        if name.starts_with("pg-") && dir.join("data/postmaster.pid").exists() {
            eprintln!("xtask: stopping a PostgreSQL left by an interrupted run ({name})");
            if let Ok(bindir) = postgres_bindir() {
                let pg = Postgres {
                    bindir,
                    dir: dir.clone(),
                    as_postgres_user: is_root(),
                    port: 0,
                };
                drop(pg);
            }
        }
        for (file, server) in [
            ("nats.pid", "nats-server"),
            ("tansu.pid", "tansu"),
            ("redis.pid", "redis-server"),
        ] {
            if let Ok(pid) = std::fs::read_to_string(dir.join(file)) {
                let pid = pid.trim();
                if Path::new(&format!("/proc/{pid}")).exists() {
                    eprintln!("xtask: stopping a {server} left by an interrupted run ({name})");
                    let _ = Command::new("kill").args(["-KILL", pid]).status();
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

pub(crate) fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// A throwaway PostgreSQL server; stopped when dropped.
pub(crate) struct Postgres {
    pub(crate) bindir: PathBuf,
    pub(crate) dir: PathBuf,
    pub(crate) as_postgres_user: bool,
    pub(crate) port: u16,
}

impl Postgres {
    fn cmd(&self, program: &str) -> Command {
        let path = self.bindir.join(program);
        if self.as_postgres_user {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    pub(crate) fn start(root: &Path) -> Result<Self> {
        let bindir = postgres_bindir()?;
        let as_postgres_user = is_root();
        let dir = root.join(format!("pg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("failed to create {dir:?}: {e}"))?;
        if as_postgres_user {
            // Postgres refuses to run as root: hand the directory to `postgres`.
            run(Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir))?;
        }
        let pg = Self {
            bindir,
            dir: dir.clone(),
            as_postgres_user,
            port: free_port()?,
        };
        let data = dir.join("data");
        run(pg
            .cmd("initdb")
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "-D"])
            .arg(&data)
            .stdout(Stdio::null()))?;
        let opts = format!(
            "-c listen_addresses=127.0.0.1 -p {} -k {} -c max_connections=300 \
             -c fsync=on -c synchronous_commit=on",
            pg.port,
            dir.display()
        );
        run(pg
            .cmd("pg_ctl")
            .args(["-w", "-t", "60", "-D"])
            .arg(&data)
            .args(["-l"])
            .arg(dir.join("log"))
            .args(["-o", &opts, "start"])
            .stdout(Stdio::null()))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", pg.port)).is_err() {
            if Instant::now() > deadline {
                return Err("PostgreSQL did not start listening in 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(pg)
    }

    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = self
            .cmd("pg_ctl")
            .args(["-w", "-m", "fast", "-D"])
            .arg(self.dir.join("data"))
            .arg("stop")
            .stdout(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A throwaway server on a free loopback port: its files in
/// `root/<name>-<pid>`, its pid in `<name>.pid` there (for [`sweep`]);
/// killed when dropped.
pub(crate) struct Server {
    pub(crate) child: std::process::Child,
    pub(crate) dir: PathBuf,
    pub(crate) port: u16,
    pub(crate) name: &'static str,
}

impl Server {
    /// Starts `binary` with the arguments `args(port, dir)` gives, and waits
    /// until it listens.
    pub(crate) fn start(
        root: &Path,
        name: &'static str,
        binary: &Path,
        args: impl FnOnce(u16, &Path) -> Vec<std::ffi::OsString>,
    ) -> Result<Self> {
        let dir = root.join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("failed to create {dir:?}: {e}"))?;
        let port = free_port()?;
        let child = Command::new(binary)
            .args(args(port, &dir))
            // Relative paths a server takes are in its directory.
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("failed to start {binary:?}: {e}"))?;
        let _ = std::fs::write(dir.join(format!("{name}.pid")), child.id().to_string());
        let server = Self {
            child,
            dir,
            port,
            name,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err(format!("{binary:?} did not start listening in 30 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(server)
    }

    /// `<name>://127.0.0.1:<port>`.
    pub(crate) fn url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.name, self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A throwaway NATS server with JetStream.
pub(crate) fn start_nats(root: &Path, binary: &Path) -> Result<Server> {
    Server::start(root, "nats", binary, |port, dir| {
        let mut args: Vec<std::ffi::OsString> =
            ["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"]
                .iter()
                .map(Into::into)
                .collect();
        args.push(dir.into());
        args
    })
}

/// A throwaway Tansu broker (Kafka protocol) storing in an SQLite file in
/// its directory (`sqlite://tansu.db`, relative to it); its `kafka://` URL
/// is `kafka://127.0.0.1:<port>`. Not `memory://`: there a batch of several
/// records takes one offset of the high watermark, and a consumer cannot
/// seek into it (docs/development.md, "Kafka test broker: Tansu").
pub(crate) fn start_tansu(root: &Path, binary: &Path) -> Result<Server> {
    Server::start(root, "tansu", binary, |port, _dir| {
        let url = format!("tcp://127.0.0.1:{port}");
        [
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &url,
            "--storage-engine",
            "sqlite://tansu.db",
        ]
        .iter()
        .map(Into::into)
        .collect()
    })
}

/// A throwaway Redis for the bench's peer: loopback, no persistence.
pub(crate) fn start_redis(root: &Path, binary: &Path) -> Result<Server> {
    Server::start(root, "redis", binary, |port, dir| {
        let port = port.to_string();
        let mut args: Vec<std::ffi::OsString> = [
            "--bind",
            "127.0.0.1",
            "--port",
            &port,
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "yes",
            "--dir",
        ]
        .iter()
        .map(Into::into)
        .collect();
        args.push(dir.into());
        args
    })
}
