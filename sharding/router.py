"""The routing tier of a ledger split by customer over several Surety deployments: the path past
one primary that docs/scale.md chooses, built far enough to be tested on two databases.

Each shard is a whole Surety (its own PostgreSQL, Redis, workers and sweeper) that holds some
customers' actions and tasks; the reference data (agents, grants, limits, people) must be the
same on every shard. This WSGI app stands in front of the shards' agents' API (`/api/v1/`; people
work each shard's pages, and each shard's connectors take their providers' webhooks at its own
address) and sends each request to its shard, through a directory: one PostgreSQL table of the
names placed so far and the shard each is on.

- A request's **key** (`Idempotency-Key`) is placed with it. A later request under the key goes to
  the key's shard, so a replay finds its action there and a reuse with another body is answered
  there `422 idempotency_key_reused`, as on one database. A key a shard makes from another goes
  by that one's name: a task's step's (`<task id>:<step>:v<n>`) by its task's id, an edit's version
  (`<key>~v<n>`) by its original's key. A request under one, before or after what it derives from,
  so reaches the shard that made the key or will, whose uniqueness answers it.
- A new key goes to the shard of its **subjects**, its customer and its target (a task's: its
  customer and the targets its steps act on, a refund's order and its confirmation's address): the
  same-subject hold and the one-effect rules look only at the shard they run on, so every action
  on a customer and every action on a target must be on one shard. Subjects not yet placed are
  placed there; a request none of whose names is placed goes to its customer's hash (its target's
  without one).
- A request any of whose names is placed on another shard than the rest cannot keep those rules:
  it is refused, `409 shard_conflict`, and nothing is placed or written anywhere. (A room booked by
  customers of two shards is one: docs/scale.md says what bookings need.) Unless its key's shard
  holds the key's action or task: nothing new can be recorded under the key there, so that shard
  answers it as one database would (422, or 410 past the key's lifetime).
- Placements are committed before the request is forwarded, so that whatever the shard records is
  placed whatever happens to the router or its directory afterwards. A `4xx` records nothing (the
  contract's rule), so the request then takes back the placements it made, unless another request
  has leaned on them meanwhile (`used`, set in that request's own placing, over every name it
  wants): an unauthenticated or refused request pins nothing another request did not take up.
- A request the router cannot read as the shard would (not JSON, a key or subject Surety refuses)
  goes unplaced to its key's shard if the key is placed, else to shard 0: either answers it `400`
  as one Surety would, or `410` under a key past its lifetime.
- A ledger that ran alone is placed on shard 0 by `python -m sharding.fill` before the router
  serves in front of it.

A name, once placed, never moves (the directory's trigger refuses it), so a placement read is true
for good. Reads by key (`GET /api/v1/actions/{key}`, its `/evidence`, `/api/v1/tasks/{id}`) go to
the key's shard (a step's is its task's, a version's its original's); a key never placed here (one
recorded straight into a shard) is asked of each shard in turn; if none has it and one failed, the
answer is that shard's 5xx (503 if it did not answer), not 404. Anything else under `/api/v1/` goes
to shard 0.

Configuration: `SHARD_URLS`, the shards' base URLs in shard order, comma-separated (their order is
the hash's, so it never changes once names are placed); `SHARD_DIRECTORY_URL`, the directory's
PostgreSQL database. Run it with `gunicorn sharding.router:app`.
"""

import hashlib
import json
import os
import re
import threading
import uuid
from decimal import Decimal
from urllib.parse import unquote, urlsplit

import httpx
import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from config.wsgi import UnreadableBody, read_chunked
from ledger.api.wire import problem_body, well_formed_key
from ledger.key_paths import key_segment
from ledger.recipients import customer_spelling, email_recipient

API, ACTIONS, TASKS = "/api/v1/", "/api/v1/actions", "/api/v1/tasks"
MAX_BODY = 64 * 1024  # the API's own limit (API_MAX_BODY_BYTES)
# Not passed on either way: they describe one connection, not the request. (httpx asks for and
# decodes compressed answers itself, so the shard's Content-Encoding no longer holds.)
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade", "te", "trailer",
              "accept-encoding", "content-encoding"}
