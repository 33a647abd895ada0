"""`python -m bench sharded`: what the shards' router (sharding/router.py) costs a request.

(b) of `python -m bench`, POST /api/v1/actions under new keys (each with a customer and an order
of its own), three ways, in interleaved rounds:
- `direct`: straight to one Surety, a gunicorn on database `surety_bench_shard0`;
- `routed_1`: through the router (a gunicorn of its own) and its directory (`surety_bench_directory`)
  in front of that one Surety: the tier's own cost, a directory look and a placement per request;
- `routed_2`: through the router in front of two Sureties on two databases (the second a copy of the
  first, agent included), the customers spread by hash.

Every Surety and the router run `-k gthread -w 2 --threads 8`. On one machine the two shards share
its cores, so `routed_2` shows the tier's cost with the work split, not what two machines hold.
Prints each way's requests per second and CPU per request (the Sureties' gunicorns, the router,
PostgreSQL on all three databases, the load generator; bench/cpu.py), and the ratios to `direct`.
Writes artifacts/bench-sharded.json. About two minutes.
"""

import argparse
import tempfile
from pathlib import Path

from .cpu import CpuMonitor
from .health_checks import say, wait_for_room
from .results import write_results
from .stack import ADMIN_URL, Stack, database_url, flush_redis, reset_database

SHARDS = ["surety_bench_shard0", "surety_bench_shard1"]
DIRECTORY = "surety_bench_directory"
THREADS = 8
PARTS = ("gunicorn", "router", "postgres", "load_generator")


def copy_database(name, template):
    import psycopg
    from psycopg import sql

    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template)))


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench sharded", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=24.0, help="seconds measured per way, split over the rounds (default 24)")
    p.add_argument("--warmup", type=float, default=6.0, help="seconds of warm-up per way, split over the rounds (default 6)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--out", default="artifacts/bench-sharded.json")
    args = p.parse_args(argv)

    from .__main__ import check_statuses, combine, ok_rps

    logs = Path(tempfile.mkdtemp(prefix="bench-sharded-"))
    shards = []
    for name in SHARDS:
        (logs / name).mkdir()
        shards.append(Stack(logs / name, gunicorn_workers=2, gunicorn_threads=THREADS))
        shards[-1].env.update(DATABASE_URL=database_url(name))
    routers = []
    for n in (1, 2):
        (logs / f"router{n}").mkdir()
        routers.append(Stack(logs / f"router{n}", gunicorn_workers=2, gunicorn_threads=THREADS))
    reset_database(SHARDS[0])
    reset_database(DIRECTORY)
    flush_redis()
    shards[0].migrate()
    token = shards[0].create_agent("bench-sharded", ["refund"])
    copy_database(SHARDS[1], SHARDS[0])

    ways = {"direct": shards[0], "routed_1": routers[0], "routed_2": routers[1]}
    stacks = [*shards, *routers]
    segments = {way: [] for way in ways}
    per_round, warmup = args.duration / args.rounds, args.warmup / args.rounds
    wait_for_room(4 * 2 * THREADS + 4)
    try:
        for shard in shards:
            shard.start_server()
        for n, router in enumerate(routers, 1):
            router.start_router([s.url for s in shards[:n]], DIRECTORY)
        for round_no in range(1, args.rounds + 1):
            for way, target in ways.items():
                monitor = CpuMonitor(lambda: {pid: name for s in stacks for pid, name in s.named_pids().items()},
                                     database=SHARDS[0], databases={SHARDS[1]: "postgres", DIRECTORY: "postgres"})
                monitor.start()
                report = target.load("action_new", token=token, concurrency=args.concurrency, duration=per_round,
                                     warmup=warmup, prefix=f"{way}{round_no}")
                report["cpu"] = monitor.stop()
                report["ok_rps"] = ok_rps(report)
                check_statuses(report, f"{way} (round {round_no})")
                segments[way].append(report)
                say(f"round {round_no}  {way:<9} {report['ok_rps']:>8.1f} req/s")
    finally:
        for stack in stacks:
            stack.stop_all()
    results = {way: combine(way, way, segments[way], PARTS) for way in ways}
    base = results["direct"]
    ratios = {}
    say("")
    for way, fig in results.items():
        cpu = fig["cpu_ms_per_request"]
        ratios[f"{way}/direct"] = {"throughput": round(fig["ok_rps"] / base["ok_rps"], 3),
                                   "cpu_per_request": round(cpu["total"] / base["cpu_ms_per_request"]["total"], 3)}
        say(f"{way:<9} {fig['ok_rps']:>7.1f} req/s  p50 {fig['latency_ms_median_of_rounds']['p50']} ms  "
            f"CPU {cpu['total']} ms/request (Surety {cpu['gunicorn']}, router {cpu['router']}, "
            f"postgres {cpu['postgres']}, load {cpu['load_generator']})  / direct: "
            f"{ratios[f'{way}/direct']['throughput']:.3f} throughput, {ratios[f'{way}/direct']['cpu_per_request']:.3f} "
            f"CPU per request   [rounds {', '.join(str(r) for r in fig['rounds_ok_rps'])}]")
    out = write_results(args.out, {"ratios": ratios, "results": results})
    say(f"\nwritten to {out} (process logs: {logs})")
    return 0
