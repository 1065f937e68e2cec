//! pgbench against the same database, in the same run: the SQL-level limit
//! of the library's statements. Each script runs with `-M prepared -n`,
//! `-c C -j min(C, 2) -T secs`, a per-transaction log (`-l`) for p50 and
//! p99, and its CPU and sends read as for every external client.
//!
//! The statements are Idem's own, copied from `crates/idem-postgres/src/lib.rs`
//! (`INSERT_CLAIM`, `UPDATE_COMPLETE`, `SELECT_RECORD`) and from the
//! library bench's baseline (`bench/keys.rs`); a `NULL` the library binds
//! is written as a literal here (pgbench cannot bind one). Keys and ids are
//! numbers made unique per client and case: `base + client_id·10⁸ + n`,
//! with `n` counted per client.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;

use super::measure::{after_case, before_case};
use super::procs::{self, Spawned};
use super::report::{self, PGBENCH};

mod output;
mod scripts;

use output::{parse_log, parse_summary, percentiles};
use scripts::scripts;

/// pgbench: `IDEM_BENCH_PGBENCH`, else the newest
/// `/usr/lib/postgresql/*/bin/pgbench` (Debian's `/usr/bin/pgbench` is a
/// Perl wrapper whose start would be counted as pgbench's CPU), else `PATH`.
fn binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("IDEM_BENCH_PGBENCH") {
        return Some(PathBuf::from(p));
    }
    let mut versioned: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let p = e.path().join("bin/pgbench");
            p.is_file().then_some((v, p))
        })
        .collect();
    versioned.sort();
    let candidates: Vec<PathBuf> = versioned.into_iter().rev().map(|(_, p)| p).collect();
    procs::find_program("pgbench", &candidates)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The cases on PostgreSQL at `url`, printed into the key-engine table.
pub async fn run(url: &str, duration: Duration, run_id: u64) -> anyhow::Result<()> {
    let Some(pgbench) = binary() else {
        report::note(
            "pgbench: skipped because no pgbench was found (Debian: postgresql-client-15; or set IDEM_BENCH_PGBENCH)".into(),
        );
        return Ok(());
    };
    // The demo's tables too (the route's insert), as `idem serve` makes them.
    {
        let store =
            idem_postgres::PgStore::connect(url, idem_postgres::PgConfig::default()).await?;
        store.migrate().await?;
        idem_demo::DemoSql::migrate_demo(&store).await?;
    }
    let now = idem_core::Clock::now_ms(&idem_core::SystemClock);
    let fingerprint = idem_core::FingerprintSpec::default().fingerprint(&idem_core::RequestParts {
        method: "POST",
        operation: &idem_core::Operation::new("bench.create")?,
        target: "/bench",
        json: true,
        body: br#"{"amount":100}"#,
    });
    let response = idem_core::StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: br#"{"id":"1000000000000000000","amount":100}"#.to_vec(),
    };
    let select_key = format!("pgbench-select-{run_id}");
    {
        // The record the SELECT reads.
        let pool = sqlx::PgPool::connect(url).await?;
        sqlx::query(
            "INSERT INTO idem_keys (tenant_id, operation, idempotency_key, request_hash, state,
                 status_code, response_headers, response_body, created_at_ms, updated_at_ms,
                 expires_at_ms)
             VALUES ('pgbench', 'bench.create', $1, $2, 'completed', 201, $3, $4, $5, $5, $6)
             ON CONFLICT DO NOTHING",
        )
        .bind(&select_key)
        .bind(&fingerprint.as_bytes()[..])
        .bind(response.headers_json())
        .bind(&response.body[..])
        .bind(now)
        .bind(now + 86_400_000)
        .execute(&pool)
        .await?;
        pool.close().await;
    }
    let dir = procs::scratch()?.join("pgbench");
    std::fs::create_dir_all(&dir)?;
    let scripts = scripts();
    for (_, file, text) in &scripts {
        std::fs::write(dir.join(file), text)?;
    }
    let vars: Vec<(&str, String)> = vec![
        ("tenant", "pgbench".into()),
        ("operation", "bench.create".into()),
        ("hash", format!("\\x{}", hex(fingerprint.as_bytes()))),
        ("now", now.to_string()),
        ("expires", (now + 86_400_000).to_string()),
        ("state", "completed".into()),
        ("status", "201".into()),
        ("headers", response.headers_json()),
        ("body", format!("\\x{}", hex(&response.body))),
        ("amount", "100".into()),
        ("currency", "EUR".into()),
        ("customer", "cus_bench".into()),
        ("key", select_key),
        ("n", "0".into()),
    ];
    // Ids of this run: its second in a 104-day cycle, then the case.
    let run_base = (run_id / 1000 % 9_000_000) as i64 * 1_000_000_000_000;
    let mut case = 0_i64;
    for c in [1, 8, 32] {
        for (path, file, _) in &scripts {
            case += 1;
            let base = run_base + case * 10_000_000_000;
            let mut args: Vec<String> = vec![
                "-n".into(),
                "-M".into(),
                "prepared".into(),
                "-f".into(),
                dir.join(file).display().to_string(),
                "-c".into(),
                c.to_string(),
                "-j".into(),
                c.min(2).to_string(),
                "-T".into(),
                duration.as_secs().max(1).to_string(),
                "-l".into(),
                format!("--log-prefix={}", dir.join(format!("log{case}")).display()),
                "-D".into(),
                format!("base={base}"),
            ];
            for (k, v) in &vars {
                args.push("-D".into());
                args.push(format!("{k}={v}"));
            }
            args.push(url.to_owned());
            before_case(c).await;
            let (pgbench, dir) = (pgbench.clone(), dir.clone());
            let out = procs::blocking(move || one(&pgbench, &args, &dir, case, duration)).await?;
            after_case(c, out.tps);
            if out.zeros > 0.01 {
                report::note(format!(
                    "pgbench, {path}, c={c}: {:.0}% of its transactions were logged at 0 µs \
                     (pgbench reads its clock lazily: an answer already there when it looks \
                     counts as 0 µs), so its p50 and p99 are floors",
                    out.zeros * 100.0
                ));
            }
            report::row(report::Row {
                backend: "postgres".into(),
                via: PGBENCH,
                path,
                concurrency: c,
                ops_per_sec: out.tps,
                p50: out.p50,
                p99: out.p99,
                cpu_us: out.cpu_us,
                sends: out.sends,
            });
        }
    }
    Ok(())
}

