//! The key-engine table, printed row by row as cases end, and what is
//! printed after it: notes (what was skipped and why), the server side of
//! the HTTP cases, and the ratios issue 24's targets name.

use std::sync::Mutex;
use std::time::Duration;

/// `via` of the in-process cases.
pub const LIBRARY: &str = "library";
/// `via` of the in-process HTTP cases (a hyper client and an axum server in
/// the bench's process).
pub const HTTP: &str = "http";
/// `via` of the pgbench baselines.
pub const PGBENCH: &str = "pgbench";
/// `via` of `wrk` against a running `idem serve`.
pub const WRK: &str = "wrk";
/// `via` of the Powertools + Redis peer.
pub const PEER: &str = "peer";
/// `via` of the Rust peer (`bench/rust-peer`: axum-idempotent + Redis)
/// driven by `wrk`.
pub const RUST_PEER: &str = "rust peer (axum-idempotent + Redis)";

/// The bare insert of the library and in-process HTTP tables.
pub const BASELINE: &str = "baseline insert";
/// A new key per operation (pessimistic claims, the default).
pub const FRESH: &str = "fresh key";
/// A new key per operation, optimistic claims.
pub const FRESH_OPTIMISTIC: &str = "fresh key, optimistic";
/// One stored key again and again.
pub const REPLAY: &str = "replay";

/// pgbench's paths.
pub const PG_BARE: &str = "bare insert tx";
pub const PG_FRESH: &str = "Idem's fresh statements, pessimistic";
pub const PG_PIPELINE: &str = "claim, insert, store in one pipeline";
pub const PG_SELECT: &str = "SELECT of a stored record";
pub const PG_OPTIMISTIC: &str = "Idem's fresh statements, optimistic";
pub const PG_BARE_DEMO: &str = "bare insert tx, demo_payments";

/// One measured case.
#[derive(Debug, Clone)]
pub struct Row {
    pub backend: String,
    pub via: &'static str,
    pub path: &'static str,
    pub concurrency: usize,
    pub ops_per_sec: f64,
    pub p50: Duration,
    pub p99: Duration,
    /// CPU the client process used per operation, in µs.
    pub cpu_us: Option<f64>,
    /// Write-family system calls of the client per operation.
    pub sends: Option<f64>,
}

/// What `idem serve` itself used in a `wrk` case.
#[derive(Debug, Clone)]
pub struct ServerRow {
    pub backend: String,
    pub path: &'static str,
    pub concurrency: usize,
    pub requests_per_sec: f64,
    pub cpu_us: Option<f64>,
    pub sends: Option<f64>,
}

static ROWS: Mutex<Vec<Row>> = Mutex::new(Vec::new());
static SERVER: Mutex<Vec<ServerRow>> = Mutex::new(Vec::new());
static NOTES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The table's header.
pub fn header() {
    println!(
        "| backend | via | path | concurrency | ops/s | p50 | p99 | client CPU µs/op | sends/op | ratio |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|");
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "—".to_owned(), |v| format!("{v:.decimals$}"))
}

fn find(rows: &[Row], backend: &str, via: &str, path: &str, c: usize) -> Option<f64> {
    rows.iter()
        .find(|r| r.backend == backend && r.via == via && r.path == path && r.concurrency == c)
        .map(|r| r.ops_per_sec)
}

/// The bare insert a row is compared with in the `ratio` column: its own
/// table's baseline for the library and in-process HTTP, pgbench's bare
/// insert for pgbench, wrk and the peer on PostgreSQL, the library's
/// baseline for wrk on SQLite.
fn bare(rows: &[Row], r: &Row) -> Option<f64> {
    let b = r.backend.as_str();
    match (r.via, b) {
        (LIBRARY | HTTP, _) => find(rows, b, r.via, BASELINE, r.concurrency),
        (_, "postgres") => find(rows, b, PGBENCH, PG_BARE, r.concurrency),
        (WRK, _) => find(rows, b, LIBRARY, BASELINE, r.concurrency),
        _ => None,
    }
}