TIMEOUT = httpx.Timeout(35.0, connect=2.0)  # above a GET's longest ?wait=30
# `owner`: the request that placed the name; `used`: another request was routed by it, so the owner
# may no longer take it back. The database holds both rules: a row's only change is being marked
# used, and only a row not used may be deleted (its owner's taking back).
PLACEMENTS = """CREATE TABLE IF NOT EXISTS shard_placement (
    name text PRIMARY KEY,
    shard smallint NOT NULL CHECK (shard >= 0),
    owner uuid NOT NULL,
    used boolean NOT NULL DEFAULT false,
    placed_at timestamptz NOT NULL DEFAULT now());
CREATE OR REPLACE FUNCTION shard_placement_kept() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.used AND (NEW.name, NEW.shard, NEW.owner, NEW.placed_at)
                                         = (OLD.name, OLD.shard, OLD.owner, OLD.placed_at) THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'DELETE' AND NOT OLD.used THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION USING MESSAGE = 'a placement never moves, and one a request was routed by stays: '
                                    || TG_OP || ' of ' || OLD.name || ' refused',
                          ERRCODE = 'insufficient_privilege';
END $$;
CREATE OR REPLACE TRIGGER shard_placement_kept BEFORE UPDATE OR DELETE ON shard_placement
    FOR EACH ROW EXECUTE FUNCTION shard_placement_kept()"""
# What the router must know of the workflows (ledger/workflows/), written here as it runs without
# Django (tests/sharding/test_router_names.py holds them to the workflows' own): every workflow's
# effect steps, whose actions a shard makes under `<task id>:<step>:v<n>` (Step.key), and where a
# refund task's confirmation goes without `notify` (refund.default_recipient).
EFFECT_STEPS = ("call_refund_api", "notify_customer")
CUSTOMERS_AT = "@customers.surety.example"
STEP_KEY = re.compile(rf"(.+):(?:{'|'.join(EFFECT_STEPS)}):v[0-9]+")
# An edit's version's key: its original's and ~v2, ~v3 (ledger.versions.version_key makes no other).
VERSION = re.compile(r"~v(?:[2-9]|[1-9][0-9]+)$")
CREATING = 7_320_001  # an advisory lock: routers starting at once create the table in turn


class Conflict(Exception):
    """The request's names are placed on two shards."""


class Unreadable(Exception):
    """Not a request the router can place: Surety refuses it as it stands."""


def hashed_shard(name, shards):
    """A name's shard by hash: stable across processes and releases (not Python's hash())."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big") % shards


def stored(value, spell=str.strip):
    """A target or customer as the shard stores it (DRF's CharField, max 255: a whole number as
    its digits, in its field's spelling `spell`: whitespace stripped, a customer's
    customer_spelling), its length checked after the spelling, as the field checks it (NFKC may
    shorten or lengthen a customer); "" for none; Unreadable for what the shard refuses."""
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise Unreadable(value)
    text = spell(str(value))
    if len(text) > 255 or "\x00" in text or any("\ud800" <= ch <= "\udfff" for ch in text):
        raise Unreadable(value)
    return text


def key_name(kind, key):
    """The directory name of a request under `key`: the name of what the key belongs to. A key the
    shard makes from another goes with it, so that a request under it, before or after, reaches
    the shard that made it or will, where the key's uniqueness answers it as one database does: an
    edit's version goes by its original's key, and a task's step's key by its task's id."""
    if kind == "task":
        return f"task:{key}"
    original = VERSION.sub("", key)
    step = STEP_KEY.fullmatch(original)
    return f"task:{step[1]}" if step else f"action:{original}"


def task_targets(workflow, given, customer):
    """The targets of a task's effects, as its steps record them from its input as the shard
    stores it: a refund's order, and the address its confirmation goes to (`notify`, else the
    customer's at CUSTOMERS_AT, ledger/workflows/refund.py). Placed with the task, a direct action
    on either shares its shard."""
    if workflow != "refund":
        return []
    recipient = stored(given.get("notify")) or (f"{customer.lower()}{CUSTOMERS_AT}" if customer else "")
    return [stored(given.get("order_id")), email_recipient(recipient)]


