"""A minimal service that receives Surety's signed-HTTP connector ("http"): copy it and put
the team's own effect where `_store` says.

What the connector needs from the service:

- `POST <url>` with the action as JSON, `Idempotency-Key: <operation key>` and
  `Surety-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">`. Refuse a
  bad or stale signature (401). Carry the effect out at most once per key: the same key
  again answers what the first request did (200), with the same `id`.
- `GET <url>/<percent-encoded operation key>`: 200 with the effect's `id` if it was carried
  out, 404 with `{"error": {"code": "not_found"}}` if it provably was not. Surety sends a
  request again only after that 404, so never answer it for an effect that may still commit.

What the service's test mode adds (the URL Surety's replay set calls, `CONNECTOR_<TYPE>_TEST_URL`;
never the live one):

- `POST <url>/faults`, signed like an action: `{"target": …, "fault": "timeout_after_commit",
  "times": n}`. The next `n` actions for that target carry their effect out and commit it, then
  answer only after `stall_seconds` (longer than Surety's `CONNECTOR_TIMEOUT`): the replay set's
  "timeout after the provider committed" case. 201 with the fault as armed; 400 for another
  fault or a bad body.

Run it with `RECEIVER_SECRET=... python receiver.py [port]`; it needs only the standard library
and keeps its effects in the SQLite file `RECEIVER_DATABASE`. `RECEIVER_TEST_MODE=1` serves the
test mode too (`RECEIVER_STALL_SECONDS`, default 10).
"""

import hashlib
import hmac
import json
import os
import sqlite3
import sys
import time
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIServer, make_server

PATH = "/effects"
TOLERANCE_SECONDS = 300
FAULTS = {"timeout_after_commit"}
MAX_TIMES = 10**6


def make_app(secret, database, *, test_mode=False, stall_seconds=10):
    with sqlite3.connect(database) as db:
        db.execute("CREATE TABLE IF NOT EXISTS effects "
                   "(id INTEGER PRIMARY KEY, operation_key TEXT NOT NULL UNIQUE, body TEXT NOT NULL)")
        db.execute("CREATE TABLE IF NOT EXISTS faults (target TEXT PRIMARY KEY, fault TEXT NOT NULL, "
                   "times INTEGER NOT NULL)")

    def application(environ, start_response):
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        length = environ.get("CONTENT_LENGTH") or "0"
        if method == "POST" and not (length.isascii() and length.isdigit()):
            status, answer = 400, {"error": {"code": "invalid", "message": "Content-Length must be a number"}}
        elif method == "POST" and path == PATH:
            raw = environ["wsgi.input"].read(int(length))
            status, answer = _receive(database, secret, environ, raw)
            if test_mode and status < 400 and _fault_fires(database, answer["target"]):
                time.sleep(stall_seconds)  # committed above: the caller gives up before this answer
        elif method == "POST" and path == PATH + "/faults" and test_mode:
            raw = environ["wsgi.input"].read(int(length))
            status, answer = _arm(database, secret, environ, raw)
        elif method == "GET" and path.startswith(PATH + "/"):
            # The server has already decoded the path: a key's "%2F" is a "/" here.
            status, answer = _look_up(database, path[len(PATH) + 1:])
        else:
            status, answer = 404, {"error": {"code": "no_such_route"}}
        start_response(f"{status} {'OK' if status < 400 else 'Error'}", [("Content-Type", "application/json")])
        return [json.dumps(answer).encode()]

    return application


def _receive(database, secret, environ, raw):
    if not _signature_valid(environ.get("HTTP_SURETY_SIGNATURE", ""), raw, secret):
        return 401, {"error": {"code": "bad_signature", "message": "bad, missing or stale signature"}}
    key = environ.get("HTTP_IDEMPOTENCY_KEY", "")
    try:
        action = json.loads(raw)
    except ValueError:
        action = None
    if not isinstance(action, dict):
        return 400, {"error": {"code": "invalid", "message": "the body is not a JSON object"}}
    if not key or action.get("operation_key") != key:
        return 400, {"error": {"code": "invalid", "message": "Idempotency-Key must be the body's operation_key"}}
    created, row_id, stored_body = _store(database, key, json.dumps(action))
    if json.loads(stored_body) != action:
        return 409, {"error": {"code": "idempotency_key_reused", "message": "this key asked for something else"}}
    return (201 if created else 200), {"id": f"eff_{row_id}", "operation_key": key, "target": action.get("target")}


