"""The peer of `idem bench`: AWS Powertools idempotency with Redis persistence
around the same business insert as the bench's baseline, in PostgreSQL.

One process is one case: N threads, each with its own psycopg connection,
call an `@idempotent_function` whose body inserts one row into
`bench_payments` in its own transaction (BEGIN, INSERT, COMMIT). The key
record lives in Redis, written by Powertools before and after the call: it
is not atomic with the insert (a crash between the commit and the record
leaves a payment a retry makes again).

Protocol with `idem bench` (which counts this process's sends with perf
while the case runs, and only then): after connecting, the script prints
`ready` and the versions it runs (JSON) and waits for a line on stdin; it then runs the case for --secs
seconds, prints one JSON line
{"ops", "secs", "p50_us", "p99_us", "cpu_us", "errors", "executed", "first_error"}
and waits for another line before it closes its connections and exits.

    python powertools_peer.py --postgres-url URL --redis-url redis://127.0.0.1:PORT \
        --mode fresh|replay --threads 8 --secs 5 --run-id 123
"""

import argparse
import json
from importlib import metadata
import resource
import sys
import threading
import time
import warnings
from urllib.parse import urlparse

import psycopg
from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function

try:  # the name the brief of issue 13 uses; deprecated in Powertools 3.x, gone in 4
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
        RedisCachePersistenceLayer as Layer,
    )
except ImportError:  # pragma: no cover - Powertools 4
    from aws_lambda_powertools.utilities.idempotency.persistence.cache import (
        CachePersistenceLayer as Layer,
    )

# Outside Lambda there is no remaining time to register; Powertools warns on
# every call (and then writes no in-progress expiry, as any non-Lambda user
# would get).
warnings.filterwarnings("ignore", message="Couldn't determine the remaining time")
warnings.filterwarnings("ignore", category=DeprecationWarning)

INSERT = "INSERT INTO bench_payments (id, amount) VALUES (%s, %s)"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--postgres-url", required=True)
    p.add_argument("--redis-url", required=True)
    p.add_argument("--mode", choices=["fresh", "replay"], required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--secs", type=float, required=True)
    p.add_argument("--run-id", required=True)
    a = p.parse_args()

    redis = urlparse(a.redis_url)
    layer = Layer(host=redis.hostname, port=redis.port or 6379, ssl=False)
    config = IdempotencyConfig(event_key_jmespath="key", expires_after_seconds=3600)
    local = threading.local()
    executed = [0] * a.threads

    @idempotent_function(data_keyword_argument="payment", persistence_store=layer, config=config)
    def create(payment: dict) -> dict:
        conn = local.conn
        conn.execute(INSERT, (payment["key"], payment["amount"]))
        conn.commit()
        executed[local.tid] += 1
        return {"id": payment["key"], "amount": payment["amount"]}

    prefix = f"pt{a.run_id}-{a.mode}-c{a.threads}"
    replay_key = f"{prefix}-replay"
    conns = [psycopg.connect(a.postgres_url) for _ in range(a.threads)]
    # The replayed key is stored before the case; the first call executes.
    local.conn, local.tid = conns[0], 0
    if a.mode == "replay":
        create(payment={"key": replay_key, "amount": 100})
        executed[0] = 0
    # Redis answers before the case starts.
    server = layer.client.info("server").get("redis_version", "?")

    start = threading.Barrier(a.threads + 1)
    results = [None] * a.threads
    errors = [0] * a.threads
    first_error = [None]

    def worker(tid: int) -> None:
        local.conn, local.tid = conns[tid], tid
        lat = []
        n = 0
        start.wait()
        deadline = time.perf_counter() + a.secs
        while True:
            t = time.perf_counter()
            if t >= deadline:
                break
            n += 1
            key = replay_key if a.mode == "replay" else f"{prefix}-t{tid}-{n}"
            try:
                out = create(payment={"key": key, "amount": 100})
                if out.get("id") != key:
                    raise RuntimeError(f"unexpected answer {out!r}")
            except Exception as e:  # noqa: BLE001 - counted and reported
                errors[tid] += 1
                if first_error[0] is None:
                    first_error[0] = f"{type(e).__name__}: {e}"
                continue
            lat.append(time.perf_counter() - t)
        results[tid] = lat

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(a.threads)]
    for t in threads:
        t.start()
    versions = {
        "python": sys.version.split()[0],
        "aws-lambda-powertools": metadata.version("aws-lambda-powertools"),
        "redis-py": metadata.version("redis"),
        "psycopg": metadata.version("psycopg"),
        "redis-server": server,
    }
    print("ready", json.dumps(versions), flush=True)
    if not sys.stdin.readline():
        return 2
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    start.wait()
    for t in threads:
        t.join()
    secs = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    lat = sorted(x for r in results for x in r)

    def pct(q: float) -> float:
        if not lat:
            return 0.0
        return lat[min(int(len(lat) * q), len(lat) - 1)] * 1e6

    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(
        json.dumps(
            {
                "ops": len(lat),
                "secs": secs,
                "p50_us": pct(0.50),
                "p99_us": pct(0.99),
                "cpu_us": cpu * 1e6,
                "errors": sum(errors),
                "executed": sum(executed),
                "first_error": first_error[0],
            }
        ),
        flush=True,
    )
    sys.stdin.readline()
    for c in conns:
        c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