def names(kind, key, body):
    """The directory names of a POST: its key's, then its subjects' (the customer first, whose
    hash places a request none of them is placed for)."""
    if not well_formed_key(key) or not isinstance(body, dict):
        raise Unreadable(key)
    if kind == "task":
        given = body.get("input") if isinstance(body.get("input"), dict) else {}
        customer = stored(given.get("customer"), customer_spelling)
        targets = task_targets(stored(body.get("workflow")), given, customer)
    else:
        customer, target = stored(body.get("customer"), customer_spelling), stored(body.get("target"))
        params = body.get("params") if isinstance(body.get("params"), dict) else {}
        if body.get("action_type") == "send_message" and params.get("channel") == "email":
            target = email_recipient(target)  # as the API stores it: one spelling, one shard
        targets = [target]
    subjects = [f"customer:{customer}"] if customer else []
    return key_name(kind, key), subjects + [f"target:{target}" for target in targets if target]


def place(conn, key_name, subjects, shards, owner):
    """The shard for a POST, its key and subjects placed there by `owner`, committed: the shard any
    of them is placed on (Conflict if two), else the first subject's hash, else shard 0. Names
    others placed are marked used, so their owners cannot take them back. Inserts that lose to
    another request's placing a name meanwhile, or names taken back meanwhile, are decided anew."""
    wanted = [key_name, *subjects]
    while True:
        with conn.transaction():
            placed = dict(conn.execute("SELECT name, shard FROM shard_placement WHERE name = ANY(%s)",
                                       [wanted]).fetchall())
            if len(set(placed.values())) > 1:
                raise Conflict(placed)
            shard = next(iter(placed.values()), None)
            if shard is None:
                shard = hashed_shard(subjects[0], shards) if subjects else 0
            # In one order, so that two requests placing the same names wait rather than deadlock.
            for name in sorted(set(wanted) - placed.keys()):
                conn.execute("INSERT INTO shard_placement (name, shard, owner) VALUES (%s, %s, %s) "
                             "ON CONFLICT DO NOTHING", [name, shard, owner])
            # After the inserts, over every name: one another request placed since the first read
            # (this insert then did nothing) is leaned on too. Locks them until this commits: an
            # owner's taking back waits, then finds them used.
            conn.execute("UPDATE shard_placement SET used = true WHERE name = ANY(%s) AND owner <> %s AND NOT used",
                         [wanted, owner])
            now = dict(conn.execute("SELECT name, shard FROM shard_placement WHERE name = ANY(%s)",
                                    [wanted]).fetchall())
            if now.keys() == set(wanted) and set(now.values()) == {shard}:
                return shard
            # Another request placed one of these names elsewhere, or took one back, while this
            # one looked: this one's marks and placements are rolled back, and it decides again.
            raise psycopg.Rollback


def create_directory(conn):
    """The directory's table and its trigger, made once: routers starting at once make them in turn."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [CREATING])
        conn.execute(PLACEMENTS)


def take_back(conn, owner):
    """A refused request's placements, unless another request was routed by them meanwhile."""
    conn.execute("DELETE FROM shard_placement WHERE owner = %s AND NOT used", [owner])


def problem(status, code, title, detail, headers=()):
    body = problem_body(status, code, title, detail)
    return status, [("Content-Type", "application/problem+json"), *headers], json.dumps(body).encode()


def unavailable(title):
    return problem(503, "shard_unavailable", title, "Retry with the same key.", [("Retry-After", "1")])


