#!/usr/bin/env python3
"""The reference polling agent, in Python 3 on Idem's HTTP task API.

Standard library only (no SDK): every request below is plain HTTP + JSON,
as docs/tasks.md describes it. Three modes:

  agent.py poll --idem URL --source URL --poller NAME --queue Q [--interval 0.1]
      Reads the poller's cursor (GET /v1/pollers/NAME), asks the source for
      the changes after it (GET SOURCE/changes?after=N), and reports them as
      one observation: the tasks (key item:{item}:v{version}) and the new
      cursor, in one transaction, only if the cursor is still where it was
      read. Any number of copies may poll one source: a copy that lost the
      race (409 cursor-moved) reads again; each change becomes one task.

  agent.py work --idem URL --queue Q --sink URL --mode verify|at-most-once [--lease 2s]
      Claims one task at a time (fenced, for a lease), asks before notifying
      (POST /v1/tasks/ID/actions/notify), posts the message to a mail sink
      that does NOT deduplicate, with the action's key as the message id,
      reports it, completes. An attempt whose outcome is unknown (a worker
      died between sending and reporting) is checked at the sink by its key
      in verify mode; in at-most-once mode the task is parked for an operator.
      Its claim and ask keys carry a nonce drawn at start (WORKER:NONCE:…):
      restarted under the same --worker, it never passes for the process it
      replaces — a claim of that one is not replayed to it, and an ask under
      a claim that was told go is told unknown (checked at the sink), never
      go. It sends only while the lease the ask's answer reports lasts.

  agent.py source --file changes.jsonl [--listen 127.0.0.1:8090]
      A tiny source for the README tour: serves GET /changes?after=N from a
      JSON-lines file (one {"seq", "item", "version"} a line, re-read on
      every request, so appending a line is a new change).

Every request carries X-Tenant-Id (--tenant, default "agents"). One line per
event goes to stdout.
"""

import argparse
import http.client
import http.server
import json
import os
import random
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

MAX_TASKS = 100  # at most this many tasks per observation (the API's bound)


def log(*parts):
    print(" ".join(str(p) for p in parts), flush=True)