def _store(database, key, body):
    """Record the key and carry the effect out in one transaction: the unique key lets only
    the first of any number of concurrent requests through."""
    with sqlite3.connect(database, timeout=30) as db:
        created = db.execute("INSERT INTO effects (operation_key, body) VALUES (?, ?) "
                             "ON CONFLICT (operation_key) DO NOTHING", (key, body)).rowcount == 1
        # if created: carry out the team's effect here, inside this transaction.
        row_id, stored_body = db.execute("SELECT id, body FROM effects WHERE operation_key = ?", (key,)).fetchone()
    return created, row_id, stored_body


def _arm(database, secret, environ, raw):
    """Test mode: the next `times` actions for `target` stall after their commit."""
    if not _signature_valid(environ.get("HTTP_SURETY_SIGNATURE", ""), raw, secret):
        return 401, {"error": {"code": "bad_signature", "message": "bad, missing or stale signature"}}
    try:
        fault = json.loads(raw)
        target, kind, times = fault["target"], fault["fault"], fault.get("times", 1)
    except (ValueError, TypeError, KeyError):
        return 400, {"error": {"code": "invalid", "message": "a JSON object with target, fault and times"}}
    # type(...) is int: a JSON true is a bool, which isinstance would take for 1.
    if not isinstance(kind, str) or kind not in FAULTS or not isinstance(target, str) \
            or type(times) is not int or not 1 <= times <= MAX_TIMES:
        return 400, {"error": {"code": "invalid",
                               "message": f"fault is one of {sorted(FAULTS)}, times from 1 to {MAX_TIMES}"}}
    with sqlite3.connect(database, timeout=30) as db:
        db.execute("INSERT INTO faults (target, fault, times) VALUES (?, ?, ?) ON CONFLICT (target) "
                   "DO UPDATE SET fault = excluded.fault, times = excluded.times", (target, kind, times))
    return 201, {"target": target, "fault": kind, "times": times}


def _fault_fires(database, target):
    """Whether an armed fault takes this action for `target` (and one use of it)."""
    with sqlite3.connect(database, timeout=30) as db:
        return db.execute("UPDATE faults SET times = times - 1 WHERE target = ? AND times > 0",
                          (target,)).rowcount == 1


def _look_up(database, key):
    with sqlite3.connect(database, timeout=30) as db:
        row = db.execute("SELECT id FROM effects WHERE operation_key = ?", (key,)).fetchone()
    if row is None:
        return 404, {"error": {"code": "not_found", "message": "no effect for this key"}}
    return 200, {"id": f"eff_{row[0]}", "operation_key": key}


def _signature_valid(header, raw, secret):
    pairs = [item.split("=", 1) for item in header.split(",") if "=" in item]
    try:
        stamp = int(dict(pairs)["t"])
    except (KeyError, ValueError):
        return False
    if abs(int(time.time()) - stamp) > TOLERANCE_SECONDS:  # whole numbers: a huge stamp overflows a float
        return False
    expected = hmac.new(secret.encode(), f"{stamp}.".encode() + raw, hashlib.sha256).hexdigest().encode()
    # Any one `v1` may hold: a sender rolling its secret signs with the old and the new one.
    return any(hmac.compare_digest(expected, given.encode("utf-8", "replace")) for name, given in pairs if name == "v1")


class ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    # socketserver's default backlog of 5 resets the connections of a burst of requests.
    request_queue_size = 128


def serve(app, port=0, host="127.0.0.1"):
    """A threaded server for `app` (port 0: any free one); call its serve_forever()."""
    return make_server(host, port, app, server_class=ThreadingWSGIServer)


if __name__ == "__main__":
    server = serve(make_app(os.environ["RECEIVER_SECRET"], os.environ.get("RECEIVER_DATABASE", "effects.sqlite3"),
                            test_mode=os.environ.get("RECEIVER_TEST_MODE") == "1",
                            stall_seconds=float(os.environ.get("RECEIVER_STALL_SECONDS", "10"))),
                   port=int(sys.argv[1]) if len(sys.argv) > 1 else 8080)
    print(f"receiving on http://127.0.0.1:{server.server_port}{PATH}")
    server.serve_forever()