class Router:
    def __init__(self, shard_urls, directory_url):
        self.shards = shard_urls
        self.http = httpx.Client(timeout=TIMEOUT)
        # Connections kept, and checked as they are handed out: with one opened per request, a
        # routed request took 11-12 ms where a direct one took 3-4 ms; kept, 6 ms (one client
        # in turn; bench/sharded.py has the figures under load).
        self.directory = ConnectionPool(directory_url, min_size=1, max_size=16, kwargs={"autocommit": True},
                                        check=ConnectionPool.check_connection, open=True)
        try:
            with self.directory.connection() as conn:
                create_directory(conn)
        except Exception:
            self.directory.close()
            raise

    def __call__(self, environ, start_response):
        status, headers, body = self.route(environ)
        start_response(f"{status} {httpx.codes.get_reason_phrase(status)}",
                       [*headers, ("Content-Length", str(len(body)))])
        return [body]

    def route(self, environ):
        # The path as sent, not WSGI's decoded PATH_INFO: a key's encoded "/" stays in the key.
        raw = environ.get("RAW_URI") or environ.get("REQUEST_URI") or environ["PATH_INFO"]
        path, method = urlsplit(raw).path, environ["REQUEST_METHOD"]
        if not path.startswith(API) or not canonical(path):
            return problem(404, "not_found", "Not found", "The shards' router serves the agents' API only, "
                           "at paths written as Django routes them.")
        try:
            # A body sent chunked, as the shards read one: given its length, past MAX_BODY refused here.
            read_chunked(environ, MAX_BODY)
        except UnreadableBody:
            return problem(400, "invalid", UnreadableBody.title, UnreadableBody.detail)
        if int(environ.get("CONTENT_LENGTH") or 0) > MAX_BODY:
            return problem(400, "invalid", "Invalid request", f"The body is larger than {MAX_BODY // 1024} KiB.")
        request = Request(environ, path, environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)))
        kind = {ACTIONS: "action", TASKS: "task"}.get(path.rstrip("/"))
        try:
            if method == "POST" and kind:
                return self.post(kind, request)
            if method == "GET" and (name := read_name(path)):
                return self.read(name, request)
        except (psycopg.OperationalError, PoolTimeout):
            return unavailable("The shards' directory does not answer")
        return self.forward(0, request)

    def post(self, kind, request):
        key = request.environ.get("HTTP_IDEMPOTENCY_KEY")
        try:
            wanted = names(kind, key, json.loads(request.body.decode(), parse_float=Decimal, parse_constant=refuse))
        except (Unreadable, ValueError, RecursionError):
            # Refused as written, by the key's shard if it has one: there a key past its lifetime
            # is answered 410 whatever the body, as by one Surety (docs/contract.md); else shard 0.
            return self.forward(self.key_shard(kind, key), request)
        owner = uuid.uuid4()
        try:
            with self.directory.connection() as conn:
                shard = place(conn, *wanted, len(self.shards), owner)
        except Conflict as exc:
            return self.conflict(kind, key, exc.args[0], request)
        answer = self.forward(shard, request)
        if 400 <= answer[0] < 500:  # the shard recorded nothing: the request's placements go too
            try:
                with self.directory.connection() as conn:
                    take_back(conn, owner)
            except (psycopg.OperationalError, PoolTimeout):
                pass  # left placed: pinned where nothing is recorded, which loses no effect
        return answer

    def key_shard(self, kind, key):
        """The shard a well-formed key is placed on, else shard 0."""
        if not well_formed_key(key):
            return 0
        with self.directory.connection() as conn:
            row = conn.execute("SELECT shard FROM shard_placement WHERE name = %s", [key_name(kind, key)]).fetchone()
        return row[0] if row else 0

    def conflict(self, kind, key, placed, request):
        """A request whose names are on two shards. If one is its key's, and that shard holds what
        the key names, it can record nothing new under the key: it answers the reuse (or the key's
        expiry) as one Surety would. Else nothing could keep the request's subjects together: 409."""
        shard = placed.get(key_name(kind, key))
        if shard is not None and self.holds(shard, kind, key, request):
            return self.forward(shard, request)
        names_placed = ", ".join(f"{name} on shard {on}" for name, on in sorted(placed.items()))
        return problem(409, "shard_conflict", "The request's names are on two shards",
                       f"This ledger is split by customer, and {names_placed}: no shard sees every action "
                       "the same-subject hold must see. Nothing was recorded.")

    def holds(self, shard, kind, key, request):
        """Whether `shard` has this agent's action or task under the key, or its archived key (a
        read of it answers 200 or 410). A key placed but never recorded (its request's router died
        mid-forward) would otherwise let the shard record the request under it there."""
        path = f"{ACTIONS if kind == 'action' else TASKS}/{key_segment(key)}"
        headers = {k: v for k, v in request.headers().items() if k != "Content-Type"}
        try:
            answer = self.http.get(self.shards[shard] + path, headers=headers, extensions={"target": path.encode()})
        except httpx.TransportError:
            return False
        return answer.status_code in (200, 410)

    def read(self, name, request):
        with self.directory.connection() as conn:
            row = conn.execute("SELECT shard FROM shard_placement WHERE name = %s", [name]).fetchone()
        if row:
            return self.forward(row[0], request)
        # Asked of each shard: the first that has it answers; a shard that fails leaves the
        # answer unknown (its 5xx) rather than "not found".
        missing = failed = None
        for shard in range(len(self.shards)):
            answer = self.forward(shard, request)
            if answer[0] >= 500:
                failed = failed or answer
            elif answer[0] == 404:
                missing = missing or answer
            else:
                return answer
        return failed or missing

    def forward(self, shard, request):
        url = self.shards[shard] + request.raw
        try:
            # The target exactly as sent: httpx would otherwise normalise the path it is given.
            answer = self.http.request(request.method, url, headers=request.headers(), content=request.body,
                                       extensions={"target": request.raw.encode()})
        except httpx.TransportError:
            # The shard may have recorded it: its placements are kept (the caller commits), and a
            # retry with the same key reaches the same shard, whose ledger answers it as any retry.
            return unavailable(f"Shard {shard} does not answer")
        kept = [(k, v) for k, v in answer.headers.multi_items() if k.lower() not in HOP_BY_HOP]
        return answer.status_code, [*kept, ("Surety-Shard", str(shard))], answer.content