/// Prints a row (with its ratio to its bare insert) and keeps it.
pub fn row(r: Row) {
    let Ok(mut rows) = ROWS.lock() else {
        return;
    };
    let ratio = bare(&rows, &r)
        .filter(|b| *b > 0.0)
        .map(|b| r.ops_per_sec / b);
    println!(
        "| {} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} |",
        r.backend,
        r.via,
        r.path,
        r.concurrency,
        r.ops_per_sec,
        ms(r.p50),
        ms(r.p99),
        opt(r.cpu_us, 0),
        opt(r.sends, 2),
        opt(ratio, 2),
    );
    rows.push(r);
}

/// Keeps the server side of a `wrk` case.
pub fn server(r: ServerRow) {
    if let Ok(mut s) = SERVER.lock() {
        s.push(r);
    }
}

/// A line printed after the table (a case skipped and why).
pub fn note(line: String) {
    eprintln!("bench: {line}");
    if let Ok(mut n) = NOTES.lock() {
        n.push(line);
    }
}

/// A ratio issue 24 names, with its target (at c = 8 and 32), or one
/// printed beside them for context (no target).
struct Named {
    backend: &'static str,
    name: &'static str,
    num: (&'static str, &'static str),
    den: (&'static str, &'static str),
    target: Option<f64>,
    comment: &'static str,
}

/// Issue 24's targets (quiet machine, wrk from outside, c = 8 and 32), then
/// the ratios that say where a request's time goes.
const NAMED: &[Named] = &[
    Named {
        backend: "postgres",
        name: "HTTP fresh / pgbench bare",
        num: (WRK, FRESH),
        den: (PGBENCH, PG_BARE),
        target: Some(0.45),
        comment: "pessimistic claims (the default)",
    },
    Named {
        backend: "postgres",
        name: "HTTP fresh optimistic / pgbench bare",
        num: (WRK, FRESH_OPTIMISTIC),
        den: (PGBENCH, PG_BARE),
        target: Some(0.6),
        comment: "",
    },
    Named {
        backend: "postgres",
        name: "HTTP replay / pgbench bare",
        num: (WRK, REPLAY),
        den: (PGBENCH, PG_BARE),
        target: Some(1.5),
        comment: "",
    },
    Named {
        backend: "postgres",
        name: "HTTP fresh / library fresh",
        num: (WRK, FRESH),
        den: (LIBRARY, FRESH),
        target: Some(0.85),
        comment: "idem serve against the in-process engine",
    },
    Named {
        backend: "postgres",
        name: "HTTP fresh / Powertools peer fresh",
        num: (WRK, FRESH),
        den: (PEER, FRESH),
        target: Some(2.0),
        comment: "",
    },
    Named {
        backend: "postgres",
        name: "HTTP replay / Powertools peer replay",
        num: (WRK, REPLAY),
        den: (PEER, REPLAY),
        target: Some(10.0),
        comment: "",
    },
    Named {
        backend: "postgres",
        name: "HTTP fresh / Rust peer fresh",
        num: (WRK, FRESH),
        den: (RUST_PEER, FRESH),
        target: Some(2.0),
        comment: "",
    },
    Named {
        backend: "postgres",
        name: "HTTP replay / Rust peer replay",
        num: (WRK, REPLAY),
        den: (RUST_PEER, REPLAY),
        target: Some(10.0),
        comment: "",
    },
    Named {
        backend: "postgres",
        name: "HTTP fresh / HTTP baseline insert",
        num: (WRK, FRESH),
        den: (WRK, BASELINE),
        target: None,
        comment: "Idem's share of a fresh request: the same route without the layer",
    },
    Named {
        backend: "postgres",
        name: "HTTP baseline insert / pgbench bare demo_payments",
        num: (WRK, BASELINE),
        den: (PGBENCH, PG_BARE_DEMO),
        target: None,
        comment: "the server and the demo's own work, without Idem",
    },
    Named {
        backend: "postgres",
        name: "library fresh / pgbench bare",
        num: (LIBRARY, FRESH),
        den: (PGBENCH, PG_BARE),
        target: None,
        comment: "",
    },
    Named {
        backend: "postgres",
        name: "library fresh optimistic / pgbench bare",
        num: (LIBRARY, FRESH_OPTIMISTIC),
        den: (PGBENCH, PG_BARE),
        target: None,
        comment: "",
    },
    Named {
        backend: "postgres",
        name: "pgbench Idem's fresh statements / pgbench bare",
        num: (PGBENCH, PG_FRESH),
        den: (PGBENCH, PG_BARE),
        target: None,
        comment: "the SQL-level room",
    },
    Named {
        backend: "sqlite",
        name: "library fresh / library bare",
        num: (LIBRARY, FRESH),
        den: (LIBRARY, BASELINE),
        target: Some(0.8),
        comment: "",
    },
    Named {
        backend: "sqlite",
        name: "library fresh optimistic / library bare",
        num: (LIBRARY, FRESH_OPTIMISTIC),
        den: (LIBRARY, BASELINE),
        target: Some(0.8),
        comment: "",
    },
    Named {
        backend: "sqlite",
        name: "HTTP fresh / HTTP baseline insert",
        num: (WRK, FRESH),
        den: (WRK, BASELINE),
        target: None,
        comment: "Idem's share of a fresh request",
    },
    Named {
        backend: "sqlite",
        name: "HTTP fresh / library fresh",
        num: (WRK, FRESH),
        den: (LIBRARY, FRESH),
        target: None,
        comment: "demo_payments against bench_payments",
    },
];