class Api:
    def __init__(self, base, tenant):
        self.base = base.rstrip("/")
        self.tenant = tenant

    def call(self, method, path, body=None, key=None, timeout=5.0):
        """(status, JSON body or None); raises OSError when no answer came."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if self.tenant:
            req.add_header("X-Tenant-Id", self.tenant)
        if key is not None:
            req.add_header("Idempotency-Key", key)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as res:
                return res.status, parse(res.read())
        except urllib.error.HTTPError as e:
            return e.code, parse(e.read())
        except urllib.error.URLError as e:
            raise OSError(str(e.reason)) from e


def parse(raw):
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def seconds(duration):
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for unit in ("ms", "s", "m", "h"):
        if duration.endswith(unit) and duration[: -len(unit)].isdigit():
            return int(duration[: -len(unit)]) * units[unit]
    sys.exit(f"bad duration {duration!r}: write 2s, 500ms, 5m")


# ---------------------------------------------------------------- poll


def poll(args):
    idem = Api(args.idem, args.tenant)
    source = Api(args.source, None)
    while True:
        try:
            poll_once(idem, source, args)
        except OSError as e:
            log("poll error", e)
        time.sleep(args.interval)


def poll_once(idem, source, args):
    status, body = idem.call("GET", f"/v1/pollers/{args.poller}")
    if status == 404:
        cursor = None
    elif status == 200:
        cursor = body["cursor"]
    else:
        log("cursor read failed", status, body)
        return
    after = cursor["after"] if cursor else 0
    status, body = source.call("GET", f"/changes?after={after}")
    if status != 200:
        log("source failed", status)
        return
    changes = sorted(body["changes"], key=lambda c: c["seq"])[:MAX_TASKS]
    if not changes:
        return
    tasks = [
        {
            "queue": args.queue,
            "key": f"item:{c['item']}:v{c['version']}",
            "payload": {"item": c["item"], "version": c["version"]},
        }
        for c in changes
    ]
    value = {"after": changes[-1]["seq"]}
    status, body = idem.call(
        "POST",
        f"/v1/pollers/{args.poller}/observations",
        {"cursor": {"expected": cursor, "value": value}, "tasks": tasks},
    )
    if status == 200:
        log("observed", len(tasks), "after", after, "->", value["after"])
    elif status == 409:
        log("cursor moved", after, "->", (body or {}).get("current"))
    else:
        log("observation refused", status, body)


# ---------------------------------------------------------------- work


class Worker:
    def __init__(self, args):
        self.idem = Api(args.idem, args.tenant)
        self.sink = Api(args.sink, None)
        self.args = args
        self.lease = seconds(args.lease)
        self.margin = seconds(args.send_margin)
        if self.margin >= self.lease:
            sys.exit("--send-margin must be shorter than --lease")
        self.name = args.worker or f"py-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        # This process's own: the same --worker restarted draws another, so
        # its keys are never taken for the keys of the process it replaces.
        self.nonce = uuid.uuid4().hex[:12]
        self.claims = 0
        self.asks = 0

    def claim(self):
        """Claims under one Idempotency-Key, retried (the same key) until an
        answer comes: a claim whose answer was lost is answered again, it
        never claims a second task."""
        self.claims += 1
        key = f"{self.name}:{self.nonce}:claim:{self.claims:04d}"
        body = {"worker": self.name, "lease": self.args.lease, "max": 1}
        while True:
            try:
                status, answer = self.idem.call(
                    "POST", f"/v1/queues/{self.args.queue}/claims", body, key
                )
            except OSError as e:
                log("claim retried", key, e)
                time.sleep(0.2 + random.random() * 0.3)
                continue
            if status == 200:
                return answer["tasks"]
            if status >= 500:
                log("claim retried", key, status)
                time.sleep(0.2)
                continue
            log("claim refused", key, status, answer)
            return []

    def run(self):
        log("worker", self.name, "mode", self.args.mode)
        while True:
            tasks = self.claim()
            if not tasks:
                time.sleep(self.args.interval)
                continue
            for task in tasks:
                try:
                    self.handle(task)
                except OSError as e:
                    log("task dropped", task["id"], e)

    def task_call(self, task, path, body, key=None):
        return self.idem.call("POST", f"/v1/tasks/{task['id']}/{path}", body, key)

    def ask(self, task, body, key):
        """(when it was asked, status, answer): asked under the ask's own
        Idempotency-Key, retried with the same key and body until an answer
        comes — the exact replay of an ask told go is told go again; any
        other ask under the claim, unknown."""
        path = f"/v1/tasks/{task['id']}/actions/notify"
        for _ in range(10):
            asked = time.monotonic()
            try:
                status, answer = self.idem.call("POST", path, body, key)
            except OSError as e:
                log("ask retried", key, e)
                time.sleep(0.2)
                continue
            if status >= 500:
                log("ask retried", key, status)
                time.sleep(0.2)
                continue
            return asked, status, answer
        raise OSError(f"no answer to the ask {key}")

    def handle(self, task):
        fence = task["fence"]
        log("claimed", task["id"], task["key"], "fence", fence)
        ask = {"fence": fence, "mode": self.args.mode}
        self.asks += 1
        ask_key = f"{self.name}:{self.nonce}:ask:{self.asks:04d}"
        for _ in range(3):
            asked, status, answer = self.ask(task, ask, ask_key)
            if status == 409:
                log("lease lost", task["id"], "fence", fence)
                return
            if status != 200:
                log("action refused", task["id"], status, answer)
                return
            decision, key = answer["do"], answer["key"]
            if decision == "go":
                # The lease as the database's clock left it when answering:
                # measured from when this process asked, on its own clock
                # (never compared with the database's), it ends no earlier.
                left = answer.get("lease_remaining_ms") or 0
                if not self.send(task, key, asked + left / 1000):
                    return
                outcome = "done"
            elif decision == "done":
                log("already done", task["id"], key)
                break
            elif self.args.mode == "at-most-once":
                log("parked", task["id"], key, "state", answer["task"]["state"])
                return
            else:
                outcome = self.verify(key)
            # Under the ask's key: a go is given back (not-sent) only by
            # the ask it was told to.
            status, answer = self.task_call(
                task, "actions/notify/result", {"fence": fence, "outcome": outcome}, ask_key
            )
            if status == 409 and (answer or {}).get("type", "").endswith("/attempt-in-flight"):
                # Another ask of this claim was told go and may still send:
                # leave the task; its next claim checks again.
                log("attempt in flight", task["id"], key, "fence", fence)
                return
            if status == 409:
                log("lease lost", task["id"], "fence", fence)
                return
            if status != 200:
                log("result refused", task["id"], status, answer)
                return
            log("reported", task["id"], key, outcome)
            if outcome == "done":
                break
        else:
            log("gave up", task["id"])
            return
        status, answer = self.task_call(
            task, "complete", {"fence": fence, "result": {"notified": key}}
        )
        if status == 200:
            log("completed", task["id"], task["key"], "fence", fence)
        elif status == 409:
            log("lease lost", task["id"], "fence", fence)
        else:
            log("complete refused", task["id"], status, answer)

    def send(self, task, key, deadline):
        """Posts the message; False (nothing sent) when the lease may have
        ended by `deadline` (this process's monotonic clock): past it another
        worker may hold the task and send.

        The request goes out whole but for its last byte; the lease is
        checked; then the last byte. A worker paused between the check and
        that byte cannot send late: the relay drops a request whose body
        takes longer than its body read timeout (run it with one shorter
        than --send-margin), and until the margin is over no other worker
        can hold the task — so the message is accepted before any other
        worker could look for it, or never."""
        message = json.dumps(
            {
                "id": key,
                "to": "ops@example.com",
                "subject": task["key"],
                "body": f"{task['key']} changed: {json.dumps(task['payload'])}",
            }
        ).encode()
        url = urllib.parse.urlsplit(self.args.sink)
        host, port = url.hostname, url.port or 80
        head = (
            f"POST /messages HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(message)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        request = head + message
        with socket.create_connection((host, port), timeout=5) as sock:
            sock.sendall(request[:-1])
            if time.monotonic() > deadline - self.margin:
                log("lease too short to send", task["id"], "fence", task["fence"])
                return False
            sock.sendall(request[-1:])
            answer = b""
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        status_line, _, rest = answer.partition(b"\r\n")
        parts = status_line.split(b" ")
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        body = rest.partition(b"\r\n\r\n")[2]
        if status != 202:
            raise OSError(f"sink answered {status}: {body[:200]!r}")
        log("sent", task["id"], key, "copies", (parse(body) or {}).get("copies"))
        return True

    def verify(self, key):
        status, _ = self.sink.call("GET", f"/messages/{urllib.parse.quote(key)}")
        if status == 200:
            log("verified sent", key)
            return "done"
        if status == 404:
            log("verified not sent", key)
            return "not-sent"
        raise OSError(f"sink lookup answered {status}")


# ---------------------------------------------------------------- source


def serve_source(args):
    path = args.file

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            url = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(url.query)
            try:
                after = int(query.get("after", ["0"])[0])
            except ValueError:
                return self.answer(400, {"error": "after must be an integer"})
            if url.path != "/changes":
                return self.answer(404, {"error": "GET /changes?after=N"})
            changes = []
            with open(path) as f:
                for line in f:
                    if line.strip():
                        change = json.loads(line)
                        if change["seq"] > after:
                            changes.append(change)
            changes.sort(key=lambda c: c["seq"])
            self.answer(200, {"changes": changes[:MAX_TASKS]})

        def answer(self, status, body):
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *_):
            pass

    host, port = args.listen.rsplit(":", 1)
    server = http.server.ThreadingHTTPServer((host, int(port)), Handler)
    log("source", path, "on", args.listen)
    server.serve_forever()


def main():
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    sub = p.add_subparsers(dest="mode_", required=True)
    idem = "Idem's base URL, e.g. http://127.0.0.1:8080"
    tenant = "the X-Tenant-Id the agent sends (default: agents)"
    every = "seconds between rounds when there is nothing to do (default: 0.1)"
    po = sub.add_parser("poll", help="report the source's changes as tasks, with the cursor")
    po.add_argument("--idem", required=True, help=idem)
    po.add_argument("--source", required=True, help="the source's base URL (GET /changes?after=N)")
    po.add_argument("--poller", required=True, help="the poller's name: replicas share one")
    po.add_argument("--queue", required=True, help="the queue the tasks go to")
    po.add_argument("--interval", type=float, default=0.1, help=every)
    po.add_argument("--tenant", default="agents", help=tenant)
    wo = sub.add_parser("work", help="claim tasks, notify once through the sink, complete")
    wo.add_argument("--idem", required=True, help=idem)
    wo.add_argument("--queue", required=True, help="the queue to claim from")
    wo.add_argument("--sink", required=True, help="the mail relay's base URL (idem mail-sink)")
    wo.add_argument("--mode", choices=["verify", "at-most-once"], required=True,
                    help="an unknown earlier attempt: look the key up at the sink (verify) "
                         "or leave the task to an operator (at-most-once)")
    wo.add_argument("--lease", default="2s", help="how long a claim holds a task (default: 2s)")
    wo.add_argument("--worker", help="the worker's name (default: py-<pid>-<random>)")
    wo.add_argument("--send-margin", default="500ms",
                    help="the lease left that a send needs; longer than the relay's body read "
                         "timeout makes a paused worker unable to send late (default: 500ms)")
    wo.add_argument("--interval", type=float, default=0.1, help=every)
    wo.add_argument("--tenant", default="agents", help=tenant)
    so = sub.add_parser("source", help="serve a JSON-lines file of changes (for the tour)")
    so.add_argument("--file", required=True, help="one change a line: {\"seq\", \"item\", \"version\"}")
    so.add_argument("--listen", default="127.0.0.1:8090", help="host:port (default: 127.0.0.1:8090)")
    args = p.parse_args()
    try:
        if args.mode_ == "poll":
            poll(args)
        elif args.mode_ == "work":
            Worker(args).run()
        else:
            serve_source(args)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