class Request:
    """What is forwarded: the method, the path and query as sent, the end-to-end headers with the
    client's address added to X-Forwarded-For, and the body."""

    def __init__(self, environ, path, body):
        self.environ, self.method, self.body = environ, environ["REQUEST_METHOD"], body
        query = environ.get("QUERY_STRING", "")
        self.raw = path + (f"?{query}" if query else "")

    def headers(self):
        # Values as the client's bytes (WSGI hands them over as latin-1 text).
        headers = {name[5:].replace("_", "-").title(): value.encode("latin-1") for name, value in self.environ.items()
                   if name.startswith("HTTP_") and name[5:].replace("_", "-").lower() not in HOP_BY_HOP
                   and name != "HTTP_X_FORWARDED_FOR"}
        if self.environ.get("CONTENT_TYPE"):
            headers["Content-Type"] = self.environ["CONTENT_TYPE"]
        forwarded = [self.environ[k] for k in ("HTTP_X_FORWARDED_FOR", "REMOTE_ADDR") if self.environ.get(k)]
        if forwarded:
            headers["X-Forwarded-For"] = ", ".join(forwarded)
        return headers


def canonical(path):
    """Whether Django routes `path` as the router reads it: no dot segments, and nothing
    percent-encoded outside a key (an encoded "actions" would reach the intake unplaced)."""
    if {".", ".."} & set(path.split("/")):
        return False
    head = next((prefix for prefix in (ACTIONS + "/", TASKS + "/") if path.startswith(prefix)), path)
    return "%" not in head


def refuse(constant):
    raise ValueError(f"{constant} is not JSON")


def read_name(path):
    """The directory name a GET reads by: an action's (its evidence's too) or a task's; None for
    any other path."""
    for prefix, kind in ((ACTIONS + "/", "action"), (TASKS + "/", "task")):
        key = path.removeprefix(prefix)
        if key != path and key:
            # An encoded "/" is in the key; a literal one before "evidence" is the evidence's path.
            key = unquote(key.removesuffix("/evidence") if kind == "action" else key)
            # A key Surety refuses (a NUL, which PostgreSQL's text cannot hold) is never placed:
            # shard 0 answers it.
            return key_name(kind, key) if well_formed_key(key) else None
    return None


_built = threading.Lock()
_router = None


def app(environ, start_response):
    global _router
    if _router is None:
        with _built:
            if _router is None:
                try:
                    _router = Router([u.rstrip("/") for u in os.environ["SHARD_URLS"].split(",")],
                                     os.environ["SHARD_DIRECTORY_URL"])
                except (psycopg.OperationalError, PoolTimeout):
                    status, headers, body = unavailable("The shards' directory does not answer")
                    start_response(f"{status} Service Unavailable", headers)
                    return [body]
    return _router(environ, start_response)
