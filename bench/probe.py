"""In-process probes (no HTTP, no gunicorn): what each request costs in SQL and in CPU.

Runs inside the benchmark process, with Django set up on `bench.settings` against the same
`surety_bench` database and Redis DB 15 the server uses.
"""

import cProfile
import os
import io
import pstats
import secrets
import statistics
import time

from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from .load import action_body, baseline_body


class Commits:
    """Counts transactions that end in COMMIT: atomic blocks, plus writes run in autocommit."""

    def __init__(self):
        self.atomic = 0
        self.autocommit_writes = 0

    def __enter__(self):
        real = connection.commit

        def counting_commit():
            self.atomic += 1
            return real()

        def wrapper(execute, sql, params, many, context):
            verb = sql.lstrip().split(" ", 1)[0].upper()
            if not connection.in_atomic_block and verb in {"INSERT", "UPDATE", "DELETE"}:
                self.autocommit_writes += 1
            return execute(sql, params, many, context)

        connection.ensure_connection()
        self._real = real
        connection.commit = counting_commit
        self._wrap = connection.execute_wrapper(wrapper)
        self._wrap.__enter__()
        return self

    def __exit__(self, *exc):
        self._wrap.__exit__(*exc)
        del connection.commit  # back to the class's method
        return False

    @property
    def total(self):
        return self.atomic + self.autocommit_writes


class Requests:
    """The four request shapes of the HTTP benchmark, sent through Django's test client."""

    def __init__(self, token):
        self.client = Client()
        self.auth = {"Authorization": f"Bearer {token}"}
        self.n = 0
        self.run = secrets.token_hex(4)  # keys never collide with an earlier probe's

    def fresh(self, stem):
        self.n += 1
        return f"probe-{self.run}-{stem}-{self.n}"

    def baseline_insert(self, key):
        return self.client.post("/bench/baseline/rows", data=baseline_body(key), content_type="application/json")

    def baseline_read(self, key):
        return self.client.get(f"/bench/baseline/rows/{key}")

    def action_post(self, key):
        return self.client.post("/api/v1/actions", data=action_body(key), content_type="application/json",
                                headers={**self.auth, "Idempotency-Key": key})

    def task_post(self, key):
        return self.client.post("/api/v1/tasks", data={"workflow": "noop", "input": {}},
                                content_type="application/json", headers={**self.auth, "Idempotency-Key": key})


def _shape(send, key):
    with CaptureQueriesContext(connection) as queries, Commits() as commits:
        response = send(key)
    control = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")
    statements = [q for q in queries.captured_queries if not q["sql"].lstrip().upper().startswith(control)]
    return {
        "status": response.status_code,
        "queries": len(statements),
        "commits": commits.total,
        "sql": [q["sql"] for q in queries.captured_queries],
    }


def query_counts(token):
    """SQL statements and commits per request, each measured on its second occurrence
    (the first in a process fills caches)."""
    r = Requests(token)
    shapes, last_key = {}, None
    for name, send, key_of in (
        ("baseline_insert", r.baseline_insert, lambda: r.fresh("bi")),
        ("baseline_read", r.baseline_read, None),
        ("action_new", r.action_post, lambda: r.fresh("an")),
        ("action_replay", r.action_post, None),
        ("task_new", r.task_post, lambda: r.fresh("tn")),
    ):
        if key_of is None:  # a read / replay of the key the previous shape just wrote
            key = last_key
        else:
            send(key_of())
            key = last_key = key_of()
        shapes[name] = _shape(send, key)
    return shapes


def cpu_per_request(token, repeat=200):
    """Median wall time per request in-process, one request at a time: Django's own cost
    with no HTTP, no gunicorn and no contention (PostgreSQL round trips included). The four
    shapes are interleaved, so a passing disturbance touches them alike."""
    r = Requests(token)
    written = [r.fresh("ci") for _ in range(repeat)]
    actions = [r.fresh("ca") for _ in range(repeat)]
    r.baseline_insert(r.fresh("warm"))
    r.action_post(r.fresh("warm"))
    wall = {"baseline_insert": [], "baseline_read": [], "action_new": [], "action_replay": []}
    cpu = {name: [] for name in wall}
    for pairs in ((("baseline_insert", r.baseline_insert), ("action_new", r.action_post)),
                  (("baseline_read", r.baseline_read), ("action_replay", r.action_post))):
        for base_key, action_key in zip(written, actions):
            for (name, send), key in zip(pairs, (base_key, action_key)):
                started, started_cpu = time.perf_counter(), time.process_time()
                send(key)
                cpu[name].append(time.process_time() - started_cpu)
                wall[name].append(time.perf_counter() - started)
    return {name: {"wall_ms": round(statistics.median(wall[name]) * 1000, 3),
                   "cpu_ms": round(statistics.median(cpu[name]) * 1000, 3)} for name in wall}


def profile(token, repeat=300, top=25):
    """cProfile of `repeat` new-key POSTs and `repeat` replays: where the time goes."""
    r = Requests(token)
    keys = [r.fresh("pf") for _ in range(repeat)]
    r.action_post(keys[0] + "-warm")
    reports = {}
    for name in ("action_new", "action_replay"):
        prof = cProfile.Profile(time.process_time)
        prof.enable()
        for key in keys:
            r.action_post(key)
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(os.environ.get("BENCH_PROFILE_SORT", "cumulative")).print_stats(top)
        reports[name] = buf.getvalue()
    return reports


def noop_task_counts(token):
    """SQL statements and commits of one whole `noop` task run (10 local steps) in-process:
    claim, then the runner, as a worker would do it."""
    from ledger.runner import task_run
    from ledger.tasks import task_claim_next

    r = Requests(token)
    key = r.fresh("nt")
    r.task_post(key)
    from ledger.models import Task

    Task.objects.filter(state="queued").exclude(task_id=key).update(state="cancelled", next_attempt_at=None)
    with CaptureQueriesContext(connection) as claim_queries, Commits() as claim_commits:
        task = task_claim_next("bench-probe")
    with CaptureQueriesContext(connection) as queries, Commits() as commits:
        task_run(task)
    task.refresh_from_db()
    control = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")
    statements = [q["sql"] for q in queries.captured_queries if not q["sql"].lstrip().upper().startswith(control)]
    steps = task.steps.count()
    return {"state": task.state, "steps": steps,
            "claim": {"queries": len([q for q in claim_queries.captured_queries
                                      if not q["sql"].lstrip().upper().startswith(control)]),
                      "commits": claim_commits.total},
            "run": {"queries": len(statements), "commits": commits.total},
            "per_step": {"queries": round(len(statements) / steps, 1), "commits": round(commits.total / steps, 1)},
            "sql_first_step": [q["sql"] for q in queries.captured_queries][:12]}
