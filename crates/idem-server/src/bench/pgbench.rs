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
use super::report::{
    self, PG_BARE, PG_BARE_DEMO, PG_FRESH, PG_OPTIMISTIC, PG_PIPELINE, PG_SELECT, PGBENCH,
};

/// The next id of this client.
const NEXT_ID: &str = "\\set n :n + 1\n\\set id :base + :client_id * 100000000 + :n\n";

const BUSINESS_INSERT: &str = "INSERT INTO bench_payments (id, amount) VALUES (:id, :amount);\n";

const CLAIM: &str = "\
INSERT INTO idem_keys (tenant_id, operation, idempotency_key, request_hash, state,
                       locked_until_ms, created_at_ms, updated_at_ms, expires_at_ms)
VALUES (:tenant, :operation, :id, :hash, 'pending', NULL, :now, :now, :expires)
ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING
RETURNING 1;
";

const COMPLETE: &str = "\
UPDATE idem_keys SET state = :state, status_code = :status, response_headers = :headers, response_body = :body,
       resource_type = NULL, resource_id = NULL, locked_until_ms = NULL, updated_at_ms = :now
WHERE tenant_id = :tenant AND operation = :operation AND idempotency_key = :id AND state = 'pending';
";

/// `SELECT_RECORD` of the key in pgbench variable `key`: of the stored
/// record, or the read-first step's read of the key about to be claimed.
fn select_record(key: &str) -> String {
    format!(
        "SELECT request_hash, state, status_code, response_headers, response_body, resource_type,
       resource_id, locked_until_ms, created_at_ms, expires_at_ms, on_unknown
FROM idem_keys WHERE tenant_id = :tenant AND operation = :operation AND idempotency_key = {key};
"
    )
}

const OPTIMISTIC_RECORD: &str = "\
INSERT INTO idem_keys (tenant_id, operation, idempotency_key, request_hash, state, status_code,
                       response_headers, response_body, resource_type, resource_id,
                       locked_until_ms, created_at_ms, updated_at_ms, expires_at_ms)
VALUES (:tenant, :operation, :id, :hash, :state, :status, :headers, :body, NULL, NULL,
        NULL, :now, :now, :expires)
ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING;
";

/// `INSERT_PAYMENT` of `demo/sql.rs`, the business insert of
/// `POST /v1/payments` (no reference: `NULL`).
const DEMO_INSERT: &str = "\
INSERT INTO demo_payments (tenant_id, id, amount, currency, customer, reference, created_at_ms)
VALUES (:tenant, :id, :amount, :currency, :customer, NULL, :now)
ON CONFLICT (tenant_id, reference) DO NOTHING RETURNING id;
";

/// The scripts, as (path in the table, file name, text).
fn scripts() -> Vec<(&'static str, &'static str, String)> {
    vec![
        (
            PG_BARE,
            "bare.sql",
            format!("{NEXT_ID}BEGIN;\n{BUSINESS_INSERT}END;\n"),
        ),
        (
            PG_FRESH,
            "fresh.sql",
            format!(
                "{NEXT_ID}{}BEGIN;\n{CLAIM}{BUSINESS_INSERT}{COMPLETE}END;\n",
                select_record(":id::text")
            ),
        ),
        (
            PG_PIPELINE,
            "pipeline.sql",
            format!(
                "{NEXT_ID}\\startpipeline\nBEGIN;\n{CLAIM}{BUSINESS_INSERT}{COMPLETE}END;\n\\endpipeline\n"
            ),
        ),
        (PG_SELECT, "select.sql", select_record(":key")),
        (
            PG_OPTIMISTIC,
            "optimistic.sql",
            format!(
                "{NEXT_ID}{}BEGIN;\n{BUSINESS_INSERT}{OPTIMISTIC_RECORD}COMMIT;\n",
                select_record(":id::text")
            ),
        ),
        (
            PG_BARE_DEMO,
            "bare_demo.sql",
            format!("{NEXT_ID}BEGIN;\n{DEMO_INSERT}END;\n"),
        ),
    ]
}

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
    crate::backend::Db::open(url).await?;
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

