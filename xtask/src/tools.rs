//! Finding (and, as root, installing) what the tests and the bench need:
//! Debian packages, PostgreSQL 15, nats-server, Tansu (a Kafka-protocol
//! broker), libfaketime, Chromium, the browser tests' npm
//! packages and Python venvs.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::shell::{Result, is_root, run, workspace_root};

/// Installs a Debian package with apt-get (root only).
pub(crate) fn apt_install(package: &str) -> Result<()> {
    apt_install_with(package, false)
}

/// Installs a Debian package whose service must not start (a packaged
/// `redis-server` would listen on 6379 and keep running): a
/// `policy-rc.d` refusing every start is in place during the install.
pub(crate) fn apt_install_no_start(package: &str) -> Result<()> {
    apt_install_with(package, true)
}

pub(crate) fn apt_install_with(package: &str, no_start: bool) -> Result<()> {
    if !is_root() {
        return Err(format!(
            "{package} is missing: install the Debian package {package} \
             (or run as root to let xtask install it)"
        ));
    }
    eprintln!("xtask: installing {package} with apt-get");
    let policy = Path::new("/usr/sbin/policy-rc.d");
    let made = no_start
        && !policy.exists()
        && std::fs::write(policy, "#!/bin/sh\nexit 101\n").is_ok()
        && Command::new("chmod")
            .args(["+x", "/usr/sbin/policy-rc.d"])
            .status()
            .is_ok_and(|s| s.success());
    let result = run(Command::new("apt-get").args(["update", "-q"])).and_then(|()| {
        run(Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends", package])
            .env("DEBIAN_FRONTEND", "noninteractive"))
    });
    if made {
        let _ = std::fs::remove_file(policy);
    }
    result
}

