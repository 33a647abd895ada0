"""`python -m bench.worker_profile`: where a worker's CPU goes, action by action.

(d)'s path in one process: `--actions N` actions recorded through the API (gunicorn, no worker
running), then drained here by `drain_actions` with one lane against the sandbox provider in
its own gunicorn and database, as (d) runs it. Prints, per action: this process's CPU (the
drain and its provider-call thread), its PostgreSQL backend's, the statements it sent by
shape (BEGIN and COMMIT apart, two each), and with `--profile` a cProfile of the drain timed
by CPU (`time.process_time`), not by wall clock, which the provider's answers and a loaded
machine would fill. A fresh `surety_bench_worker` (and `_provider`) database and Redis DB 15:
run it under the shared bench lock, as the main bench.
"""

import argparse
import collections
import cProfile
import os
import pstats
import re
import time
from pathlib import Path

from . import stack as st
from .cpu import HZ, process_ticks

DB, PROVIDER_DB = "surety_bench_worker", "surety_bench_worker_provider"
GRANTS = ["refund"]


def statement_shape(sql):
    """Its head and its tail (a claim and a locked read differ only at the end)."""
    sql = re.sub(r"\s+", " ", sql)
    return sql if len(sql) <= 130 else f"{sql[:80]} ... {sql[-45:]}"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.worker_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--actions", type=int, default=1000)
    parser.add_argument("--profile", action="store_true", help="also a cProfile of the drain (CPU time)")
    parser.add_argument("--top", type=int, default=40, help="rows of the profile printed")
    parser.add_argument("--logs", default="artifacts/bench-logs/worker-profile")
    args = parser.parse_args(argv)

    env = {"DATABASE_URL": st.database_url(DB)}
    os.environ.update({**st.STACK_ENV, **env, "DRAIN_LANES": "1"})
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    st.reset_database(DB)
    st.reset_database(PROVIDER_DB)
    st.flush_redis()
    stack = st.Stack(logs, gunicorn_workers=2, gunicorn_threads=8, provider_database=PROVIDER_DB, env=env)
    try:
        stack.migrate()
        token = stack.create_agent("bench", GRANTS)
        stack.start_server()
        stack.start_provider()
        os.environ.update(SANDBOX_BASE_URL=stack.env["SANDBOX_BASE_URL"], SITE_URL=stack.url)
        intake = stack.load("action_new", token=token, prefix="wp", count=args.actions)
        print(f"recorded {intake['statuses']} in {intake['seconds']} s")
        drain_and_report(args)
    finally:
        stack.stop_all()


def drain_and_report(args):
    import django

    django.setup()
    from django.db import connection

    from ledger.executor import drain_actions
    from ledger.models import Action

    st.flush_redis()  # the intake's drain jobs: this process drains instead
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    shapes = collections.Counter()

    def count(execute, sql, params, many, context):
        shapes[statement_shape(sql)] += 1
        return execute(sql, params, many, context)

    profile = cProfile.Profile(time.process_time)
    wall, cpu, pg = time.monotonic(), time.process_time(), process_ticks(backend)
    with connection.execute_wrapper(count):
        if args.profile:
            profile.enable()
        while drain_actions():  # a drain ends after DRAIN_SECONDS: go on until none is left
            pass
        profile.disable()
    wall, cpu, pg = time.monotonic() - wall, time.process_time() - cpu, (process_ticks(backend) - pg) / HZ
    done = Action.objects.filter(status="succeeded").count()
    print(f"drained {done} actions in {wall:.1f} s; per action: this process {1000 * cpu / done:.3f} ms of CPU"
          f"{' (profiled)' if args.profile else ''}, its PostgreSQL backend {1000 * pg / done:.3f} ms; "
          f"{sum(shapes.values()) / done:.2f} statements, besides 2 BEGIN and 2 COMMIT")
    for shape, n in shapes.most_common():
        print(f"  {n / done:5.2f}  {shape}")
    if args.profile:
        stats = pstats.Stats(profile)
        stats.sort_stats("cumulative").print_stats(args.top)
        stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
