"""`python -m bench.stripe_connector`: refunds per second end to end through the Stripe connector
(the official SDK, against the sandbox's Stripe wire format) next to the sandbox connector.

1. A fresh PostgreSQL database `surety_bench_stripe`, Redis DB 15, one gunicorn serving the
   API and the sandbox in both of its wire formats (as bench/stack.py starts them).
2. Per round and connector: N refunds recorded through the API with no worker running (each
   with its own target and customer: nothing holds), the sandbox given a charge per target,
   then 2 RQ workers configured with that connector drain them. The figure is as (d) of
   `python -m bench` counts it: actions succeeded / seconds from the first claim to the last
   success. Rounds alternate the connectors, so a load that comes and goes touches both.
3. Prints both figures per round, their medians and the ratio Stripe / sandbox; and the CPU
   time per refund of the workers, the gunicorn and PostgreSQL (bench/cpu.py), which others'
   load on a shared machine barely moves, with the throughput ratio it implies.

The Stripe connector makes two calls per refund (it reads the charge's currency first) where
the sandbox connector makes one, and the SDK's form encoding and objects cost CPU of their own.
Options: --actions N (default 500), --rounds R (default 2).
"""

import argparse
import os
import statistics
import tempfile
import time
from datetime import UTC, datetime

from .cpu import CpuMonitor
from .stack import ADMIN_URL, Stack

DB_NAME = "surety_bench_stripe"
DATABASE_URL = f"postgres://postgres@127.0.0.1:5432/{DB_NAME}"


def say(*parts):
    print(*parts, flush=True)


def connectors(url):
    """The workers' environment for each connector measured."""
    return {
        "sandbox": {"CONNECTOR_REFUND": "sandbox"},
        "stripe": {"CONNECTOR_REFUND": "stripe", "STRIPE_API_KEY": "sk_test_bench",
                   "STRIPE_API_BASE": f"{url}/sandbox/stripe"},
    }


def reset_database():
    import psycopg
    from psycopg import sql

    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DB_NAME)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB_NAME)))


def one_round(stack, token, name, env, n, prefix):
    """(refunds per second, CPU ms per refund) for `n` actions drained by 2 workers using
    connector `name`."""
    import django_rq
    from django.db.models import Count, Max, Min
    from rq import Worker

    from ledger.models import Action, AuditEvent
    from sandbox.models import SandboxOrder

    from .__main__ import check_statuses, wait_for

    intake = stack.load("action_new", token=token, prefix=prefix, concurrency=16, count=n)
    check_statuses(intake, f"{name} intake")
    mine = Action.objects.filter(operation_key__startswith=f"{prefix}-")
    SandboxOrder.objects.bulk_create(
        SandboxOrder(order_id=target, customer="CUST-bench", amount=100, currency="EUR")
        for target in mine.values_list("target", flat=True)
    )
    started = datetime.now(UTC)
    workers = [f"{prefix}-worker-{i}" for i in (1, 2)]
    for worker in workers:
        stack.start_worker(worker, **env)
    if not wait_for(lambda: Worker.count(connection=django_rq.get_connection("default")) >= 2, timeout=60,
                    interval=0.02):
        raise RuntimeError(f"{name}: the workers did not start; see their logs in {stack.logs}")
    monitor = CpuMonitor(stack.named_pids, database=DB_NAME).start()
    done_before = mine.filter(status="succeeded").count()
    finished = wait_for(lambda: mine.filter(status="succeeded").count() >= n, timeout=300, interval=0.1)
    cpu = monitor.stop()
    for worker in workers:
        stack.stop(worker)
    if not finished:
        statuses = dict(mine.order_by().values_list("status").annotate(n=Count("id")))
        raise RuntimeError(f"{name}: not all {n} actions succeeded within 300 s ({statuses})")
    ids = [str(pk) for pk in mine.values_list("pk", flat=True)]
    first_claim = AuditEvent.objects.filter(object_type="ledger.action", verb="claimed", object_id__in=ids,
                                            occurred_at__gte=started).aggregate(t=Min("occurred_at"))["t"]
    last_done = mine.aggregate(t=Max("updated_at"))["t"]
    ours = sum(cpu.get(part, 0.0) for part in ("workers", "gunicorn", "postgres"))
    return n / (last_done - first_claim).total_seconds(), ours * cpu["seconds"] / max(n - done_before, 1) * 1000


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.stripe_connector", description=__doc__.split("\n\n")[0])
    p.add_argument("--actions", type=int, default=500)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)

    logs = tempfile.mkdtemp(prefix="bench-stripe-")
    stack = Stack(logs, gunicorn_workers=2, gunicorn_threads=8)
    stack.env["DATABASE_URL"] = DATABASE_URL
    os.environ.update({key: value for key, value in stack.env.items() if key in (
        "DJANGO_SETTINGS_MODULE", "DATABASE_URL", "REDIS_URL", "LOG_LEVEL", "SANDBOX_BASE_URL")})
    reset_database()
    stack.migrate()
    token = stack.create_agent("bench-stripe", ["refund"])

    import django

    django.setup()
    from django.db import connection

    from .stack import flush_redis

    flush_redis()
    stack.start_server()
    rates = {name: [] for name in connectors(stack.url)}
    cpu_ms = {name: [] for name in connectors(stack.url)}
    try:
        for round_no in range(1, args.rounds + 1):
            for name, env in connectors(stack.url).items():
                rate, ms = one_round(stack, token, name, env, args.actions, prefix=f"r{round_no}{name}")
                rates[name].append(rate)
                cpu_ms[name].append(ms)
                say(f"round {round_no}: {name:<8} {rate:8.1f} refunds/s, {ms:6.2f} ms CPU per refund "
                    f"({args.actions} by 2 workers)")
                flush_redis()
    finally:
        stack.stop_all()
        connection.close()
    sandbox, stripe = statistics.median(rates["sandbox"]), statistics.median(rates["stripe"])
    sandbox_ms, stripe_ms = statistics.median(cpu_ms["sandbox"]), statistics.median(cpu_ms["stripe"])
    say(f"median: sandbox connector {sandbox:.1f}/s, Stripe connector {stripe:.1f}/s, "
        f"ratio Stripe/sandbox {stripe / sandbox:.2f}")
    say(f"CPU per refund (workers + gunicorn + PostgreSQL): sandbox {sandbox_ms:.2f} ms, Stripe {stripe_ms:.2f} ms; "
        f"CPU-bound ratio Stripe/sandbox {sandbox_ms / stripe_ms:.2f}   (process logs: {logs})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