/// Finds PostgreSQL 15's server binaries, installing `postgresql-15` if root.
pub(crate) fn postgres_bindir() -> Result<PathBuf> {
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
pub(crate) fn nats_binary() -> Result<PathBuf> {
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

/// Finds Debian's RabbitMQ server script (the broker tests start throwaway
/// nodes of it), installing `rabbitmq-server` if root, with no service
/// started.
pub(crate) fn rabbitmq_server() -> Result<PathBuf> {
    let path = PathBuf::from("/usr/lib/rabbitmq/bin/rabbitmq-server");
    if !path.exists() {
        apt_install_no_start("rabbitmq-server")?;
    }
    if path.exists() {
        Ok(path)
    } else {
        Err("rabbitmq-server installed but /usr/lib/rabbitmq/bin/rabbitmq-server is missing".into())
    }
}

/// The Tansu release the Kafka tests run (crates.io `tansu`).
pub(crate) const TANSU_VERSION: &str = "0.6.0";

/// Where Tansu is installed and reused: `$IDEM_TANSU_ROOT`, else
/// `$HOME/.cache/idem-tansu` (outside `target/`: a `cargo clean` does not
/// cost the ten-minute build).
fn tansu_root() -> PathBuf {
    if let Some(root) = std::env::var_os("IDEM_TANSU_ROOT") {
        return PathBuf::from(root);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache/idem-tansu")
}

/// Finds the `tansu` broker in its cache, installing it there with `cargo
/// install` when missing (about 10 minutes on two cores). `--locked`:
/// 0.6.0 does not build with today's newest dependencies. Features: the
/// default ones have no storage engine; `dynostore` brings `memory://`,
/// `libsql` SQLite-file storage.
pub(crate) fn tansu_binary() -> Result<PathBuf> {
    let root = tansu_root();
    let binary = root.join("bin/tansu");
    if binary.exists() {
        return Ok(binary);
    }
    eprintln!(
        "xtask: installing tansu {TANSU_VERSION} into {} with cargo install (about 10 minutes)",
        root.display()
    );
    run(Command::new("cargo")
        .args(["install", "tansu", "--version", TANSU_VERSION, "--locked"])
        .args(["--features", "dynostore,libsql", "--root"])
        .arg(&root)
        // Its own build directory, not this workspace's target.
        .env_remove("CARGO_TARGET_DIR"))?;
    if binary.exists() {
        Ok(binary)
    } else {
        Err(format!(
            "tansu installed but {} is missing",
            binary.display()
        ))
    }
}

/// Finds libfaketime's preload library (the clock tests start a process
/// whose wall clock is off), installing the Debian package `libfaketime` if
/// root.
pub(crate) fn libfaketime() -> Result<PathBuf> {
    let find = || {
        let multiarch = std::fs::read_dir("/usr/lib")
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path().join("faketime/libfaketime.so.1"));
        [
            PathBuf::from("/usr/lib/faketime/libfaketime.so.1"),
            PathBuf::from("/usr/local/lib/faketime/libfaketime.so.1"),
        ]
        .into_iter()
        .chain(multiarch)
        .find(|p| p.exists())
    };
    if let Some(p) = find() {
        return Ok(p);
    }
    apt_install("libfaketime")?;
    find().ok_or_else(|| "libfaketime installed but libfaketime.so.1 is missing".into())
}

/// Finds Debian's `chromium` for the browser tests, installing it if root.
pub(crate) fn chromium_binary() -> Result<PathBuf> {
    let path = PathBuf::from("/usr/bin/chromium");
    if !path.exists() {
        apt_install("chromium")?;
    }
    if path.exists() {
        Ok(path)
    } else {
        Err("chromium installed but /usr/bin/chromium is missing".into())
    }
}

/// The browser tests' npm packages (`crates/idem-server/tests/browser`):
/// `npm ci` when `node_modules` is missing or older than `package-lock.json`.
pub(crate) fn browser_packages() -> Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/idem-server/tests/browser");
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let lock = modified(&dir.join("package-lock.json"));
    let installed = modified(&dir.join("node_modules/.package-lock.json"));
    let fresh = matches!((lock, installed), (Some(l), Some(i)) if i >= l);
    if fresh {
        return Ok(());
    }
    let has_npm = Command::new("npm")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_npm {
        return Err(
            "node and npm are needed for the browser tests: install Node.js 18 or newer \
             (Debian: apt-get install nodejs npm)"
                .into(),
        );
    }
    eprintln!("xtask: npm ci in {}", dir.display());
    run(Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(&dir))
}

/// `target/<name>/venv`, made with `python3 -m venv` and filled with
/// pip once; reused while its package list is the same. Its python.
pub(crate) fn venv(name: &str, packages: &[&str], purpose: &str) -> Result<PathBuf> {
    let venv = workspace_root().join(format!("target/{name}/venv"));
    let python = venv.join("bin/python");
    let stamp = venv.join("idem-packages.txt");
    let wanted = packages.join("\n");
    if python.exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        return Ok(python);
    }
    let quiet = |cmd: &mut Command| {
        cmd.stdout(Stdio::null())
            .status()
            .map_err(|e| e.to_string())
            .and_then(|s| {
                if s.success() {
                    Ok(())
                } else {
                    Err(format!("exited with {s}"))
                }
            })
    };
    eprintln!(
        "xtask: making a Python venv for {purpose} in {}",
        venv.display()
    );
    let make = || {
        let _ = std::fs::remove_dir_all(&venv);
        quiet(Command::new("python3").args(["-m", "venv"]).arg(&venv))
    };
    // Debian ships venv apart from python3: installed when missing, as root.
    make()
        .or_else(|e| {
            if is_root() && apt_install("python3-venv").is_ok() {
                make()
            } else {
                Err(e)
            }
        })
        .map_err(|e| {
            format!(
                "python3 -m venv failed ({e}): Python 3.9 or newer with venv is needed \
                 (Debian: python3-venv)"
            )
        })?;
    quiet(
        Command::new(venv.join("bin/pip"))
            .args(["install", "-q", "--disable-pip-version-check"])
            .args(packages),
    )
    .map_err(|e| {
        format!(
            "pip install {} failed ({e}); is PyPI reachable?",
            packages.join(" ")
        )
    })?;
    std::fs::write(&stamp, wanted).map_err(|e| e.to_string())?;
    Ok(python)
}