/// One pgbench run's figures.
struct Outcome {
    tps: f64,
    p50: Duration,
    p99: Duration,
    cpu_us: Option<f64>,
    sends: Option<f64>,
    /// The share of transactions logged at 0 µs.
    zeros: f64,
}

fn one(
    pgbench: &Path,
    args: &[String],
    dir: &Path,
    case: i64,
    duration: Duration,
) -> anyhow::Result<Outcome> {
    let stdout = dir.join(format!("out{case}"));
    let stderr = dir.join(format!("err{case}"));
    let (mut cmd, counted) = match super::sends::wrap(pgbench)? {
        Some((cmd, out)) => (cmd, Some(out)),
        None => (Command::new(pgbench), None),
    };
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout)?)
        .stderr(std::fs::File::create(&stderr)?);
    let child = Spawned::spawn(&mut cmd, "pgbench")?;
    let (status, cpu) = child.wait_with_cpu(duration + Duration::from_secs(120))?;
    let text = std::fs::read_to_string(&stdout).unwrap_or_default();
    let fail = || {
        format!(
            "pgbench ({}) exited with {status}:\n{}\n{}",
            args.join(" "),
            procs::tail(&stdout, 15),
            procs::tail(&stderr, 15)
        )
    };
    anyhow::ensure!(status.success(), "{}", fail());
    let summary = parse_summary(&text).with_context(fail)?;
    anyhow::ensure!(
        summary.failed == 0,
        "{} failed transactions: {}",
        summary.failed,
        fail()
    );
    let mut latencies = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(&format!("log{case}."))
        {
            latencies.extend(parse_log(&std::fs::read_to_string(entry.path())?)?);
        }
    }
    let zeros =
        latencies.iter().filter(|l| l.is_zero()).count() as f64 / latencies.len().max(1) as f64;
    let (p50, p99) = percentiles(&mut latencies);
    let done = summary.processed.max(1) as f64;
    let cpu_us = cpu.map(|cpu| {
        let ticks = match counted {
            // perf's own start is not pgbench's: only its reaped child.
            Some(_) => cpu.children,
            None => cpu.own + cpu.children,
        };
        procs::Cpu::micros(ticks) / done
    });
    let sends = match &counted {
        Some(out) => Some(super::sends::wrapped_count(out)?.sockets() as f64 / done),
        None => None,
    };
    Ok(Outcome {
        tps: summary.tps,
        p50,
        p99,
        cpu_us,
        sends,
        zeros,
    })
}
