//! Sends per operation: the system calls a process sent data with, counted
//! by the kernel's syscall tracepoints through `perf stat`. A PostgreSQL
//! round trip costs the client one send, so sends per operation stand in
//! for round trips per operation.
//!
//! The calls are counted apart: `sendto` (with `sendmsg`, `sendmmsg`) is
//! what libpq (pgbench, psycopg), sqlx and Python's sockets send with;
//! `writev` is what hyper writes HTTP requests and responses with; `write`
//! is what wrk writes its sockets with — and also what a tokio runtime
//! wakes its threads with (an eventfd), pgbench writes its log with and
//! Python prints with. A process's sends are its `sendto`s and `writev`s
//! ([`Counts::sockets`]); wrk's are its `write`s.
//!
//! Why not `syscw` of `/proc/<pid>/io`: it counts `write` and `writev` only,
//! so it never sees a `sendto`: it reads zero for every client here but wrk.
//!
//! perf needs the tracepoints (`/sys/kernel/tracing`) and the right to use
//! them (root, or `perf_event_paranoid` ≤ -1 / CAP_PERFMON). Without them,
//! or with `IDEM_BENCH_SENDS=0`, the column says `—` and the run says why.
//! While a tracepoint is counted every system call of the counted process
//! takes the kernel's slower tracing path (measured here: about 0.2 µs per
//! call); `IDEM_BENCH_SENDS=0` gives a run without it.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;

use super::procs::{self, Spawned};

/// The events counted.
pub const EVENTS: &[&str] = &[
    "syscalls:sys_enter_write",
    "syscalls:sys_enter_writev",
    "syscalls:sys_enter_sendto",
    "syscalls:sys_enter_sendmsg",
    "syscalls:sys_enter_sendmmsg",
];

/// perf, if sends can be counted here; else why not.
pub fn perf() -> Result<&'static Path, &'static str> {
    static PERF: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PERF.get_or_init(probe)
        .as_ref()
        .map(PathBuf::as_path)
        .map_err(String::as_str)
}

fn probe() -> Result<PathBuf, String> {
    if std::env::var("IDEM_BENCH_SENDS").is_ok_and(|v| v == "0") {
        return Err("IDEM_BENCH_SENDS=0".into());
    }
    let perf = procs::find_program("perf", &[])
        .ok_or("no perf on PATH (Debian: apt-get install linux-perf)")?;
    // The same path as a measurement: attach to this process, count, stop.
    let mut counter =
        Counter::attach_with(&perf, std::process::id()).map_err(|e| format!("{e:#}"))?;
    counter.enable().map_err(|e| format!("{e:#}"))?;
    counter.finish().map_err(|e| format!("{e:#}"))?;
    Ok(perf)
}

/// What a process sent with, by call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// `sendto`, `sendmsg`, `sendmmsg`.
    pub send: u64,
    /// `writev`.
    pub writev: u64,
    /// `write`.
    pub write: u64,
}

impl Counts {
    /// The sends of a process whose sockets are written by libpq, sqlx,
    /// hyper or Python: `sendto`s and `writev`s.
    pub fn sockets(&self) -> u64 {
        self.send + self.writev
    }
}

/// Sums the counts of [`EVENTS`] in the CSV `perf stat -x,` wrote, by
/// family (`<not counted>` is zero: the process made no call while counted).
pub fn parse(text: &str) -> anyhow::Result<Counts> {
    let mut counts = Counts::default();
    let mut seen = 0;
    for line in text.lines() {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < 3 || !EVENTS.contains(&f[2]) {
            continue;
        }
        seen += 1;
        let n = match f[0] {
            "<not counted>" => 0,
            n => n
                .parse::<u64>()
                .with_context(|| format!("perf counted {line:?}"))?,
        };
        match f[2] {
            "syscalls:sys_enter_write" => counts.write += n,
            "syscalls:sys_enter_writev" => counts.writev += n,
            _ => counts.send += n,
        }
    }
    anyhow::ensure!(
        seen == EVENTS.len(),
        "perf reported {seen} of {} events: {text:?}",
        EVENTS.len()
    );
    Ok(counts)
}

fn next_out() -> anyhow::Result<PathBuf> {
    static N: AtomicU64 = AtomicU64::new(0);
    Ok(procs::scratch()?.join(format!("perf-{}", N.fetch_add(1, Ordering::Relaxed))))
}

/// `perf stat` attached to a running process, counting only between
/// [`Counter::enable`] and [`Counter::finish`] (commands over its control
/// pipe, each acknowledged before the call returns).
pub struct Counter {
    perf: Spawned,
    control: ChildStdin,
    acks: BufReader<ChildStdout>,
    out: PathBuf,
    err: PathBuf,
}

