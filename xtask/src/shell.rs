//! Running commands: the error type, Ctrl-C handling, a child process
//! run to its end (or stopped on an interrupt), the workspace's root.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub(crate) type Result<T> = std::result::Result<T, String>;

pub(crate) fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Set by Ctrl-C or SIGTERM: the command running is asked to stop, and the
/// servers are stopped on the way out.
pub(crate) static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Catches Ctrl-C and SIGTERM so the throwaway servers are stopped (the
/// `Drop`s run) instead of outliving xtask. The terminal's Ctrl-C reaches the
/// child commands too; a SIGTERM to xtask alone is passed on to them.
pub(crate) fn catch_interrupts() {
    if let Err(e) = ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst)) {
        eprintln!("xtask: cannot catch Ctrl-C ({e}); an interrupted run may leave its servers");
    }
}

pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    wait(cmd)
}

/// Runs `cmd` like [`run`], its standard error passed through line by line;
/// also returns the last of those lines that contains `marker` (trimmed), so
/// a caller can quote a summary the command printed.
pub(crate) fn run_quoting(cmd: &mut Command, marker: &str) -> (Result<()>, Option<String>) {
    let marker = marker.to_owned();
    let (tx, rx) = std::sync::mpsc::channel();
    let result = wait_with(cmd.stderr(Stdio::piped()), move |child| {
        let Some(stderr) = child.stderr.take() else {
            return;
        };
        std::thread::spawn(move || {
            let mut last = None;
            for line in BufReader::new(stderr)
                .lines()
                .map_while(std::io::Result::ok)
            {
                eprintln!("{line}");
                if line.contains(&marker) {
                    last = Some(line.trim().to_owned());
                }
            }
            let _ = tx.send(last);
        });
    });
    // The reader ends when the child's standard error closes.
    let quoted = rx.recv_timeout(Duration::from_secs(5)).ok().flatten();
    (result, quoted)
}

fn wait(cmd: &mut Command) -> Result<()> {
    wait_with(cmd, |_| {})
}

fn wait_with(cmd: &mut Command, started: impl FnOnce(&mut Child)) -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        return Err("interrupted".into());
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("failed to start {cmd:?}: {e}"))?;
    started(&mut child);
    let mut forwarded = false;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if INTERRUPTED.load(Ordering::SeqCst) && !forwarded {
            forwarded = true;
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if INTERRUPTED.load(Ordering::SeqCst) {
        Err("interrupted; servers stopped".into())
    } else if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} exited with {status}"))
    }
}

/// `cargo`, or with `niced` `nice -n 19 cargo`: a build that only takes the
/// processor time nothing else wants (the tests running beside it keep
/// theirs: a niceness of 19 weighs 15 against their 1024).
pub(crate) fn cargo(niced: bool) -> Command {
    if niced {
        let mut cmd = Command::new("nice");
        cmd.args(["-n", "19", "cargo"]);
        cmd
    } else {
        Command::new("cargo")
    }
}

/// A build beside the tests: its output to `log`, in a process group of its
/// own, stopped (the whole group: cargo and its rustc) once `stop` is set or
/// on an interrupt. Stopped, the units it finished stay built.
pub(crate) struct Beside<'a> {
    pub(crate) log: &'a std::fs::File,
    pub(crate) stop: &'a AtomicBool,
}

impl Beside<'_> {
    pub(crate) fn run(&self, cmd: &mut Command) -> Result<()> {
        use std::os::unix::process::CommandExt as _;
        let out = |f: &std::fs::File| f.try_clone().map_err(|e| e.to_string());
        cmd.stdout(out(self.log)?)
            .stderr(out(self.log)?)
            .stdin(Stdio::null())
            .process_group(0);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("failed to start {cmd:?}: {e}"))?;
        loop {
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                return if status.success() {
                    Ok(())
                } else {
                    Err(format!("exited with {status}"))
                };
            }
            if self.stop.load(Ordering::SeqCst) || INTERRUPTED.load(Ordering::SeqCst) {
                let _ = Command::new("kill")
                    .args(["-TERM", "--", &format!("-{}", child.id())])
                    .status();
                let _ = child.wait();
                return Err("stopped: the tests ended first".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

pub(crate) fn workspace_root() -> PathBuf {
    // xtask/ sits at the root of the workspace.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}
