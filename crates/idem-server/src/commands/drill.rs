//! `idem drill`: check any HTTP API that claims `Idempotency-Key` support
//! ([`idem_drill`]). Exit status 0 when no drill FAILs (a broken contract;
//! with `--strict` a convention WARN too), 1 when one does, 2 for bad usage
//! or an unreachable target.

use std::path::PathBuf;

use super::exit::Exit;
use idem_drill::{DRILLS, DrillResult, DrillSpec, Observer};

use crate::progress::Progress;

/// `idem drill`'s flags; each but `--config`, `--json` and `--junit` also
/// has a key in the `--config` file, and a flag wins over the file.
#[derive(clap::Args)]
pub struct DrillArgs {
    /// The API: `http://HOST:PORT[/PREFIX]`.
    target: Option<String>,
    /// The request under test: `METHOD /path` (`{unique}` allowed).
    #[arg(long)]
    request: Option<String>,
    /// Its JSON body; `{unique}` is replaced by a fresh value per drill case.
    #[arg(long)]
    body: Option<String>,
    /// `GET /path` listing one case's effects (must contain `{unique}`).
    #[arg(long)]
    effects: Option<String>,
    /// JSON pointer into the effects answer: an array (its length counts)
    /// or a number.
    #[arg(long)]
    count: Option<String>,
    /// A TOML file with any of the settings (snake_case keys: target,
    /// request, body, effects, count, headers = [...], concurrency,
    /// timeout, max_requests, mutate, mutate_body, ttl, rounds, key_format,
    /// strict, settle).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print the report as JSON on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write the report as JUnit XML to FILE.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Requests of the concurrency drill (2 to 1000) [default: 50].
    #[arg(long)]
    concurrency: Option<usize>,
    /// `Name: value` sent with every request (repeatable; added to the
    /// file's `headers`).
    #[arg(long = "header", value_name = "HEADER")]
    headers: Vec<String>,
    /// The longest one exchange may take (100ms to 10min) [default: 10s].
    #[arg(long)]
    timeout: Option<String>,
    /// A hard cap on the requests sent; drills it would exceed are skipped.
    #[arg(long)]
    max_requests: Option<u64>,
    /// `METHOD /path/{id}` that changes the created resource (`{id}` from
    /// the first answer's JSON `id`): enables replay-after-mutation.
    #[arg(long)]
    mutate: Option<String>,
    /// The JSON body of --mutate (`{id}` and `{unique}` allowed).
    #[arg(long)]
    mutate_body: Option<String>,
    /// The target's key TTL: enables late-retry, which waits this long
    /// (plus 1 s; at most 24h).
    #[arg(long)]
    ttl: Option<String>,
    /// Rounds of every contract drill but baseline, each with fresh keys
    /// and every request on a new connection; the worst decides (1 to 100)
    /// [default: 5].
    #[arg(long)]
    rounds: Option<u32>,
    /// How keys look: `token` (idem-drill-…), `uuid`, or a template with
    /// `{uuid}` or `{token}` such as `pay_{uuid}` [default: token].
    #[arg(long)]
    key_format: Option<String>,
    /// Convention warnings (WARN) fail the run too (exit 1).
    #[arg(long, overrides_with = "no_strict")]
    strict: bool,
    /// Convention warnings do not fail the run (over `strict = true` in
    /// --config).
    #[arg(long, overrides_with = "strict")]
    no_strict: bool,
    /// After the drills, wait this long and count every case's effects
    /// again: a count that grew (a duplicate made later) FAILs its drill
    /// (0s to 60s; 0s: off) [default: 1s].
    #[arg(long)]
    settle: Option<String>,
}

/// The drills, one line each, for `idem drill --help`.
pub fn drills_help() -> String {
    let width = DRILLS.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    let mut out = String::from(
        "Drills (each PASS, FAIL, WARN, SKIP or INFO with its evidence). FAIL is a broken \
         contract (a second effect, a lost or changed answer, another payload accepted); \
         WARN a convention (a refusal's status, byte-level fingerprints, a malformed key \
         accepted, 5xx under a race with one effect). Exit 1 if one FAILs (or WARNs, with \
         --strict), 2 for bad usage or an unreachable target:\n",
    );
    for (name, what) in DRILLS {
        out.push_str(&format!("  {name:width$}  {what}\n"));
    }
    out.push_str(
        "\nExample (the demo API of `idem serve`):\n  idem drill http://127.0.0.1:8080 \
         --request 'POST /v1/payments' \\\n    --body '{\"amount\":100,\"currency\":\"EUR\",\"customer\":\"{unique}\"}' \\\n    \
         --effects 'GET /v1/payments?customer={unique}' --count /data",
    );
    out
}

fn usage(msg: impl std::fmt::Display) -> anyhow::Error {
    Exit::new(2, format!("error: {msg}")).into()
}

impl DrillArgs {
    /// Runs the drills and prints the report.
    pub async fn run(self) -> anyhow::Result<()> {
        let file = match &self.config {
            Some(path) => {
                let text = crate::config::read_file(path).map_err(usage)?;
                toml::from_str::<DrillSpec>(&text).map_err(|e| {
                    usage(format!(
                        "invalid configuration in {}: {}",
                        path.display(),
                        crate::config_error::redacted(&text, &e)
                    ))
                })?
            }
            None => DrillSpec::default(),
        };
        let flags = DrillSpec {
            target: self.target,
            request: self.request,
            body: self.body,
            effects: self.effects,
            count: self.count,
            headers: self.headers,
            concurrency: self.concurrency,
            timeout: self.timeout,
            max_requests: self.max_requests,
            mutate: self.mutate,
            mutate_body: self.mutate_body,
            ttl: self.ttl,
            rounds: self.rounds,
            key_format: self.key_format,
            strict: match (self.strict, self.no_strict) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            },
            settle: self.settle,
        };
        let config = file.overlay(flags).validate().map_err(usage)?;
        let mut bar = Bar(Progress::stderr("drill", Some(DRILLS.len() as u64)));
        let report = idem_drill::run(config, &mut bar).await.map_err(usage)?;
        if let Some(path) = &self.junit {
            std::fs::write(path, report.junit())
                .map_err(|e| usage(format!("failed to write {}: {e}", path.display())))?;
        }
        if self.json {
            println!("{}", report.json());
        } else {
            print!("{}", report.table());
        }
        if report.failed() {
            return Err(Exit::silent(1).into());
        }
        Ok(())
    }
}

/// One line per drill on stderr; on a terminal a bar shows the drill
/// running between them.
struct Bar(Progress);

impl Observer for Bar {
    fn start(&mut self, name: &str) {
        self.0.advance(0, &format!("{name} …"));
    }

    fn done(&mut self, index: usize, total: usize, result: &DrillResult) {
        self.0.complete(1, &idem_drill::line(index, total, result));
    }

    fn finish(&mut self, settled: Option<&str>) {
        if let Some(line) = settled {
            self.0.complete(0, line);
        }
    }

    fn abort(&mut self) {
        self.0.abandon();
    }
}
