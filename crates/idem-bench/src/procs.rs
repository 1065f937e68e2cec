//! The benchmark's child processes (pgbench, wrk, `idem serve`, the peer,
//! perf): killed on every way out — dropped, an error, Ctrl-C or SIGTERM to
//! the bench — and the CPU they used, read from `/proc` (Linux).
//!
//! A child's CPU is read while it is a zombie: it has exited, so its counters
//! are final, and it is not reaped yet, so `/proc/<pid>/stat` still holds them
//! (with the CPU of the children it reaped itself: a program run under
//! `perf stat` is perf's reaped child).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context;

/// Pids of the children alive now, killed if the bench is interrupted.
static LIVE: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// A child process, killed and reaped when dropped.
pub struct Spawned {
    child: Child,
    name: String,
}

impl Spawned {
    /// Starts `cmd`; `name` is what errors call it.
    pub fn spawn(cmd: &mut Command, name: &str) -> anyhow::Result<Self> {
        let child = cmd
            .spawn()
            .with_context(|| format!("failed to start {name} ({:?})", cmd.get_program()))?;
        if let Ok(mut live) = LIVE.lock() {
            live.push(child.id());
        }
        Ok(Self {
            child,
            name: name.to_owned(),
        })
    }

    /// Its pid.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The child, for its pipes.
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Whether it has exited (reaping it if so).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits at most `limit` for the child to exit and returns its status
    /// with the CPU it used, read before it is reaped (`None` where `/proc`
    /// cannot be read). Past `limit` it is killed and this is an error.
    pub fn wait_with_cpu(mut self, limit: Duration) -> anyhow::Result<(ExitStatus, Option<Cpu>)> {
        let pid = self.child.id();
        let deadline = Instant::now() + limit;
        loop {
            match read_stat(pid) {
                Some(stat) if stat.state == 'Z' => {
                    let status = self.child.wait()?;
                    return Ok((status, Some(stat.cpu)));
                }
                Some(_) => {}
                // No /proc: wait the plain way.
                None => return Ok((self.child.wait()?, None)),
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                anyhow::bail!("{} did not exit within {limit:?}; killed", self.name);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let pid = self.child.id();
        if let Ok(mut live) = LIVE.lock() {
            live.retain(|p| *p != pid);
        }
    }
}

/// On Ctrl-C or SIGTERM: kills the live children, removes the scratch
/// directory and exits (130 or 143). Installed once, at the start of a run.
pub fn watch_signals() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tokio::spawn(async {
            use tokio::signal::unix::{SignalKind, signal};
            let Ok(mut term) = signal(SignalKind::terminate()) else {
                return;
            };
            let code = tokio::select! {
                _ = tokio::signal::ctrl_c() => 130,
                _ = term.recv() => 143,
            };
            kill_all();
            remove_scratch();
            std::process::exit(code);
        });
    });
}

fn kill_all() {
    let pids = LIVE.lock().map(|l| l.clone()).unwrap_or_default();
    for pid in pids {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
}

/// A directory for the run's scripts, logs and databases:
/// `$TMPDIR/idem-bench-<pid>`, removed at the end of the run.
pub fn scratch() -> anyhow::Result<&'static Path> {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir =
        DIR.get_or_init(|| std::env::temp_dir().join(format!("idem-bench-{}", std::process::id())));
    std::fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
    Ok(dir)
}

/// Removes the scratch directory.
pub fn remove_scratch() {
    let dir = std::env::temp_dir().join(format!("idem-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(dir);
}

/// CPU time in clock ticks: the process's own (user + system, all threads)
/// and that of the children it reaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cpu {
    pub own: u64,
    pub children: u64,
}

impl Cpu {
    /// Ticks as microseconds.
    pub fn micros(ticks: u64) -> f64 {
        ticks as f64 * 1e6 / clock_ticks() as f64
    }
}

/// What `/proc/<pid>/stat` says of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub state: char,
    pub cpu: Cpu,
}

/// Parses `/proc/<pid>/stat`: the state (field 3) and utime, stime, cutime,
/// cstime (fields 14 to 17). The command name (field 2) is in parentheses
/// and may hold spaces and parentheses itself, hence the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let state = f.first()?.chars().next()?;
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    Some(Stat {
        state,
        cpu: Cpu {
            own: n(11)? + n(12)?,
            children: n(13)? + n(14)?,
        },
    })
}

/// `/proc/<pid>/stat`, parsed.
pub fn read_stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// This process's CPU ticks so far.
pub fn self_ticks() -> Option<u64> {
    read_stat(std::process::id()).map(|s| s.cpu.own)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 where it cannot be asked).
pub fn clock_ticks() -> u64 {
    static TCK: OnceLock<u64> = OnceLock::new();
    *TCK.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .filter(|t| *t > 0)
            .unwrap_or(100)
    })
}

/// The first of `candidates` that exists, else `name` found on `PATH`.
pub fn find_program(name: &str, candidates: &[PathBuf]) -> Option<PathBuf> {
    if let Some(p) = candidates.iter().find(|p| p.is_file()) {
        return Some(p.clone());
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// The last lines of a log file, for an error message.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs a blocking step off the async workers.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(f).await?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_lines_parse() {
        // Captured from a zombie `perf stat -- sh -c <a loop>`: perf used
        // no tick itself, the shell it reaped 29.
        let zombie = "16027 (perf) Z 15986 15984 13449 0 -1 4227340 996 104 14 0 0 0 29 0 20 0 1 0 5693833 0 0 18446744073709551615 0 0 0 0 0 0 134217728 0 8738 1 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n";
        assert_eq!(
            parse_stat(zombie),
            Some(Stat {
                state: 'Z',
                cpu: Cpu {
                    own: 0,
                    children: 29
                }
            })
        );
        // Made up: a name with a space and a parenthesis (a process may
        // name itself so).
        let odd = "77 (tokio (w) 1) S 1 77 77 0 -1 4194560 10 0 0 0 250 40 0 0 20 0 9 0 100 0 0";
        assert_eq!(
            parse_stat(odd),
            Some(Stat {
                state: 'S',
                cpu: Cpu {
                    own: 290,
                    children: 0
                }
            })
        );
        for bad in [
            "",
            "12 (x",
            "12 (x) R 1 2",
            "12 (x) R 1 2 3 4 5 6 7 8 9 a b c d",
        ] {
            assert_eq!(parse_stat(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn this_process_has_a_stat() {
        assert!(self_ticks().is_some());
        assert!(clock_ticks() > 0);
    }
}
