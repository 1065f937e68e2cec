#!/usr/bin/env bash
# The gateway benchmark: `idem serve --upstream` in front of a trivial API,
# against the API directly and against a plain reverse proxy (nginx) with no
# idempotency, measured from outside with wrk, on SQLite and PostgreSQL, in
# one run. Prints a markdown table on stdout (progress on stderr).
#
#   bench/gateway.sh            # from the repository root
#
# Environment:
#   GATEWAY_BENCH_SECONDS      seconds per case (default 5)
#   GATEWAY_BENCH_CONCURRENCY  connections, space-separated (default "1 8 32")
#   GATEWAY_BENCH_BACKENDS     "sqlite postgres" (default both)
#   GATEWAY_BENCH_PGBENCH      1 (default) runs pgbench with the gateway's two
#                              writes per fresh key as a database reference
#   IDEM_BENCH_POSTGRES_URL    a PostgreSQL server to create a scratch database
#                              on (default $IDEM_TEST_POSTGRES_URL; without
#                              either, a throwaway PostgreSQL 15 on loopback)
#   IDEM_BIN                   the idem binary (default target/release/idem,
#                              built with `cargo build --release -p idem-server`)
#
# Needs wrk, nginx (nginx-light) and, for PostgreSQL, psql and pgbench; as
# root it installs the missing Debian packages with apt-get. Every server
# binds 127.0.0.1 only; every load run is bounded in time. Not a test and not
# in CI: it prints figures, and fails only when a case answered anything but
# 2xx (or wrk saw socket errors), because those figures would be meaningless.
set -euo pipefail

SECONDS_PER_CASE=${GATEWAY_BENCH_SECONDS:-5}
CONCURRENCY=${GATEWAY_BENCH_CONCURRENCY:-"1 8 32"}
BACKENDS=${GATEWAY_BENCH_BACKENDS:-"sqlite postgres"}
RUN_PGBENCH=${GATEWAY_BENCH_PGBENCH:-1}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IDEM_BIN=${IDEM_BIN:-$ROOT/target/release/idem}
BENCH_DB=idem_gwbench
export PGOPTIONS="-c client_min_messages=warning"

say() { echo "gateway-bench: $*" >&2; }
die() { echo "gateway-bench: FAILED: $*" >&2; exit 1; }

# --- children and cleanup ----------------------------------------------------