/// Prints the notes, the server side of the `wrk` cases and the named
/// ratios against their targets.
pub fn summary() {
    let rows = ROWS.lock().map(|r| r.clone()).unwrap_or_default();
    let notes = NOTES.lock().map(|n| n.clone()).unwrap_or_default();
    let server = SERVER.lock().map(|s| s.clone()).unwrap_or_default();
    println!();
    for n in &notes {
        println!("{n}");
    }
    if !server.is_empty() {
        if !notes.is_empty() {
            println!();
        }
        println!(
            "| backend | idem serve, driven by wrk | concurrency | requests/s | server CPU µs/op | server sends/op |"
        );
        println!("|---|---|---:|---:|---:|---:|");
        for s in &server {
            println!(
                "| {} | {} | {} | {:.0} | {} | {} |",
                s.backend,
                s.path,
                s.concurrency,
                s.requests_per_sec,
                opt(s.cpu_us, 0),
                opt(s.sends, 2)
            );
        }
    }
    println!();
    println!("| backend | concurrency | ratio | value | target at c = 8 and 32 |");
    println!("|---|---:|---|---:|---|");
    for c in [1, 8, 32] {
        for n in NAMED {
            if !rows.iter().any(|r| r.backend == n.backend) {
                continue;
            }
            let num = find(&rows, n.backend, n.num.0, n.num.1, c);
            let den = find(&rows, n.backend, n.den.0, n.den.1, c);
            let value = num.zip(den).filter(|(_, d)| *d > 0.0).map(|(a, b)| a / b);
            println!(
                "| {} | {c} | {} | {} | {} |",
                n.backend,
                n.name,
                opt(value, 2),
                verdict(n, c, value)
            );
        }
    }
}

fn verdict(n: &Named, c: usize, value: Option<f64>) -> String {
    let applies = c == 8 || c == 32;
    let mut parts = Vec::new();
    match (n.target, applies, value) {
        (Some(t), true, Some(v)) if v >= t => parts.push(format!("≥ {t}: met")),
        (Some(t), true, Some(_)) => parts.push(format!("≥ {t}: NOT met")),
        (Some(t), true, None) => parts.push(format!("≥ {t}: not measured")),
        _ => {}
    }
    if !n.comment.is_empty() {
        parts.push(n.comment.to_owned());
    }
    if parts.is_empty() {
        "—".to_owned()
    } else {
        parts.join("; ")
    }
}
