//! Developer commands: `cargo xtask test` provisions a throwaway PostgreSQL 15
//! and a NATS server with JetStream on loopback (installing the Debian packages
//! `postgresql-15` and `nats-server` when root and they are missing), runs the
//! whole test suite against them, and stops them.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  test [nextest args]      provision PostgreSQL 15 and NATS on loopback, run the whole suite, stop them
  bench [idem bench args]  the same servers, then `idem bench` in release mode
  help                     this text";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("test") => test(&args[1..]),
        Some("bench") => bench(&args[1..]),
        Some("help" | "--help" | "-h") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some(other) => Err(format!("unknown command {other:?}\n\n{USAGE}")),
        None => Err(USAGE.into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

type Result<T> = std::result::Result<T, String>;

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .map_err(|e| format!("failed to start {cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} exited with {status}"))
    }
}

/// Installs a Debian package with apt-get (root only).
fn apt_install(package: &str) -> Result<()> {
    if !is_root() {
        return Err(format!(
            "{package} is missing: install the Debian package {package} \
             (or run as root to let xtask install it)"
        ));
    }
    eprintln!("xtask: installing {package} with apt-get");
    run(Command::new("apt-get").args(["update", "-q"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends", package])
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

/// Finds PostgreSQL 15's server binaries, installing `postgresql-15` if root.
fn postgres_bindir() -> Result<PathBuf> {
    let candidate = PathBuf::from("/usr/lib/postgresql/15/bin");
    if !candidate.join("initdb").exists() {
        apt_install("postgresql-15")?;
    }
    if candidate.join("initdb").exists() {
        Ok(candidate)
    } else {
        Err("postgresql-15 installed but initdb is missing".into())
    }
}

/// Finds `nats-server`, installing the Debian package if root.
fn nats_binary() -> Result<PathBuf> {
    let find = || {
        [
            "/usr/sbin/nats-server",
            "/usr/bin/nats-server",
            "/usr/local/bin/nats-server",
        ]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
    };
    if let Some(p) = find() {
        return Ok(p);
    }
    apt_install("nats-server")?;
    find().ok_or_else(|| "nats-server installed but its binary is missing".into())
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// A throwaway PostgreSQL server; stopped when dropped.
struct Postgres {
    bindir: PathBuf,
    dir: PathBuf,
    as_postgres_user: bool,
    port: u16,
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

    fn start(root: &Path) -> Result<Self> {
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

    fn url(&self) -> String {
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

/// A throwaway NATS server with JetStream; killed when dropped.
struct Nats {
    child: std::process::Child,
    dir: PathBuf,
    port: u16,
}

impl Nats {
    fn start(root: &Path, binary: &Path) -> Result<Self> {
        let dir = root.join(format!("nats-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("failed to create {dir:?}: {e}"))?;
        let port = free_port()?;
        let child = Command::new(binary)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("failed to start {binary:?}: {e}"))?;
        let nats = Self { child, dir, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err("nats-server did not start listening in 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(nats)
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn test(extra: &[String]) -> Result<()> {
    let root = std::env::temp_dir().join("idem-xtask");
    let pg = Postgres::start(&root)?;
    eprintln!("xtask: PostgreSQL 15 on 127.0.0.1:{}", pg.port);
    let nats_bin = nats_binary()?;
    let nats = Nats::start(&root, &nats_bin)?;
    eprintln!("xtask: nats-server with JetStream on {}", nats.url());
    let have_nextest = Command::new("cargo")
        .args(["nextest", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    let mut cmd = Command::new("cargo");
    if have_nextest {
        cmd.args(["nextest", "run", "--workspace", "--no-fail-fast"]);
    } else {
        cmd.args(["test", "--workspace", "--no-fail-fast"]);
    }
    cmd.args(extra)
        .env("IDEM_TEST_POSTGRES_URL", pg.url())
        .env("IDEM_TEST_NATS_URL", nats.url())
        .env("IDEM_TEST_NATS_SERVER", &nats_bin);
    let result = run(&mut cmd);
    // Doc tests are not run by nextest.
    let docs = if have_nextest {
        run(Command::new("cargo").args(["test", "--workspace", "--doc"]))
    } else {
        Ok(())
    };
    drop(nats);
    drop(pg);
    result.and(docs)
}

/// Runs `idem bench` (release build) on SQLite, a throwaway PostgreSQL and a
/// throwaway NATS server.
fn bench(extra: &[String]) -> Result<()> {
    let root = std::env::temp_dir().join("idem-xtask");
    let pg = Postgres::start(&root)?;
    let nats = Nats::start(&root, &nats_binary()?)?;
    let sqlite = root.join(format!("bench-{}.db", std::process::id()));
    let result = run(Command::new("cargo")
        .args([
            "run",
            "--release",
            "--quiet",
            "-p",
            "idem-server",
            "--",
            "bench",
        ])
        .arg("--sqlite-url")
        .arg(format!("sqlite://{}", sqlite.display()))
        .arg("--postgres-url")
        .arg(pg.url())
        .arg("--nats-url")
        .arg(nats.url())
        .args(extra));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", sqlite.display()));
    }
    drop(nats);
    drop(pg);
    result
}