WORK=$(mktemp -d /tmp/idem-gateway-bench.XXXXXX)
PIDS=()
PG_DATA=""     # a throwaway cluster, when we started one
PG_BINDIR=/usr/lib/postgresql/15/bin
ADMIN_URL=""
cleanup() {
    local status=$?
    local pid
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    if [[ -n $ADMIN_URL ]]; then
        psql "$ADMIN_URL" -qAtc "DROP DATABASE IF EXISTS $BENCH_DB WITH (FORCE)" >/dev/null 2>&1 || true
    fi
    if [[ -n $PG_DATA ]]; then
        runuser -u postgres -- "$PG_BINDIR/pg_ctl" -w -m fast -D "$PG_DATA" stop >/dev/null 2>&1 || true
    fi
    if [[ $status -eq 0 ]]; then
        rm -rf "$WORK"
    else
        say "logs kept in $WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Stops one child we started (by its pid) and forgets it.
stop() {
    local pid=$1 kept=() p
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    for p in "${PIDS[@]}"; do
        [[ $p == "$pid" ]] || kept+=("$p")
    done
    PIDS=("${kept[@]}")
}

# --- tools -------------------------------------------------------------------

apt_install() {
    [[ $(id -u) -eq 0 ]] || die "$1 is missing (install the Debian package $2, or run as root)"
    say "installing $2 with apt-get"
    # Packaged services must not start (nginx would listen on 0.0.0.0:80).
    local policy=/usr/sbin/policy-rc.d made=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made=1
    fi
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" >&2
    [[ $made -eq 0 ]] || rm -f "$policy"
}
need() { command -v "$1" >/dev/null || apt_install "$1" "$2"; }

need wrk wrk
need nginx nginx-light
need curl curl
if [[ " $BACKENDS " == *" postgres "* ]]; then
    need psql postgresql-client
    need pgbench postgresql-client
fi
if [[ ! -x $IDEM_BIN ]]; then
    say "building $IDEM_BIN"
    (cd "$ROOT" && cargo build --release -p idem-server >&2)
fi

# A free TCP port on 127.0.0.1, not one handed out before in this run.
USED_PORTS=" "
free_port() {
    local p
    while :; do
        p=$((20000 + RANDOM % 30000))
        [[ $USED_PORTS == *" $p "* ]] && continue
        if [[ -z $(ss -Htln "sport = :$p") ]]; then
            USED_PORTS+="$p "
            echo "$p"
            return
        fi
    done
}

# Waits until something answers HTTP on 127.0.0.1:$1 while pid $2 lives.
wait_http() {
    local i
    for i in $(seq 1 300); do
        kill -0 "$2" 2>/dev/null || die "the server on port $1 exited (logs in $WORK)"
        if curl -s -o /dev/null "http://127.0.0.1:$1/"; then
            return
        fi
        sleep 0.1
    done
    die "nothing answered on port $1 in 30 s"
}

# --- the upstream and the plain proxy (nginx, one worker each) ---------------

nginx_conf() { # name port body-of-http-block
    local dir=$WORK/nginx-$1
    mkdir -p "$dir/tmp"
    cat >"$dir/nginx.conf" <<EOF
worker_processes 1;
daemon off;
master_process on;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $dir/tmp/body;
    proxy_temp_path $dir/tmp/proxy;
    fastcgi_temp_path $dir/tmp/fastcgi;
    uwsgi_temp_path $dir/tmp/uwsgi;
    scgi_temp_path $dir/tmp/scgi;
    keepalive_requests 100000000;
    keepalive_timeout 120s;
    $3
}
EOF
    chmod -R a+rwx "$dir/tmp"
    nginx -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" 2>>"$dir/error.log" &
    PIDS+=($!)
    wait_http "$2" "$!"
}

UP_PORT=$(free_port)
PROXY_PORT=$(free_port)
say "upstream: nginx on 127.0.0.1:$UP_PORT; plain proxy: nginx on 127.0.0.1:$PROXY_PORT"
nginx_conf upstream "$UP_PORT" "
    server {
        listen 127.0.0.1:$UP_PORT;
        default_type application/json;
        location / { return 201 '{\"id\":\"pay_1\",\"amount\":100}'; }
    }"
nginx_conf proxy "$PROXY_PORT" "
    upstream api {
        server 127.0.0.1:$UP_PORT;
        keepalive 128;
        keepalive_requests 100000000;
    }
    server {
        listen 127.0.0.1:$PROXY_PORT;
        # A line per request, as the gateway logs one (RUST_LOG=info).
        access_log $WORK/nginx-proxy/access.log;
        location / {
            proxy_pass http://api;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }
    }"

# --- the load generator ------------------------------------------------------

# Every path gets the same script (a POST with an Idempotency-Key made in Lua
# per request, its answer looked at), so the load generator costs the same.
cat >"$WORK/post.lua" <<'EOF'
-- args: mode ("fresh": a new key per request; "fixed": the key is the run id), run id
local threads = {}
local body = '{"amount":100,"currency":"EUR"}'
function setup(thread)
  table.insert(threads, thread)
  thread:set("tid", #threads)
end
function init(args)
  mode, run = args[1], args[2]
  n, replayed, executed = 0, 0, 0
  prefix = run .. "-t" .. tid .. "-"
end
function request()
  n = n + 1
  local key = run
  if mode == "fresh" then key = prefix .. n end
  return wrk.format("POST", "/v1/payments",
    { ["Content-Type"] = "application/json", ["Idempotency-Key"] = key }, body)
end
function response(status, headers, body)
  local r = headers["idempotent-replayed"] or headers["Idempotent-Replayed"]
  if r == "true" then replayed = replayed + 1 else executed = executed + 1 end
end
function done(summary, latency, requests)
  local rep, exe = 0, 0
  for _, t in ipairs(threads) do
    rep = rep + t:get("replayed")
    exe = exe + t:get("executed")
  end
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d p50_us=%d p99_us=%d non2xx=%d connect=%d read=%d write=%d timeout=%d replayed=%d executed=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.status, e.connect, e.read, e.write, e.timeout, rep, exe))
end
EOF

field() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" <<<" $2"; }
ms() { awk -v us="$1" 'BEGIN { printf "%.2f ms", us / 1000 }'; }

# load PORT CONCURRENCY MODE RUN SECONDS -> "rps p50_us p99_us replayed executed"
load() {
    local port=$1 c=$2 mode=$3 run=$4 secs=$5 threads out result
    threads=$((c < 2 ? c : 2))
    out=$(wrk -t "$threads" -c "$c" -d "${secs}s" --timeout 10s -s "$WORK/post.lua" \
        "http://127.0.0.1:$port/v1/payments" -- "$mode" "$run" 2>&1) \
        || die "wrk failed on port $port: $out"
    result=$(grep '^RESULT ' <<<"$out") || die "no result from wrk: $out"
    local non2xx errs
    non2xx=$(field non2xx "$result")
    errs=$(($(field connect "$result") + $(field read "$result") + $(field write "$result") + $(field timeout "$result")))
    if ((non2xx > 0 || errs > 0)); then
        die "run $run (port $port, c=$c): $non2xx non-2xx responses, $errs socket errors: $result"
    fi
    awk -v r="$(field requests "$result")" -v d="$(field duration_us "$result")" \
        -v p50="$(field p50_us "$result")" -v p99="$(field p99_us "$result")" \
        -v rep="$(field replayed "$result")" -v exe="$(field executed "$result")" \
        'BEGIN { printf "%.0f %d %d %d %d\n", r / (d / 1e6), p50, p99, rep, exe }'
}

# --- PostgreSQL --------------------------------------------------------------