/// What pgbench's summary says.
#[derive(Debug, PartialEq)]
pub struct Summary {
    pub tps: f64,
    pub processed: u64,
    pub failed: u64,
}

/// Reads `tps = …`, `number of transactions actually processed: …` and
/// `number of failed transactions: …` (absent before PostgreSQL 15: zero).
pub fn parse_summary(text: &str) -> anyhow::Result<Summary> {
    let after = |prefix: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
    };
    let tps = after("tps = ")
        .and_then(|v| v.parse().ok())
        .context("no `tps = …` in pgbench's output")?;
    let processed = after("number of transactions actually processed: ")
        .and_then(|v| v.split('/').next())
        .and_then(|v| v.parse().ok())
        .context("no transaction count in pgbench's output")?;
    let failed = match after("number of failed transactions: ") {
        Some(v) => v.parse().context("failed transactions")?,
        None => 0,
    };
    Ok(Summary {
        tps,
        processed,
        failed,
    })
}

/// The latencies of a per-transaction log (`client transaction latency_us
/// script epoch_s epoch_us` per line).
pub fn parse_log(text: &str) -> anyhow::Result<Vec<Duration>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            l.split_whitespace()
                .nth(2)
                .and_then(|v| v.parse::<u64>().ok())
                .map(Duration::from_micros)
                .with_context(|| format!("pgbench log line {l:?}"))
        })
        .collect()
}

/// p50 and p99 (zero without values).
pub fn percentiles(values: &mut [Duration]) -> (Duration, Duration) {
    values.sort();
    let pct = |p: f64| {
        values
            .get(((values.len() as f64 * p) as usize).min(values.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    (pct(0.50), pct(0.99))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from pgbench 15.18 (`-n -M prepared -f bare.sql -c 2 -j 2 -T 1 -l`).
    const OUTPUT: &str = "pgbench (15.18 (Debian 15.18-0+deb12u1))
transaction type: bare.sql
scaling factor: 1
query mode: prepared
number of clients: 2
number of threads: 2
maximum number of tries: 1
duration: 1 s
number of transactions actually processed: 5353
number of failed transactions: 0 (0.000%)
latency average = 0.373 ms
initial connection time = 3.570 ms
tps = 5355.651047 (without initial connection time)
";

    #[test]
    fn pgbench_summary_parses() {
        assert_eq!(
            parse_summary(OUTPUT).unwrap(),
            Summary {
                tps: 5355.651047,
                processed: 5353,
                failed: 0
            }
        );
        let failing = OUTPUT.replace(
            "failed transactions: 0 (0.000%)",
            "failed transactions: 3 (0.056%)",
        );
        assert_eq!(parse_summary(&failing).unwrap().failed, 3);
        assert!(parse_summary("pgbench: error: connection failed").is_err());
    }

    #[test]
    fn pgbench_logs_give_percentiles() {
        // The first lines of the two logs of the run above.
        let log = "0 1 1237 0 1796375078 675928\n0 2 324 0 1796375078 676260\n\
                   0 3 283 0 1796375078 676546\n";
        let log2 = "1 1 1370 0 1796375078 676088\n1 2 313 0 1796375078 676407\n\
                    1 3 292 0 1796375078 676702\n";
        let mut all = parse_log(log).unwrap();
        all.extend(parse_log(log2).unwrap());
        assert_eq!(all.len(), 6);
        let (p50, p99) = percentiles(&mut all);
        assert_eq!(p50, Duration::from_micros(324));
        assert_eq!(p99, Duration::from_micros(1370));
        assert!(parse_log("0 1 x 0 1 2\n").is_err());
        assert_eq!(percentiles(&mut []), (Duration::ZERO, Duration::ZERO));
    }

    #[test]
    fn every_script_but_the_select_inserts_a_new_id() {
        for (path, _, text) in scripts() {
            assert_eq!(text.contains(":id"), path != PG_SELECT, "{path}");
            assert_eq!(text.starts_with(NEXT_ID), path != PG_SELECT, "{path}");
        }
    }
}
