"""The routing tier of a ledger split by customer over several Surety deployments: the path past
one primary that docs/scale.md chooses, built far enough to be tested on two databases.

Each shard is a whole Surety (its own PostgreSQL, Redis, workers and sweeper) that holds some
customers' actions and tasks; the reference data (agents, grants, limits, people) is the same on
every shard. This WSGI app stands in front of them and sends each agent request to its shard,
through a directory: one PostgreSQL table of the names placed so far and the shard each is on.

- A request's **key** (`Idempotency-Key`) is placed with its first request. A later request under
  the key goes to the key's shard whatever its body says, so a replay finds its action there and a
  reuse with another body is answered there `422 idempotency_key_reused`, as on one database.
- A new key goes to the shard of its **subjects**, its customer and its target: the same-subject
  hold and the one-effect rules look only at the shard they run on, so every action on a customer
  and every action on a target must be on one shard. Subjects not yet placed are placed there; a
  request none of whose subjects is placed goes to its customer's hash (its target's without one).
- A request whose customer and target are already placed on two different shards cannot keep
  those rules: it is refused, `409 shard_conflict`, and nothing is placed or written anywhere.
  (A room booked by customers of two shards is one: docs/scale.md says what bookings need.)

A name, once placed, never moves (no UPDATE here), so a placement read is true for good. Reads
by key (`GET /api/v1/actions/{key}`, `/api/v1/tasks/{id}`) go to the key's shard; anything else,
and a key never placed, goes to shard 0, which answers as one Surety would (`404` for the key).

Configuration: `SHARD_URLS`, the shards' base URLs in shard order, comma-separated (their order is
the hash's, so it never changes once names are placed); `SHARD_DIRECTORY_URL`, the directory's
PostgreSQL database. Run it with `gunicorn sharding.router:app`.
"""

import hashlib
import json
import os
from functools import cache
from urllib.parse import unquote, urlsplit

import httpx
import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

PROBLEM_TYPE = "https://surety.dev/problems/"
ACTIONS, TASKS = "/api/v1/actions", "/api/v1/tasks"
# Not passed on either way: they describe one connection, not the request.
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade", "te", "trailer"}
TIMEOUT = httpx.Timeout(35.0, connect=2.0)  # above a GET's longest ?wait=30
PLACEMENTS = """CREATE TABLE IF NOT EXISTS shard_placement (
    name text PRIMARY KEY,
    shard smallint NOT NULL CHECK (shard >= 0),
    placed_at timestamptz NOT NULL DEFAULT now())"""


class Conflict(Exception):
    """The request's subjects are placed on two shards."""


