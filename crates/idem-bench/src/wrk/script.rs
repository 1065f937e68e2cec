//! What wrk sends — the demo's payment body, a Lua script that keys each
//! request and counts the answers — and the one line the script prints.

use anyhow::Context;

/// The request body (the demo requires amount, currency and customer).
pub const BODY: &str = r#"{"amount":100,"currency":"EUR","customer":"cus_bench"}"#;

/// wrk's script: args are the mode (`fresh`, `replay` or `baseline`) and a
/// key prefix unique to the case (fresh: `prefix-t<thread>-<n>`; replay:
/// the prefix is the key; baseline: no key, the route has no layer) and,
/// optionally, a `Cookie` header value sent with every request (the Rust
/// peer's session). The path is the URL's. It prints one `RESULT` line.
pub const LUA: &str = r#"local threads = {}
local body = '{"amount":100,"currency":"EUR","customer":"cus_bench"}'
function setup(thread)
  table.insert(threads, thread)
  thread:set("tid", #threads)
end
function init(args)
  mode, prefix, cookie = args[1], args[2], args[3]
  n, replayed, executed, other = 0, 0, 0, 0
  key_prefix = prefix .. "-t" .. tid .. "-"
end
function request()
  n = n + 1
  local headers = { ["Content-Type"] = "application/json" }
  if mode == "fresh" then headers["Idempotency-Key"] = key_prefix .. n
  elseif mode == "replay" then headers["Idempotency-Key"] = prefix end
  if cookie then headers["Cookie"] = cookie end
  return wrk.format("POST", nil, headers, body)
end
function response(status, headers, body)
  if status ~= 201 then other = other + 1 end
  local r = headers["idempotent-replayed"] or headers["Idempotent-Replayed"]
  if r == "true" then replayed = replayed + 1 else executed = executed + 1 end
end
function done(summary, latency, requests)
  local rep, exe, oth = 0, 0, 0
  for _, t in ipairs(threads) do
    rep = rep + t:get("replayed")
    exe = exe + t:get("executed")
    oth = oth + t:get("other")
  end
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d p50_us=%d p99_us=%d non2xx=%d connect=%d read=%d write=%d timeout=%d replayed=%d executed=%d not201=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.status, e.connect, e.read, e.write, e.timeout, rep, exe, oth))
end
"#;

/// wrk's `RESULT` line.
#[derive(Debug, PartialEq, Eq)]
pub struct Result {
    pub requests: u64,
    pub duration_us: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub non2xx: u64,
    pub socket_errors: u64,
    pub replayed: u64,
    pub executed: u64,
    pub not201: u64,
}

/// Reads the `RESULT` line of wrk's output.
pub fn parse_result(output: &str) -> anyhow::Result<Result> {
    let line = output
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .context("no RESULT line in wrk's output")?;
    let field = |name: &str| -> anyhow::Result<u64> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no {name} in {line:?}"))
    };
    Ok(Result {
        requests: field("requests")?,
        duration_us: field("duration_us")?,
        p50_us: field("p50_us")?,
        p99_us: field("p99_us")?,
        non2xx: field("non2xx")?,
        socket_errors: field("connect")? + field("read")? + field("write")? + field("timeout")?,
        replayed: field("replayed")?,
        executed: field("executed")?,
        not201: field("not201")?,
    })
}

impl Result {
    /// Whether the run is a measurement of what it claims to measure.
    pub fn check(&self, mode: &str) -> anyhow::Result<()> {
        anyhow::ensure!(self.requests > 0, "wrk sent no request");
        anyhow::ensure!(
            self.non2xx == 0 && self.not201 == 0 && self.socket_errors == 0,
            "{} non-2xx answers, {} answers other than 201, {} socket errors",
            self.non2xx,
            self.not201,
            self.socket_errors
        );
        match mode {
            // A baseline request has no key: nothing can replay it.
            "fresh" | "baseline" => anyhow::ensure!(
                self.replayed == 0,
                "{} {mode} requests were answered as replays",
                self.replayed
            ),
            _ => anyhow::ensure!(
                self.executed == 0,
                "{} replays were executed",
                self.executed
            ),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured: wrk 4.1 with the script above, 1 s, 8 connections,
    /// against a release `idem serve` on SQLite.
    const FRESH: &str = "Running 1s test @ http://127.0.0.1:58123/v1/payments
  2 threads and 8 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    64.58ms  146.04ms 836.02ms   90.84%
    Req/Sec   294.60    172.52   777.00     90.00%
  587 requests in 1.00s, 212.67KB read
Requests/sec:    584.64
Transfer/sec:    211.82KB
RESULT requests=587 duration_us=1004039 p50_us=5439 p99_us=725998 non2xx=0 connect=0 read=0 write=0 timeout=0 replayed=0 executed=587 not201=0
";
    /// The same server, one stored key.
    const REPLAY: &str = "Running 1s test @ http://127.0.0.1:58123/v1/payments
  2 threads and 8 connections
  3102 requests in 1.10s, 1.18MB read
RESULT requests=3102 duration_us=1099435 p50_us=2607 p99_us=5945 non2xx=0 connect=0 read=0 write=0 timeout=0 replayed=3102 executed=0 not201=0
";

    #[test]
    fn wrk_result_lines_parse_and_check() {
        let r = parse_result(FRESH).unwrap();
        assert_eq!(
            r,
            Result {
                requests: 587,
                duration_us: 1004039,
                p50_us: 5439,
                p99_us: 725998,
                non2xx: 0,
                socket_errors: 0,
                replayed: 0,
                executed: 587,
                not201: 0
            }
        );
        r.check("fresh").unwrap();
        r.check("baseline").unwrap();
        assert!(r.check("replay").is_err());
        let r = parse_result(REPLAY).unwrap();
        assert_eq!((r.requests, r.replayed, r.executed), (3102, 3102, 0));
        r.check("replay").unwrap();
        assert!(r.check("fresh").is_err());
        assert!(r.check("baseline").is_err(), "a baseline never replays");
        // Error answers and socket errors fail a case.
        for (from, to) in [
            ("non2xx=0", "non2xx=3"),
            ("read=0", "read=1"),
            ("not201=0", "not201=2"),
        ] {
            let bad = parse_result(&FRESH.replace(from, to)).unwrap();
            assert!(bad.check("fresh").is_err(), "{to}");
        }
        assert!(parse_result("Running 1s test\n").is_err());
        assert!(parse_result("RESULT requests=1\n").is_err());
    }
}
