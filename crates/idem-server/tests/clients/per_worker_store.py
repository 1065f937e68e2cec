"""One worker of a payments API whose idempotency store lives in its process.

Usage: per_worker_store.py PORT DATABASE

What ``fastapi-idempotency`` with an in-memory store under ``uvicorn
--workers 2`` is (its README warns about it): each worker process keeps the
keys it has seen in its own memory, while the payments go to one shared
database. Start it twice on one PORT: both bind it with ``SO_REUSEPORT``, and
the kernel hands each new connection to one of them (``gunicorn
--reuse-port`` does the same). One worker alone is a correct server.

On its own keys a worker is right: a replay answers the stored answer with
``Idempotent-Replayed: true``, another payload under a used key ``422``, a
key in flight ``409``, a missing or malformed key ``400``.

- ``POST /v1/payments`` (``Idempotency-Key`` required): one row in
  ``payments`` for the body's ``customer``;
- ``GET /v1/payments?customer=C``: ``{"data": [...]}``, that customer's
  payments, from the shared database;
- ``GET /healthz``: ``{"worker": PID}``.

Every request is recorded in ``requests`` (customer, method, the client's
port, the worker's pid): the test reads the database itself, the server's own
count of effects and of the connections requests came on. Standard library
only.
"""

import json
import os
import socket
import sqlite3
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

PORT = int(sys.argv[1])
DATABASE = sys.argv[2]
WORKER = os.getpid()

# This process's own store: key -> ("in-flight",) or ("done", fingerprint, body).
KEYS = {}
LOCK = threading.Lock()


def db():
    conn = sqlite3.connect(DATABASE, timeout=30, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 30000")
    return conn


def init():
    conn = db()
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS payments"
        " (id INTEGER PRIMARY KEY, customer TEXT NOT NULL, worker INTEGER NOT NULL)"
    )
    conn.execute(
        "CREATE TABLE IF NOT EXISTS requests (customer TEXT, method TEXT,"
        " client_port INTEGER, worker INTEGER)"
    )
    conn.close()


def canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        pass

    def answer(self, status, value, replayed=False, raw=None):
        body = raw if raw is not None else json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if replayed:
            self.send_header("Idempotent-Replayed", "true")
        self.end_headers()
        self.wfile.write(body)

    def record(self, customer):
        conn = db()
        conn.execute(
            "INSERT INTO requests VALUES (?, ?, ?, ?)",
            (customer, self.command, self.client_address[1], WORKER),
        )
        conn.close()

    def do_GET(self):
        url = urlsplit(self.path)
        if url.path == "/healthz":
            return self.answer(200, {"worker": WORKER})
        if url.path != "/v1/payments":
            return self.answer(404, {"title": "not found"})
        customer = parse_qs(url.query).get("customer", [""])[0]
        self.record(customer)
        conn = db()
        rows = conn.execute(
            "SELECT id, customer FROM payments WHERE customer = ? ORDER BY id",
            (customer,),
        ).fetchall()
        conn.close()
        data = [{"id": "pay_%d" % i, "customer": c} for i, c in rows]
        self.answer(200, {"data": data})

    def do_POST(self):
        if urlsplit(self.path).path != "/v1/payments":
            return self.answer(404, {"title": "not found"})
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(min(length, 1 << 20))
        try:
            payload = json.loads(raw)
            customer = str(payload["customer"])
        except (ValueError, KeyError, TypeError):
            return self.answer(400, {"title": "the body is not a payment"})
        self.record(customer)
        keys = self.headers.get_all("Idempotency-Key") or []
        if len(keys) != 1:
            return self.answer(400, {"title": "one Idempotency-Key, please"})
        key = keys[0]
        if not key or len(key) > 255 or any(ord(c) < 32 for c in key):
            return self.answer(400, {"title": "a malformed Idempotency-Key"})
        fingerprint = canonical(payload)
        with LOCK:
            entry = KEYS.get(key)
            if entry is None:
                KEYS[key] = ("in-flight",)
        if entry is not None:
            if entry[0] == "in-flight":
                return self.answer(409, {"title": "in flight"})
            if entry[1] != fingerprint:
                return self.answer(422, {"title": "another request under this key"})
            return self.answer(201, None, replayed=True, raw=entry[2])
        time.sleep(0.02)
        conn = db()
        cur = conn.execute(
            "INSERT INTO payments (customer, worker) VALUES (?, ?)", (customer, WORKER)
        )
        conn.close()
        body = json.dumps(
            {"id": "pay_%d" % cur.lastrowid, "customer": customer, "status": "succeeded"}
        ).encode()
        with LOCK:
            KEYS[key] = ("done", fingerprint, body)
        try:
            self.answer(201, None, raw=body)
        except OSError:
            pass  # the client went away; the answer is stored


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a connection the drill's proxy cut on purpose

    def server_bind(self):
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()


if __name__ == "__main__":
    init()
    Server(("127.0.0.1", PORT), Handler).serve_forever()