def hashed_shard(name, shards):
    """A name's shard by hash: stable across processes and releases (not Python's hash())."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big") % shards


def names(kind, key, body):
    """The directory names of a POST: its key's, then its subjects' (the customer first, whose
    hash places a request none of them is placed for). A body the router cannot read has none:
    its key is placed on shard 0, which answers it (`400` if it is not one Surety reads either)."""
    if kind == "task":
        given = body.get("input") if isinstance(body, dict) else None
        customer, target = (given.get("customer") if isinstance(given, dict) else None), None
    else:
        customer, target = (body.get("customer"), body.get("target")) if isinstance(body, dict) else (None, None)
    subjects = [f"{name}:{value}" for name, value in (("customer", customer), ("target", target))
                if isinstance(value, str) and value]
    return f"{kind}:{key}", subjects


def place(conn, key_name, subjects, shards):
    """The shard for a POST, its key and subjects placed there, committed. The key's shard if it
    is placed; else its subjects' (Conflict if they disagree), else the first subject's hash, else
    shard 0. Inserts that lose to another request's placing a name meanwhile are read again and
    decided anew."""
    while True:
        with conn.transaction():
            placed = dict(conn.execute("SELECT name, shard FROM shard_placement WHERE name = ANY(%s)",
                                       [[key_name, *subjects]]).fetchall())
            if key_name in placed:
                return placed[key_name]
            found = set(placed.values())
            if len(found) > 1:
                raise Conflict(placed)
            shard = found.pop() if found else hashed_shard(subjects[0], shards) if subjects else 0
            # In one order, so that two requests placing the same names wait rather than deadlock.
            for name in sorted({key_name, *subjects} - placed.keys()):
                conn.execute("INSERT INTO shard_placement (name, shard) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                             [name, shard])
            now = dict(conn.execute("SELECT name, shard FROM shard_placement WHERE name = ANY(%s)",
                                    [[key_name, *subjects]]).fetchall())
            if set(now.values()) == {shard}:
                return shard
            # Another request placed one of these names elsewhere while this one looked: this
            # one's placements are rolled back, and it decides again from what is placed now.
            raise psycopg.Rollback


def placed_shard(conn, name):
    row = conn.execute("SELECT shard FROM shard_placement WHERE name = %s", [name]).fetchone()
    return row[0] if row else 0


def problem(status, code, title, detail, headers=()):
    body = {"type": PROBLEM_TYPE + code, "title": title, "status": status, "detail": detail, "code": code}
    return status, [("Content-Type", "application/problem+json"), *headers], json.dumps(body).encode()


class Router:
    def __init__(self, shard_urls, directory_url):
        self.shards = shard_urls
        self.http = httpx.Client(timeout=TIMEOUT)
        # Connections kept, and checked as they are handed out: with one opened per request, a
        # routed request took 11-12 ms where a direct one took 3-4 ms; kept, 6 ms (one client
        # in turn; bench/sharded.py has the figures under load).
        self.directory = ConnectionPool(directory_url, min_size=1, max_size=16, kwargs={"autocommit": True},
                                        check=ConnectionPool.check_connection, open=True)
        with self.directory.connection() as conn:
            conn.execute(PLACEMENTS)

    def __call__(self, environ, start_response):
        status, headers, body = self.route(environ)
        start_response(f"{status} {httpx.codes.get_reason_phrase(status)}", headers)
        return [body]

    def route(self, environ):
        # The path as sent, not WSGI's decoded PATH_INFO: a key's encoded "/" stays in the key.
        raw = environ.get("RAW_URI") or environ.get("REQUEST_URI") or environ["PATH_INFO"]
        path, query = urlsplit(raw).path, environ.get("QUERY_STRING", "")
        method = environ["REQUEST_METHOD"]
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        try:
            shard = self.shard_for(method, path, environ, body)
        except Conflict as exc:
            placed = ", ".join(f"{name} on shard {shard}" for name, shard in sorted(exc.args[0].items()))
            return problem(409, "shard_conflict", "The request's customer and target are on two shards",
                           f"This ledger is split by customer, and {placed}: no shard sees every action the "
                           "same-subject hold must see. Nothing was recorded.")
        except (psycopg.OperationalError, PoolTimeout):
            return problem(503, "directory_unavailable", "The shards' directory does not answer",
                           "Nothing was recorded; retry with the same key.", [("Retry-After", "1")])
        return self.forward(shard, method, path, query, environ, body)

    def shard_for(self, method, path, environ, body):
        kind = {ACTIONS: "action", TASKS: "task"}.get(path.rstrip("/"))
        key = environ.get("HTTP_IDEMPOTENCY_KEY")
        with self.directory.connection() as conn:
            if method == "POST" and kind and key:
                try:
                    given = json.loads(body)
                except ValueError:
                    given = None
                return place(conn, *names(kind, key, given), len(self.shards))
            for prefix, kind in ((ACTIONS + "/", "action"), (TASKS + "/", "task")):
                if method == "GET" and path.startswith(prefix) and len(path) > len(prefix):
                    return placed_shard(conn, f"{kind}:{unquote(path.removeprefix(prefix))}")
        return 0

    def forward(self, shard, method, path, query, environ, body):
        headers = {name[5:].replace("_", "-").title(): value for name, value in environ.items()
                   if name.startswith("HTTP_") and name[5:].replace("_", "-").lower() not in HOP_BY_HOP}
        if environ.get("CONTENT_TYPE"):
            headers["Content-Type"] = environ["CONTENT_TYPE"]
        url = self.shards[shard] + path + (f"?{query}" if query else "")
        try:
            answer = self.http.request(method, url, headers=headers, content=body)
        except httpx.TransportError:
            # The shard may have recorded it: a retry with the same key reaches the same shard,
            # whose ledger answers it as any retry (the key's placement is committed).
            return problem(503, "shard_unavailable", f"Shard {shard} does not answer",
                           "Retry with the same key.", [("Retry-After", "1")])
        kept = [(k, v) for k, v in answer.headers.multi_items() if k.lower() not in HOP_BY_HOP]
        return answer.status_code, [*kept, ("Surety-Shard", str(shard))], answer.content


@cache
def _router():
    return Router([u.rstrip("/") for u in os.environ["SHARD_URLS"].split(",")], os.environ["SHARD_DIRECTORY_URL"])


def app(environ, start_response):
    return _router()(environ, start_response)