if [[ " $BACKENDS " == *" postgres "* ]]; then
    ADMIN_URL=${IDEM_BENCH_POSTGRES_URL:-${IDEM_TEST_POSTGRES_URL:-}}
    if [[ -z $ADMIN_URL ]]; then
        [[ -x $PG_BINDIR/initdb ]] || apt_install "$PG_BINDIR/initdb" postgresql-15
        [[ $(id -u) -eq 0 ]] || die "a throwaway PostgreSQL needs root here (or set IDEM_BENCH_POSTGRES_URL)"
        mkdir -p "$WORK/pg" && chown postgres:postgres "$WORK/pg" && chmod a+x "$WORK"
        PG_PORT=$(free_port)
        runuser -u postgres -- "$PG_BINDIR/initdb" -A trust -U postgres -E UTF8 -D "$WORK/pg/data" >/dev/null
        PG_DATA=$WORK/pg/data
        runuser -u postgres -- "$PG_BINDIR/pg_ctl" -w -t 60 -D "$PG_DATA" -l "$WORK/pg/log" \
            -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $WORK/pg -c max_connections=300 -c fsync=on -c synchronous_commit=on" \
            start >/dev/null
        ADMIN_URL=postgres://postgres@127.0.0.1:$PG_PORT/postgres
        say "throwaway PostgreSQL on 127.0.0.1:$PG_PORT"
    fi
    [[ $ADMIN_URL != *\?* ]] || die "IDEM_BENCH_POSTGRES_URL must not carry query parameters"
    PG_URL=${ADMIN_URL%/*}/$BENCH_DB
fi

# --- the cases -----------------------------------------------------------------

ROWS=()
GW_PORT=""
GW_PID=""

start_gateway() { # backend
    local url
    if [[ $1 == sqlite ]]; then
        rm -f "$WORK"/gateway.db*
        url=sqlite://$WORK/gateway.db
    else
        psql "$ADMIN_URL" -qAtc "DROP DATABASE IF EXISTS $BENCH_DB WITH (FORCE)" >/dev/null
        psql "$ADMIN_URL" -qAtc "CREATE DATABASE $BENCH_DB" >/dev/null
        url=$PG_URL
    fi
    GW_PORT=$(free_port)
    RUST_LOG=${RUST_LOG:-info} "$IDEM_BIN" serve --listen "127.0.0.1:$GW_PORT" \
        --database-url "$url" --upstream "http://127.0.0.1:$UP_PORT" \
        >"$WORK/gateway-$1.log" 2>&1 &
    GW_PID=$!
    PIDS+=("$GW_PID")
    wait_http "$GW_PORT" "$GW_PID"
    say "$1: gateway on 127.0.0.1:$GW_PORT"
}

# The contract by hand before any figure: a key forwards once, then replays.
sanity() { # key
    local first second
    first=$(curl -s -D - -o /dev/null -X POST -H 'Content-Type: application/json' \
        -H "Idempotency-Key: $1" --data '{"amount":100,"currency":"EUR"}' \
        "http://127.0.0.1:$GW_PORT/v1/payments" | tr -d '\r')
    second=$(curl -s -D - -o /dev/null -X POST -H 'Content-Type: application/json' \
        -H "Idempotency-Key: $1" --data '{"amount":100,"currency":"EUR"}' \
        "http://127.0.0.1:$GW_PORT/v1/payments" | tr -d '\r')
    [[ $(head -1 <<<"$first") == "HTTP/1.1 201"* ]] || die "first request with key $1: $first"
    ! grep -qi '^idempotent-replayed: true' <<<"$first" || die "first request was a replay: $first"
    [[ $(head -1 <<<"$second") == "HTTP/1.1 201"* ]] || die "second request with key $1: $second"
    grep -qi '^idempotent-replayed: true' <<<"$second" || die "second request not replayed: $second"
}

# case BACKEND PATH C PORT MODE RUN EXPECT(replayed|executed)
measure() {
    local backend=$1 path=$2 c=$3 port=$4 mode=$5 run=$6 expect=$7 r
    say "$backend / $path / c=$c"
    r=$(load "$port" "$c" "$mode" "$run" "$SECONDS_PER_CASE")
    read -r rps p50 p99 rep exe <<<"$r"
    if [[ $expect == replayed && $exe -ne 0 ]] || [[ $expect == executed && $rep -ne 0 ]]; then
        die "$backend / $path / c=$c: $rep replayed and $exe executed answers, expected all $expect"
    fi
    ROWS+=("$backend|$path|$c|$rps|$p50|$p99")
}

warm() { load "$1" 2 "$2" "warm-$3" 1 >/dev/null; }

RUN_ID=$(date +%s)
for backend in $BACKENDS; do
    start_gateway "$backend"
    sanity "sanity-$RUN_ID"
    warm "$UP_PORT" fresh "$backend-up"
    warm "$PROXY_PORT" fresh "$backend-px"
    warm "$GW_PORT" fresh "$backend-gw-$RUN_ID"
    for c in $CONCURRENCY; do
        measure "$backend" "direct" "$c" "$UP_PORT" fresh "d-$RUN_ID-$c" executed
        measure "$backend" "nginx proxy" "$c" "$PROXY_PORT" fresh "p-$RUN_ID-$c" executed
        measure "$backend" "gateway fresh keys" "$c" "$GW_PORT" fresh "f-$RUN_ID-$c" executed
        sanity "r-$RUN_ID-$c"
        measure "$backend" "gateway replays" "$c" "$GW_PORT" fixed "r-$RUN_ID-$c" replayed
    done
    stop "$GW_PID"
    # sqlx's "slow statement" (over 1 s) is latency, which the table shows;
    # anything else logged as a warning or an error makes the figures void.
    if grep -E '\b(WARN|ERROR)\b' "$WORK/gateway-$backend.log" | grep -v 'slow statement' >&2; then
        die "the $backend gateway logged warnings or errors (above)"
    fi
    for name in upstream proxy; do
        if grep -E '\[(error|crit|alert|emerg)\]' "$WORK/nginx-$name/error.log" >&2; then
            die "nginx ($name) logged errors (above)"
        fi
    done
done

# --- pgbench: the gateway's two writes per fresh key, nothing else -------------

if [[ " $BACKENDS " == *" postgres "* && $RUN_PGBENCH == 1 ]]; then
    psql "$PG_URL" -qAtc "DROP TABLE IF EXISTS bench_keys; CREATE TABLE bench_keys (LIKE idem_keys INCLUDING ALL)" >/dev/null
    # The lease claim (sql::INSERT) and the stored answer (sql::COMPLETE) of
    # idem_core::leased, as two autocommit statements.
    cat >"$WORK/fresh.sql" <<'EOF'
INSERT INTO bench_keys (tenant_id, operation, idempotency_key, request_hash, state,
                        locked_until_ms, lock_token, created_at_ms, updated_at_ms, expires_at_ms)
VALUES ('default', 'gateway', gen_random_uuid()::text, decode(repeat('ab', 32), 'hex'), 'pending',
        1800000030000, '6f1c0e0a2b9d4c1e8a7b3c5d9e0f1a2b', 1800000000000, 1800000000000, 1800086400000)
ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING
RETURNING idempotency_key AS k \gset
UPDATE bench_keys SET state = 'completed', status_code = 201,
       response_headers = '[["content-type","application/json"]]',
       response_body = convert_to('{"id":"pay_1","amount":100}', 'UTF8'),
       resource_type = NULL, resource_id = NULL, locked_until_ms = NULL, lock_token = NULL,
       updated_at_ms = 1800000000001
WHERE tenant_id = 'default' AND operation = 'gateway' AND idempotency_key = :k
  AND lock_token = '6f1c0e0a2b9d4c1e8a7b3c5d9e0f1a2b' AND state = 'pending'
  AND expires_at_ms > 1800000000001;
EOF
    for c in $CONCURRENCY; do
        say "postgres / pgbench / c=$c"
        rm -f "$WORK"/pgb.*
        jobs=$((c < 2 ? c : 2))
        out=$(cd "$WORK" && pgbench -n -M prepared -f fresh.sql -c "$c" -j "$jobs" \
            -T "$SECONDS_PER_CASE" -l --log-prefix=pgb "$PG_URL" 2>&1) \
            || die "pgbench failed: $out"
        tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$out")
        failed=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' <<<"$out")
        [[ -n $tps ]] || die "no tps from pgbench: $out"
        [[ ${failed:-0} -eq 0 ]] || die "pgbench: $failed failed transactions: $out"
        read -r p50 p99 < <(cat "$WORK"/pgb.* | awk '{ print $3 }' | sort -n | awk '
            { v[NR] = $1 } END { i50 = int(NR * 0.50); i99 = int(NR * 0.99);
              if (i50 < 1) i50 = 1; if (i99 < 1) i99 = 1; print v[i50], v[i99] }')
        ROWS+=("postgres|pgbench: the two writes alone|$c|$(printf '%.0f' "$tps")|$p50|$p99")
    done
fi

# --- the table -------------------------------------------------------------------

# ratio FIGURE BASELINE PATH: "—" for the pgbench reference or a missing baseline.
ratio() {
    if [[ -n $2 && $3 != pgbench* ]]; then
        awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'
    else
        echo "—"
    fi
}
echo "| backend | path | concurrency | requests/s | p50 | p99 | ratio to direct | ratio to nginx proxy |"
echo "|---|---|---:|---:|---:|---:|---:|---:|"
for row in "${ROWS[@]}"; do
    IFS='|' read -r backend path c rps p50 p99 <<<"$row"
    direct="" proxy=""
    for other in "${ROWS[@]}"; do
        IFS='|' read -r b2 path2 c2 rps2 _ _ <<<"$other"
        [[ $b2 == "$backend" && $c2 == "$c" ]] || continue
        [[ $path2 == direct ]] && direct=$rps2
        [[ $path2 == "nginx proxy" ]] && proxy=$rps2
    done
    echo "| $backend | $path | $c | $rps | $(ms "$p50") | $(ms "$p99") | $(ratio "$rps" "$direct" "$path") | $(ratio "$rps" "$proxy" "$path") |"
done
