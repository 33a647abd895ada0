"""The load generator: a separate process, N keep-alive HTTP/1.1 connections on loopback.

`python -m bench.load --mode MODE --url URL ...` prints one JSON object on stdout.

Written on asyncio streams with a hand-rolled HTTP/1.1 client rather than threads and httpx:
on a 2-core machine the load generator shares the CPU with the server and PostgreSQL, and
this costs a fraction of what httpx would per request, so it takes less from what it measures.
Every connection is closed-loop: it sends its next request when the previous answer is read.

Modes (bodies are a function of the key, so a replay sends exactly the original request):
- baseline_insert  POST /bench/baseline/rows            new key per request
- baseline_read    GET  /bench/baseline/rows/<key>      keys from --keys-file
- action_new       POST /api/v1/actions                 new key, target and customer per request
- action_replay    POST /api/v1/actions                 keys from --keys-file (already recorded)
- task_new         POST /api/v1/tasks                   a new `noop` task per request
"""

import argparse
import asyncio
import json
import sys
import time
from urllib.parse import quote, urlsplit


def action_body(key):
    """A refund with its own target and customer: no two requests hold each other."""
    return {"action_type": "refund", "target": f"ORD-{key}", "customer": f"CUST-{key}", "decision_id": "bench",
            "params": {"amount": "25.00", "currency": "EUR"}}


def baseline_body(key):
    return {"key": key, "payload": {"target": f"ORD-{key}", "amount": "25.00", "currency": "EUR"}}


class Requests:
    """Builds the raw bytes of each request of a mode."""

    def __init__(self, mode, host, token, prefix, keys):
        self.mode, self.host, self.token, self.prefix, self.keys = mode, host, token, prefix, keys
        self.auth = f"Authorization: Bearer {token}\r\n" if token else ""

    def _raw(self, method, path, body=None, extra=""):
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n{self.auth}{extra}"
        if body is None:
            return (head + "\r\n").encode()
        payload = json.dumps(body, separators=(",", ":")).encode()
        head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        return head.encode() + payload

    def make(self, conn, seq):
        if self.mode in ("baseline_read", "action_replay"):
            key = self.keys[(conn * 7919 + seq) % len(self.keys)]
        else:
            key = f"{self.prefix}-{conn}-{seq}"
        if self.mode == "baseline_insert":
            return self._raw("POST", "/bench/baseline/rows", baseline_body(key))
        if self.mode == "baseline_read":
            return self._raw("GET", f"/bench/baseline/rows/{quote(key, safe='')}")
        if self.mode in ("action_new", "action_replay"):
            return self._raw("POST", "/api/v1/actions", action_body(key), f"Idempotency-Key: {key}\r\n")
        if self.mode == "task_new":
            return self._raw("POST", "/api/v1/tasks", {"workflow": "noop", "input": {}}, f"Idempotency-Key: {key}\r\n")
        raise ValueError(self.mode)


async def read_response(reader):
    """Return (status, keep_alive) after reading one whole response."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    keep_alive = headers.get("connection", "").lower() != "close"
    return status, keep_alive


class Run:
    def __init__(self, args, requests):
        self.args, self.requests = args, requests
        self.started = time.monotonic()
        self.window_start = self.started + args.warmup
        self.window_end = self.window_start + args.duration if args.count is None else float("inf")
        self.issued = 0
        self.latencies = []  # seconds, of answers completed inside the window
        self.statuses = {}
        self.warmup_requests = 0
        self.errors = []
        self.last_done = self.started
        self.first_sent = None

    def _more(self):
        if self.args.count is not None:
            return self.issued < self.args.count
        return time.monotonic() < self.window_end

    async def connection(self, conn):
        url = urlsplit(self.args.url)
        reader = writer = None
        seq = 0
        while self._more():
            self.issued += 1
            if reader is None:
                reader, writer = await asyncio.open_connection(url.hostname, url.port or 80)
            raw = self.requests.make(conn, seq)
            seq += 1
            sent = time.monotonic()
            if self.first_sent is None:
                self.first_sent = sent
            try:
                writer.write(raw)
                status, keep_alive = await read_response(reader)
            except (OSError, asyncio.IncompleteReadError) as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                writer.close()
                reader = writer = None
                if len(self.errors) > 100:
                    return
                continue
            done = time.monotonic()
            self.last_done = done
            if self.args.count is not None or self.window_start <= done < self.window_end:
                self.latencies.append(done - sent)
                self.statuses[status] = self.statuses.get(status, 0) + 1
            elif done < self.window_start:
                self.warmup_requests += 1
            # A connection lives for a few dozen requests: which gunicorn process accepts it is
            # chance, and 16 lifelong connections could all land on one process for a whole round.
            if not keep_alive or seq % self.args.requests_per_connection == 0:
                writer.close()
                reader = writer = None
        if writer is not None:
            writer.close()

    def report(self):
        if self.args.count is not None:
            seconds = self.last_done - (self.first_sent or self.started)
        else:
            seconds = self.args.duration
        done = len(self.latencies)
        ordered = sorted(self.latencies)

        def pct(p):
            return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000, 2) if ordered else None

        return {
            "mode": self.args.mode, "concurrency": self.args.concurrency, "seconds": round(seconds, 3),
            "requests": done, "rps": round(done / seconds, 1) if seconds > 0 else 0.0,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "latency_ms": {"p50": pct(0.50), "p90": pct(0.90), "p99": pct(0.99)},
            "warmup_requests": self.warmup_requests, "transport_errors": len(self.errors),
            "first_errors": self.errors[:3],
        }


async def main_async(args):
    keys = []
    if args.keys_file:
        with open(args.keys_file) as f:
            keys = [line.strip() for line in f if line.strip()]
        if not keys:
            raise SystemExit("no keys in --keys-file")
    url = urlsplit(args.url)
    requests = Requests(args.mode, url.netloc, args.token, args.prefix, keys)
    run = Run(args, requests)
    await asyncio.gather(*(run.connection(i) for i in range(args.concurrency)))
    return run.report()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.load")
    parser.add_argument("--url", required=True)
    parser.add_argument("--mode", required=True,
                        choices=["baseline_insert", "baseline_read", "action_new", "action_replay", "task_new"])
    parser.add_argument("--token", default="")
    parser.add_argument("--prefix", default="k")
    parser.add_argument("--keys-file")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--requests-per-connection", type=int, default=50)
    parser.add_argument("--count", type=int, help="send exactly this many requests (no warm-up), then stop")
    args = parser.parse_args(argv)
    if args.count is not None:
        args.warmup = 0.0
    json.dump(asyncio.run(main_async(args)), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
