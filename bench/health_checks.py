"""`python -m bench health_checks`: what surviving a database blip costs a request, (b) and (c)
of `python -m bench` measured with each way of keeping connections, side by side in one run.

1. A fresh database `surety_bench_checks`, Redis DB 15, and one gunicorn per way (as bench/stack.py
   starts them, `-k gthread -w 2 --threads 8`), started for its turn and stopped after it:
   - `unchecked`: persistent connections (CONN_MAX_AGE=600) without a health check, as before;
   - `checked`: the same with Django's CONN_HEALTH_CHECKS, the default now (a request's first
     statement is preceded by a `SELECT 1` when the connection was used by an earlier request);
   - `pool`: Django's psycopg pool (`OPTIONS["pool"]`, CONN_MAX_AGE=0), up to a connection per
     thread, each checked as the pool hands it out (Django passes `ConnectionPool.check_connection`
     under CONN_HEALTH_CHECKS); bench/settings.py sets it from BENCH_DATABASE_POOL, for this
     measurement only.
2. Rounds (`--rounds`, default 3) go through the ways in turn, (b) then (c) on each, so that a
   load that comes and goes on a shared machine touches every way alike. Each turn starts with
   a warm-up (`--warmup`), which also fills the connections and prepares the statements.
3. Prints each figure's requests per second and CPU time per request (gunicorn + PostgreSQL +
   the load generator, bench/cpu.py; what others' load barely moves), and the ratios of each
   way to `unchecked`. Writes artifacts/bench-health-checks.json. About a minute and a half.
"""

import argparse
import os
import tempfile
import time
from pathlib import Path

from .cpu import CpuMonitor
from .results import write_results
from .stack import Stack, flush_redis, reset_database, wait_for_connection_slots

DB_NAME = "surety_bench_checks"
DATABASE_URL = f"postgres://postgres@127.0.0.1:5432/{DB_NAME}"
THREADS = 8
WAYS = {
    "unchecked": {"DATABASE_HEALTH_CHECKS": "false"},
    "checked": {"DATABASE_HEALTH_CHECKS": "true"},
    "pool": {"DATABASE_HEALTH_CHECKS": "true", "BENCH_DATABASE_POOL": str(THREADS)},
}
FIGURES = {"b": ("action_new", "(b) POST actions, new keys"), "c": ("action_replay", "(c) POST actions, replayed keys")}


def say(*parts):
    print(*parts, flush=True)


def wait_for_room(needed, seconds=120):
    """Room for `needed` more connections, as bench/stack.py waits for it; a server so full that
    even asking is refused is asked again."""
    import psycopg

    deadline = time.monotonic() + seconds
    while True:
        try:
            return wait_for_connection_slots(needed)
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench health_checks", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=9.0, help="seconds measured per figure and way, split over the rounds (default 9)")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of warm-up per figure and way, split over the rounds (default 3)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--out", default="artifacts/bench-health-checks.json")
    args = p.parse_args(argv)

    from .__main__ import check_statuses, combine, ok_rps, write_keys

    logs = Path(tempfile.mkdtemp(prefix="bench-health-checks-"))
    stacks = {}
    for way, env in WAYS.items():
        (logs / way).mkdir()
        stacks[way] = Stack(logs / way, gunicorn_workers=2, gunicorn_threads=THREADS)
        stacks[way].env.update(DATABASE_URL=DATABASE_URL, **env)
    first = stacks["unchecked"]
    os.environ.update({key: value for key, value in first.env.items() if key in (
        "DJANGO_SETTINGS_MODULE", "DATABASE_URL", "REDIS_URL", "LOG_LEVEL")})
    reset_database(DB_NAME)
    flush_redis()
    first.migrate()
    token = first.create_agent("bench-checks", ["refund"])

    import django

    django.setup()
    from django.db import connection

    segments = {(way, figure): [] for way in WAYS for figure in FIGURES}
    per_round, warmup = args.duration / args.rounds, args.warmup / args.rounds
    try:
        for round_no in range(1, args.rounds + 1):
            for way, stack in stacks.items():
                # One gunicorn up at a time: each holds up to a connection per thread, and the
                # machine's PostgreSQL may be shared.
                wait_for_room(2 * THREADS + 4)
                stack.start_server()
                for figure, (mode, label) in FIGURES.items():
                    extra = {"prefix": f"{way}{round_no}"}
                    if mode == "action_replay":
                        with connection.cursor() as c:
                            c.execute("SELECT operation_key FROM ledger_action WHERE operation_key LIKE %s "
                                      "ORDER BY id LIMIT 5000", [f"{way}%"])
                            extra = {"keys_file": write_keys(logs / f"keys-{way}.txt", [r[0] for r in c.fetchall()])}
                    monitor = CpuMonitor(stack.named_pids, database=DB_NAME).start()
                    report = stack.load(mode, token=token, concurrency=args.concurrency, duration=per_round,
                                        warmup=warmup, **extra)
                    report["cpu"] = monitor.stop()
                    report["ok_rps"] = ok_rps(report)
                    check_statuses(report, f"{label}, {way} (round {round_no})")
                    segments[way, figure].append(report)
                    say(f"round {round_no}  {label:<34} {way:<10} {report['ok_rps']:>8.1f} req/s")
                stack.stop("gunicorn")
    finally:
        for stack in stacks.values():
            stack.stop_all()
        connection.close()
    results = {f"{figure}_{way}": combine(figure, FIGURES[figure][1], segments[way, figure])
               for way in WAYS for figure in FIGURES}
    say("")
    ratios = {}
    for figure, (_, label) in FIGURES.items():
        base = results[f"{figure}_unchecked"]
        for way in WAYS:
            fig = results[f"{figure}_{way}"]
            rps_ratio = round(fig["ok_rps"] / base["ok_rps"], 3)
            cpu_ratio = round(base["cpu_ms_per_request"]["total"] / fig["cpu_ms_per_request"]["total"], 3)
            ratios[f"{figure}_{way}/unchecked"] = {"throughput": rps_ratio, "cpu_bound_estimate": cpu_ratio}
            say(f"{label:<34} {way:<10} {fig['ok_rps']:>8.1f} req/s  p50 {fig['latency_ms_median_of_rounds']['p50']} ms  "
                f"CPU {fig['cpu_ms_per_request']['total']} ms/request (postgres {fig['cpu_ms_per_request']['postgres']})"
                f"  / unchecked: {rps_ratio:.3f} throughput, {cpu_ratio:.3f} by CPU   "
                f"[rounds {', '.join(str(r) for r in fig['rounds_ok_rps'])}]")
    out = write_results(args.out, {"ways": WAYS, "ratios": ratios, "results": results})
    say(f"\nwritten to {out} (process logs: {logs})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