impl Counter {
    /// Attaches to `pid` with its events disabled; returns once perf is
    /// ready. `None` (and no error) where sends are not counted.
    pub fn attach(pid: u32) -> anyhow::Result<Option<Counter>> {
        match perf() {
            Ok(perf) => Self::attach_with(perf, pid).map(Some),
            Err(_) => Ok(None),
        }
    }

    fn attach_with(perf: &Path, pid: u32) -> anyhow::Result<Counter> {
        let out = next_out()?;
        let err = out.with_extension("err");
        let mut cmd = Command::new(perf);
        cmd.args(["stat", "-x,", "--control=fd:0,1", "-D", "-1", "-e"])
            .arg(EVENTS.join(","))
            .arg("-o")
            .arg(&out)
            .args(["-p", &pid.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&err)?);
        let mut perf = Spawned::spawn(&mut cmd, "perf stat")?;
        let control = perf.child_mut().stdin.take().context("perf's stdin")?;
        let acks = BufReader::new(perf.child_mut().stdout.take().context("perf's stdout")?);
        let mut counter = Counter {
            perf,
            control,
            acks,
            out,
            err,
        };
        // Acknowledged once the events are set up (disabled already).
        counter.command("disable")?;
        Ok(counter)
    }

    fn command(&mut self, what: &str) -> anyhow::Result<()> {
        let sent = writeln!(self.control, "{what}").and_then(|()| self.control.flush());
        let mut ack = String::new();
        let read = sent.and_then(|()| self.acks.read_line(&mut ack));
        if matches!(read, Ok(n) if n > 0)
            && ack.trim_matches(|c: char| c == '\0' || c.is_whitespace()) == "ack"
        {
            return Ok(());
        }
        anyhow::bail!(
            "perf stat did not acknowledge {what:?} (got {ack:?}): {}",
            procs::tail(&self.err, 5)
        )
    }

    /// Starts counting.
    pub fn enable(&mut self) -> anyhow::Result<()> {
        self.command("enable")
    }

    /// Stops counting and returns what was counted.
    pub fn finish(mut self) -> anyhow::Result<Counts> {
        self.command("disable")?;
        self.stop()
    }

    /// Ends perf (SIGINT: it then writes its counts) and reads them.
    fn stop(self) -> anyhow::Result<Counts> {
        let _ = Command::new("kill")
            .args(["-INT", &self.perf.id().to_string()])
            .status();
        let Counter { perf, out, err, .. } = self;
        let (status, _) = perf.wait_with_cpu(Duration::from_secs(10))?;
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        parse(&text)
            .with_context(|| format!("perf stat exited with {status}: {}", procs::tail(&err, 5)))
    }
}

/// `perf stat` running `program` as its child and counting its sends into
/// a file; read it with [`wrapped_count`]. `None` where sends are not
/// counted: run `program` directly then.
pub fn wrap(program: &Path) -> anyhow::Result<Option<(Command, PathBuf)>> {
    let Ok(perf) = perf() else {
        return Ok(None);
    };
    let out = next_out()?;
    let mut cmd = Command::new(perf);
    cmd.args(["stat", "-x,", "-e"])
        .arg(EVENTS.join(","))
        .arg("-o")
        .arg(&out)
        .arg("--")
        .arg(program);
    Ok(Some((cmd, out)))
}

/// What a [`wrap`]ped program sent with.
pub fn wrapped_count(out: &Path) -> anyhow::Result<Counts> {
    parse(
        &std::fs::read_to_string(out)
            .with_context(|| format!("perf wrote no {}", out.display()))?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_csv_sums_the_send_events() {
        // Captured: `perf stat -x, --control=fd:0,1 -D -1 -e … -p PID` on
        // a Python process that sent 300 bytes one `send` at a time while
        // counted (its `print`s are the writes).
        let text = "# started on Fri Dec  4 09:08:05 2026\n\n\
            3,,syscalls:sys_enter_write,530796,100.00,,\n\
            0,,syscalls:sys_enter_writev,530796,100.00,,\n\
            300,,syscalls:sys_enter_sendto,530796,100.00,,\n\
            0,,syscalls:sys_enter_sendmsg,530796,100.00,,\n\
            0,,syscalls:sys_enter_sendmmsg,530796,100.00,,\n";
        assert_eq!(
            parse(text).unwrap(),
            Counts {
                send: 300,
                writev: 0,
                write: 3
            }
        );
        // What perf writes for a process that never ran while counted.
        let idle = text
            .replace("300,", "<not counted>,")
            .replace("3,,", "<not counted>,,");
        assert_eq!(parse(&idle).unwrap(), Counts::default());
        // An event missing (perf could not count it) is an error, not zero.
        let short = "5,,syscalls:sys_enter_write,1,100.00,,\n";
        assert!(parse(short).is_err());
        let unsupported = text.replace("300,", "<not supported>,");
        assert!(parse(&unsupported).is_err());
    }
}
