"""`python -m bench` (`make bench`): the ledger's throughput next to bare-Django baselines.

One run, one gunicorn (gthread; the same workers and threads for every HTTP figure), one
fresh PostgreSQL database `surety_bench`, Redis DB 15, a load generator in a separate process
on loopback (bench/load.py; each of its connections is reopened after 50 requests, so that
the load spreads over the gunicorn processes), fixed durations after a warm-up:

  (a) baselines: a bare Django view inserting a row (insert + a second write: two commits) and
      one reading a row by unique key (bench/baseline/), served with the same settings;
  (b) POST /api/v1/actions with new keys (row + audit event + doorbell), no holds;
  (c) the same POSTs replayed (existing keys);
  (d) actions completed end to end per second by 2 RQ workers against the sandbox, which runs as
      a provider of its own (its own gunicorn and database, bench/stack.py), as a real one would;
  (e) the time per step of `noop` tasks (10 local steps) on 1 worker with 1 lane, next to two commits
      plus one enqueue measured here in Python on the same database and Redis;
  (f) SIGKILL of a worker mid-task -> the task running again on a fresh worker.

With `--pooler`, (b)-(d) are measured once more through a PgBouncer in transaction pooling mode
(bench/pgbouncer.py; a second gunicorn and (d)'s workers with DATABASE_POOLER=transaction), and
each is set beside its direct figure.

Plus in-process probes: SQL statements and commits per request (CaptureQueriesContext) and
in-process wall and CPU time per request.

And (p), after the stack is stopped: the dashboard's list and search pages, their server time
at ~1,000 actions and at 1M (bench/pages.py; `python -m bench pages` runs it alone).

`python -m bench seal`: the audit sealer's throughput against the intake's at 10 and 100 writers,
with the seal's lag (bench/seal.py).

`python -m bench health_checks`: (b) and (c) with persistent connections unchecked, health-checked
and pooled, side by side, with their ratios (bench/health_checks.py).

`python -m bench sharded`: (b) straight to one Surety, and through the shards' router in front of
one and of two (bench/sharded.py).

`python -m bench partitioned_writes`: a worker's UPDATE and the intake's INSERT on tables
partitioned by ranges of id against unpartitioned ones, by pgbench (bench/partitioned_writes.py).

The machine may be shared (other sessions' test suites): the HTTP figures are measured in
interleaved rounds (each API figure right after its baseline), and a CPU monitor (bench/cpu.py)
reports what other processes used meanwhile, plus this stack's CPU time per request, from
which a CPU-bound estimate of each ratio follows that others' load barely moves.

Prints the figures, ratios and PASS/MISS per target, and writes them to artifacts/bench.json.
"""

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from .cpu import CpuMonitor
from .results import write_results
from .stack import (DB_NAME, PROVIDER_DB_NAME, ROOT, STACK_ENV, Stack, database_url, flush_redis, reset_database,
                    wait_for_connection_slots)

TARGETS = {  # ratio name -> (numerator, denominator, at least)
    "b/a_insert": ("b_action_new", "a_insert", 0.6),
    "c/a_read": ("c_action_replay", "a_read", 0.8),
    "d/a_insert": ("d_end_to_end", "a_insert", 0.25),
}
EXPECTED_STATUS = {"baseline_insert": "201", "baseline_read": "200", "action_new": "201", "action_replay": "200",
                   "task_new": "201"}
GRANTS = ["refund", "send_message", "create_booking", "noop"]
POOL_SIZE = 20  # PgBouncer's default_pool_size, for `--pooler`


def say(*parts):
    print(*parts, flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0],
                                epilog="Sections of their own, each with its --help: python -m bench pages, "
                                       "python -m bench health_checks, python -m bench seal (the audit sealer "
                                       "against the intake at 10 and 100 writers), python -m bench mechanisms "
                                       "(each speed mechanism against the plain code).")
    p.add_argument("--duration", type=float, default=10.0, help="seconds measured per HTTP figure (default 10)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up before each (default 2)")
    p.add_argument("--rounds", type=int, default=2,
                   help="interleaved rounds the duration and warm-up of each HTTP figure are split into (default 2)")
    p.add_argument("--concurrency", type=int, default=16, help="connections of the load generator (default 16)")
    p.add_argument("--gunicorn-workers", type=int, default=2)
    p.add_argument("--gunicorn-threads", type=int, default=8)
    p.add_argument("--actions", type=int, default=1000, help="N actions for (d) (default 1000)")
    p.add_argument("--d-rounds", type=int, default=3,
                   help="rounds of (d), each right after a segment of (a)'s insert view it is set against (default 3)")
    p.add_argument("--noop-tasks", type=int, default=100, help="noop tasks for (e), 10 steps each (default 100)")
    p.add_argument("--only", default="abcdefp",
                   help="the figures to measure, e.g. 'ab' (default all; p: the dashboard pages, bench/pages.py)")
    p.add_argument("--profile", action="store_true", help="also print a cProfile of the POST paths")
    p.add_argument("--pooler", action="store_true",
                   help="also measure (b)-(d) with DATABASE_POOLER=transaction, straight to PostgreSQL and through "
                        "PgBouncer in transaction pooling mode (bench/pgbouncer.py), each over its direct figure")
    p.add_argument("--database", help="measure over this database as it is, migrated and kept (what the run writes "
                                      "stays), e.g. bench scale's; default: a fresh surety_bench")
    p.add_argument("--out", default="artifacts/bench.json")
    return p.parse_args(argv)


def setup_django():
    """This process talks to the same database and Redis as the stack, with the same settings."""
    import warnings

    warnings.filterwarnings("ignore", message="No directory at", module="django.core.handlers.base")
    os.environ.update(STACK_ENV)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def ok_rps(report):
    good = report["statuses"].get(EXPECTED_STATUS[report["mode"]], 0)
    return round(good / report["seconds"], 1) if report["seconds"] else 0.0


def check_statuses(report, label):
    expected = EXPECTED_STATUS[report["mode"]]
    other = {k: v for k, v in report["statuses"].items() if k != expected}
    if other or report["transport_errors"]:
        say(f"   ! {label}: unexpected answers {other}, transport errors {report['transport_errors']} "
            f"{report['first_errors']}")


def write_keys(path, keys):
    Path(path).write_text("\n".join(keys) + "\n")
    return path


HTTP_FIGURES = [  # in the order of each round: each API figure right after its baseline
    ("a_insert", "(a) baseline view: insert + update (2 commits)", "baseline_insert"),
    ("b_action_new", "(b) POST /api/v1/actions, new keys", "action_new"),
    ("a_read", "(a) baseline view: read by unique key", "baseline_read"),
    ("c_action_replay", "(c) POST /api/v1/actions, replayed keys", "action_replay"),
]


def others_note(cpu):
    return f"other processes on the machine used {cpu['others']:.2f} of {cpu['cpus']} CPUs"


def combine(name, label, segments, parts=("gunicorn", "postgres", "load_generator")):
    """One figure from its rounds: requests and seconds summed; the per-round figures kept;
    the CPU per request of each of `parts` (the CPU monitor's categories) and their total."""
    seconds = sum(r["seconds"] for r in segments)
    ok = sum(r["statuses"].get(EXPECTED_STATUS[r["mode"]], 0) for r in segments)
    lat = {p: round(statistics.median(r["latency_ms"][p] for r in segments if r["latency_ms"][p] is not None), 2)
           for p in ("p50", "p90", "p99")}
    cpu = {k: round(statistics.mean(r["cpu"].get(k, 0.0) for r in segments), 2)
           for k in sorted({k for r in segments for k in r["cpu"]})}
    # CPU time per request: what this machine spends on one, whoever else shares it. The
    # monitor's window also covers the warm-up, so the warm-up's requests are counted too.
    served = sum(r["requests"] + r["warmup_requests"] for r in segments)
    cpu_ms = {}
    for part in parts:
        spent = sum(r["cpu"].get(part, 0.0) * r["cpu"]["seconds"] for r in segments)
        cpu_ms[part] = round(spent / served * 1000, 3) if served else None
    cpu_ms["total"] = round(sum(v for v in cpu_ms.values() if v), 3)
    return {"label": label, "mode": segments[0]["mode"], "ok_rps": round(ok / seconds, 1), "requests_ok": ok,
            "seconds": round(seconds, 3), "latency_ms_median_of_rounds": lat, "cpu": cpu,
            "cpu_ms_per_request": cpu_ms,
            "rounds_ok_rps": [r["ok_rps"] for r in segments], "rounds": segments}


def figure_a_b_c(stack, token, args, results, logs, monitor, tag=""):
    """`tag` starts the keys, so that a second measurement (`--pooler`) makes new ones."""
    from django.db import connection

    per_round = args.duration / args.rounds
    warmup = args.warmup / args.rounds
    say(f"\n(a)-(c) HTTP throughput: one gunicorn, {args.concurrency} connections, {args.rounds} interleaved rounds "
        f"of {warmup:g} s warm-up + {per_round:g} s per figure ({args.duration:g} s measured per figure)")
    wanted = {"a_insert": "a" in args.only, "a_read": "a" in args.only,
              "b_action_new": "b" in args.only or "c" in args.only, "c_action_replay": "c" in args.only}
    segments = {name: [] for name, _, _ in HTTP_FIGURES}
    keys_files = {}
    for round_no in range(args.rounds):
        for name, label, mode in HTTP_FIGURES:
            if not wanted[name]:
                continue
            extra = {}
            if mode == "baseline_insert":
                extra["prefix"] = f"{tag}bi{round_no}"
            elif mode == "action_new":
                extra.update(token=token, prefix=f"{tag}bnew{round_no}")
            elif mode == "baseline_read":
                if "baseline" not in keys_files:
                    with connection.cursor() as c:
                        c.execute("SELECT key FROM bench_baseline_baselinerow ORDER BY id LIMIT 5000")
                        keys_files["baseline"] = write_keys(logs / "keys-baseline.txt", [r[0] for r in c.fetchall()])
                extra["keys_file"] = keys_files["baseline"]
            elif mode == "action_replay":
                if "actions" not in keys_files:
                    with connection.cursor() as c:
                        c.execute("SELECT operation_key FROM ledger_action WHERE operation_key LIKE %s "
                                  "ORDER BY id LIMIT 5000", [f"{tag}bnew%"])
                        keys_files["actions"] = write_keys(logs / f"keys-{tag}actions.txt",
                                                           [r[0] for r in c.fetchall()])
                extra.update(token=token, keys_file=keys_files["actions"])
            monitor.start()
            report = stack.load(mode, concurrency=args.concurrency, duration=per_round, warmup=warmup, **extra)
            report["cpu"] = monitor.stop()
            report["ok_rps"] = ok_rps(report)
            check_statuses(report, f"{label} (round {round_no + 1})")
            segments[name].append(report)
            say(f"   round {round_no + 1}  {label:<46} {report['ok_rps']:>8.1f} req/s   "
                f"[{others_note(report['cpu'])}]")
    say("")
    for name, label, _ in HTTP_FIGURES:
        if segments[name]:
            results[name] = fig = combine(name, label, segments[name])
            lat, cpu = fig["latency_ms_median_of_rounds"], fig["cpu"]
            ms = fig["cpu_ms_per_request"]
            say(f"   {label:<46} {fig['ok_rps']:>8.1f} req/s   p50 {lat['p50']} ms  p99 {lat['p99']} ms")
            say(f"   {'':<46} CPU per request: server {ms['gunicorn']} ms, postgres {ms['postgres']} ms, "
                f"load generator {ms['load_generator']} ms; others used {cpu.get('others', 0):.2f} CPUs meanwhile")


def seal_cost(results):
    """The sealer's work for the events (b) wrote: off the request path, but not free."""
    from ledger.models import AuditEvent

    pending = AuditEvent.objects.filter(seq__isnull=True).count()
    started_cpu, started = time.process_time(), time.perf_counter()
    sealed = AuditEvent.objects.seal()
    seconds = time.perf_counter() - started
    results["audit_seal"] = {"events": sealed, "seconds": round(seconds, 3),
                             "ms_per_event": round(seconds / sealed * 1000, 4) if sealed else None,
                             "python_cpu_ms_per_event": round((time.process_time() - started_cpu) / sealed * 1000, 4)
                             if sealed else None}
    say(f"   sealing the audit chain afterwards (the sweeper's work, off the request path): {pending} events in "
        f"{seconds:.2f} s = {results['audit_seal']['ms_per_event']} ms per event")


def wait_for(predicate, timeout, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return None


# --- the figures ----------------------------------------------------------------------------------


def park_leftovers():
    """Housekeeping on the throwaway database between figures: actions queued by (b) and the
    probes must not be drained by (d)'s workers, nor drain jobs already in Redis run."""
    from django.db import connection

    with connection.cursor() as c:
        c.execute("UPDATE ledger_action SET status = 'cancelled', next_attempt_at = NULL WHERE status = 'queued'")
        # A kept database's (--database) outcomes to verify wait past the run.
        c.execute("UPDATE ledger_action SET next_attempt_at = 'infinity' WHERE status = 'unknown'")
        c.execute("UPDATE ledger_task SET state = 'cancelled', next_attempt_at = NULL WHERE state = 'queued'")
    flush_redis()


def figure_d(stack, token, args, results, monitor, tag=""):
    import django_rq
    from django.db.models import Count, Max, Min
    from rq import Worker

    from ledger.models import Action, AuditEvent

    n = args.actions
    say(f"\n(d) end to end: {n} actions recorded through the API, then 2 RQ workers (SimpleWorker) "
        "drain them against the sandbox")
    park_leftovers()
    intake = stack.load("action_new", token=token, prefix=f"{tag}e2e", concurrency=args.concurrency, count=n)
    check_statuses(intake, "(d) intake")
    say(f"   recorded {intake['statuses'].get('201', 0)} actions in {intake['seconds']} s "
        f"({intake['rps']} req/s, no workers running)")
    mine = Action.objects.filter(operation_key__startswith=f"{tag}e2e-")
    started_wall = datetime.now(UTC)
    started = time.monotonic()
    stack.start_worker("worker-d1")
    stack.start_worker("worker-d2")
    # CPU is counted from when both workers are up (their start-up is not per-action work).
    wait_for(lambda: Worker.count(connection=django_rq.get_connection("default")) >= 2, timeout=60, interval=0.02)
    monitor.start()
    done_before = mine.filter(status="succeeded").count()
    finished = wait_for(lambda: mine.filter(status="succeeded").count() >= n, timeout=180, interval=0.1)
    wall = time.monotonic() - started
    cpu = monitor.stop()
    stack.stop("worker-d1")
    stack.stop("worker-d2")
    statuses = {row["status"]: row["n"] for row in mine.order_by().values("status").annotate(n=Count("id"))}
    ids = [str(pk) for pk in mine.values_list("pk", flat=True)]
    first_claim = AuditEvent.objects.filter(object_type="ledger.action", verb="claimed", object_id__in=ids,
                                            occurred_at__gte=started_wall).aggregate(t=Min("occurred_at"))["t"]
    last_done = mine.filter(status="succeeded").aggregate(t=Max("updated_at"))["t"]
    done = statuses.get("succeeded", 0)
    busy = (last_done - first_claim).total_seconds() if first_claim and last_done else None
    rate = round(done / busy, 1) if busy else 0.0
    # CPU per action, whoever else shares the machine. Surety's own (`total`, what the CPU-bound
    # estimate of (d)/(a) divides by) is its workers, its gunicorn and its database's backends; the
    # provider's (its gunicorn and its database's backends) is counted apart, as it would run
    # elsewhere in production.
    in_window = max(done - done_before, 1)
    cpu_ms = {part: round(cpu.get(part, 0.0) * cpu["seconds"] / in_window * 1000, 3)
              for part in ("workers", "gunicorn", "postgres", "provider", "provider_postgres")}
    cpu_ms["total"] = round(cpu_ms["workers"] + cpu_ms["gunicorn"] + cpu_ms["postgres"], 3)
    cpu_ms["provider_total"] = round(cpu_ms["provider"] + cpu_ms["provider_postgres"], 3)
    results["d_end_to_end"] = {
        "actions": n, "succeeded": done, "statuses": statuses, "finished": bool(finished),
        "seconds_first_claim_to_last_success": busy and round(busy, 3),
        "seconds_including_worker_start": round(wall, 3), "ok_rps": rate,
        "rps_including_worker_start": round(done / wall, 1), "intake": intake, "cpu": cpu,
        "cpu_ms_per_request": cpu_ms,
    }
    if not finished:
        say(f"   ! not all actions succeeded within 180 s: {statuses}")
    say(f"   {'(d) actions succeeded per second (2 workers)':<44} {rate:>8.1f} actions/s   "
        f"({done} in {busy and round(busy, 2)} s from first claim; {round(done / wall, 1)}/s counting worker start)")
    say(f"   CPU per action: Surety {cpu_ms['total']} ms (workers {cpu_ms['workers']}, gunicorn {cpu_ms['gunicorn']}, "
        f"postgres {cpu_ms['postgres']}); the provider {cpu_ms['provider_total']} ms (gunicorn {cpu_ms['provider']}, "
        f"postgres {cpu_ms['provider_postgres']}); {others_note(cpu)}")


def figure_d_paired(stack, token, args, results, monitor, tag=""):
    """(d) in `--d-rounds` rounds, each set against a segment of the bare insert view measured
    right before it, as (a) measures it, and the median of the rounds' CPU-bound ratios.

    The machine's speed drifts from one minute to the next: on a quiet machine the provider,
    whose code and fresh database are the same in every run, took 6.2 to 7.5 ms of CPU per
    action in three runs of (d) a minute apart, and Surety's moved with it. (a) is measured a
    minute or more before (d), so a ratio of the two carried that drift; a round's two figures,
    seconds apart, share the machine's speed."""
    rounds = []
    for round_no in range(args.d_rounds):
        monitor.start()
        segment = stack.load("baseline_insert", concurrency=args.concurrency, duration=args.duration / args.rounds,
                             warmup=args.warmup / args.rounds, prefix=f"{tag}dbi{round_no}")
        segment["cpu"] = monitor.stop()
        segment["ok_rps"] = ok_rps(segment)
        check_statuses(segment, f"(a) insert before (d) round {round_no + 1}")
        baseline_ms = combine("a_insert", "", [segment])["cpu_ms_per_request"]["total"]
        figure_d(stack, token, args, one := {}, monitor, tag=f"{tag}d{round_no}")
        d = one["d_end_to_end"]
        d_ms = d["cpu_ms_per_request"]["total"]
        d["paired"] = {"baseline_insert_ms": baseline_ms, "cpu_bound_ratio": round(baseline_ms / d_ms, 3),
                       "surety_over_provider": round(d_ms / d["cpu_ms_per_request"]["provider_total"], 3)}
        d["paired"]["others_during_baseline"] = segment["cpu"].get("others", 0.0)
        say(f"   round {round_no + 1}: the insert view {baseline_ms} ms of CPU per request just before; "
            f"CPU-bound ratio {d['paired']['cpu_bound_ratio']}; Surety's CPU {d['paired']['surety_over_provider']}x "
            "the provider's")
        rounds.append(d)
    median = {part: round(statistics.median(r["cpu_ms_per_request"][part] for r in rounds), 3)
              for part in rounds[0]["cpu_ms_per_request"]}
    results["d_end_to_end"] = {
        "actions": sum(r["actions"] for r in rounds), "succeeded": sum(r["succeeded"] for r in rounds),
        "ok_rps": round(statistics.median(r["ok_rps"] for r in rounds), 1), "cpu_ms_per_request": median,
        "finished": all(r["finished"] for r in rounds),
        # What others used at the most, in a round or in the insert view's segment before it (the summary warns).
        "cpu": {"others": max(max(r["cpu"].get("others", 0.0), r["paired"]["others_during_baseline"]) for r in rounds)},
        "paired_cpu_bound_ratio_median": statistics.median(r["paired"]["cpu_bound_ratio"] for r in rounds),
        "rounds": rounds,
    }


def two_commits_and_enqueue(seconds=2.0):
    """The floor of a checkpointed step, in Python on the same database and Redis: INSERT
    (commit), UPDATE (commit), one RQ enqueue (as the doorbell does; to a queue no worker reads).
    Wall time per iteration, and CPU time (this process + its PostgreSQL backend)."""
    import django_rq
    from django.db import connection
    from django.utils import timezone
    from rq import Queue

    from bench.baseline.models import BaselineRow

    from .cpu import HZ, process_ticks

    queue = Queue("bench-baseline", connection=django_rq.get_connection("default"))
    with connection.cursor() as c:
        c.execute("SELECT pg_backend_pid()")
        backend = c.fetchone()[0]
    stem = f"step-floor-{time.monotonic_ns()}"
    i = 0
    backend_ticks, started_cpu, started = process_ticks(backend), time.process_time(), time.perf_counter()
    while time.perf_counter() - started < seconds:
        row = BaselineRow.objects.create(key=f"{stem}-{i}", payload={"i": i})
        row.status, row.updated_at = "written", timezone.now()
        row.save(update_fields=["status", "updated_at"])
        queue.enqueue("bench.baseline.jobs.nothing", job_timeout=180, result_ttl=0, failure_ttl=3600)
        i += 1
    elapsed = time.perf_counter() - started
    python_cpu = time.process_time() - started_cpu
    postgres_cpu = (process_ticks(backend) - backend_ticks) / HZ
    queue.empty()
    return {"iterations": i, "ms_per_iteration": round(elapsed / i * 1000, 3),
            "cpu_ms_per_iteration": {"python": round(python_cpu / i * 1000, 3),
                                     "postgres": round(postgres_cpu / i * 1000, 3),
                                     "total": round((python_cpu + postgres_cpu) / i * 1000, 3)}}


def figure_e(stack, token, args, results, monitor):
    from django.db.models import Max, Min

    from ledger.models import AuditEvent, Task

    m = args.noop_tasks
    say(f"\n(e) task step overhead: {m} `noop` tasks x 10 local steps on 1 worker")
    park_leftovers()
    floor_before = two_commits_and_enqueue()
    intake = stack.load("task_new", token=token, prefix="noop", concurrency=args.concurrency, count=m)
    check_statuses(intake, "(e) intake")
    mine = Task.objects.filter(task_id__startswith="noop-")
    started_wall = datetime.now(UTC)
    monitor.start()
    # One lane: the time a step takes, not how many steps of different tasks overlap.
    stack.start_worker("worker-e", DRAIN_LANES="1")
    finished = wait_for(lambda: mine.filter(state="succeeded").count() >= m, timeout=180, interval=0.1)
    cpu = monitor.stop()
    stack.stop("worker-e")
    floor_after = two_commits_and_enqueue()
    # The floor measured right before and right after the tasks ran, as one figure.
    floor = {"ms_per_iteration": round((floor_before["ms_per_iteration"] + floor_after["ms_per_iteration"]) / 2, 3),
             "cpu_ms_per_iteration": {k: round((floor_before["cpu_ms_per_iteration"][k]
                                                + floor_after["cpu_ms_per_iteration"][k]) / 2, 3)
                                      for k in ("python", "postgres", "total")},
             "before": floor_before, "after": floor_after}
    ids = {str(pk) for pk in mine.values_list("pk", flat=True)}
    events = AuditEvent.objects.filter(object_type="ledger.task", object_id__in=ids, occurred_at__gte=started_wall)
    step_times = {}
    for object_id, when in events.filter(verb="step_done").order_by("object_id", "occurred_at").values_list(
            "object_id", "occurred_at"):
        step_times.setdefault(object_id, []).append(when)
    gaps = [(b - a).total_seconds() * 1000 for times in step_times.values() for a, b in zip(times, times[1:])]
    span = events.aggregate(first=Min("occurred_at"), last=Max("occurred_at"))
    done = mine.filter(state="succeeded").count()
    total_s = (span["last"] - span["first"]).total_seconds() if span["first"] else None
    step_ms = round(statistics.median(gaps), 3) if gaps else None
    per_step_all_in = round(total_s / (done * 10) * 1000, 3) if total_s and done else None
    steps = max(done * 10, 1)
    step_cpu = {"worker": round(cpu.get("workers", 0.0) * cpu["seconds"] / steps * 1000, 3),
                "postgres": round(cpu.get("postgres", 0.0) * cpu["seconds"] / steps * 1000, 3)}
    step_cpu["total"] = round(step_cpu["worker"] + step_cpu["postgres"], 3)
    results["e_step_overhead"] = {
        "tasks": m, "succeeded": done, "finished": bool(finished),
        "ms_per_step_median": step_ms,
        "ms_per_step_p90": round(sorted(gaps)[int(0.9 * len(gaps))], 3) if gaps else None,
        "ms_per_step_including_task_overhead": per_step_all_in,
        "steps_per_second": round(done * 10 / total_s, 1) if total_s else None,
        "baseline_two_commits_one_enqueue": floor,
        "ratio_step_to_baseline": round(step_ms / floor["ms_per_iteration"], 2) if step_ms else None,
        "ratio_step_all_in_to_baseline": round(per_step_all_in / floor["ms_per_iteration"], 2)
        if per_step_all_in else None,
        "cpu": cpu, "cpu_ms_per_step_all_in": step_cpu,
        "ratio_cpu_per_step_to_baseline_cpu": round(step_cpu["total"] / floor["cpu_ms_per_iteration"]["total"], 2)
        if floor["cpu_ms_per_iteration"]["total"] else None,
    }
    if not finished:
        say(f"   ! only {done}/{m} noop tasks succeeded within 180 s")
    r = results["e_step_overhead"]
    say(f"   baseline: INSERT+commit, UPDATE+commit, 1 RQ enqueue, in Python   {floor['ms_per_iteration']:.3f} ms "
        f"(before {floor_before['ms_per_iteration']}, after {floor_after['ms_per_iteration']}); CPU "
        f"{floor['cpu_ms_per_iteration']['total']} ms (Python {floor['cpu_ms_per_iteration']['python']}, "
        f"postgres {floor['cpu_ms_per_iteration']['postgres']})")
    say(f"   {'(e) time per step (median gap between steps)':<44} {step_ms:>8.3f} ms   "
        f"= {r['ratio_step_to_baseline']}x the baseline")
    say(f"   {'    per step incl. claim/finish of the task':<44} {per_step_all_in:>8.3f} ms   "
        f"= {r['ratio_step_all_in_to_baseline']}x the baseline; {r['steps_per_second']} steps/s")
    say(f"   CPU per step (all in): worker {step_cpu['worker']} ms, postgres {step_cpu['postgres']} ms = "
        f"{r['ratio_cpu_per_step_to_baseline_cpu']}x the baseline's CPU; {others_note(cpu)}")


def figure_f(stack, token, args, results):
    import httpx
    from django.conf import settings

    from ledger.models import AuditEvent, Task

    lease = float(settings.LEASE_SECONDS)
    say(f"\n(f) SIGKILL of a worker mid-task -> task running again (LEASE_SECONDS={lease:g}, sweeper every 0.5 s)")
    park_leftovers()
    order = "ORD-KILL-1"
    client = httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    provider = httpx.Client(base_url=f"{stack.provider_url}/sandbox/v1", timeout=30,
                            headers={"Authorization": f"Bearer {settings.SANDBOX_API_KEY}"})

    def at_provider(kind, **filters):
        return len(provider.get(f"/{kind}", params=filters).raise_for_status().json()["data"])

    provider.post("/orders", json={"order_id": order, "customer": "CUST-KILL", "amount": "25.00",
                                            "currency": "EUR"}).raise_for_status()
    # The refund commits at the sandbox, then the answer stalls (SANDBOX_TIMEOUT_SLEEP) longer
    # than the worker waits (CONNECTOR_TIMEOUT): the worker is killed inside that wait.
    provider.post("/faults", json={"target": order, "fault": "timeout_after_commit", "times": 1}
                ).raise_for_status()
    stack.start_sweeper(0.5)
    victim = stack.start_worker("worker-f1")
    posted = client.post("/api/v1/tasks", headers={"Idempotency-Key": "kill-refund-1"}, json={
        "workflow": "refund", "input": {"order_id": order, "amount": "25.00", "currency": "EUR",
                                        "customer": "CUST-KILL"}})
    posted.raise_for_status()
    task = Task.objects.get(task_id="kill-refund-1")
    if not wait_for(lambda: at_provider("refunds", order_id=order), timeout=60, interval=0.02):
        raise RuntimeError("the refund never reached the sandbox; see the worker-f1 log")
    time.sleep(0.5)  # well inside the stall: the worker is waiting for the provider's answer
    task.refresh_from_db()
    owner, lease_until = task.lease_owner, task.lease_expires_at
    killed_wall = datetime.now(UTC)
    killed = time.monotonic()
    stack.kill("worker-f1")
    stack.start_worker("worker-f2")

    def resumed():
        t = Task.objects.filter(pk=task.pk).values("state", "lease_owner").first()
        return t["state"] == "running" and t["lease_owner"] not in ("", owner)

    came_back = wait_for(resumed, timeout=lease + 30, interval=0.02)
    resumed_after = time.monotonic() - killed if came_back else None
    events = AuditEvent.objects.filter(object_type="ledger.task", object_id=str(task.pk), occurred_at__gte=killed_wall)
    taken_back = events.filter(verb="lease_expired").order_by("id").values_list("occurred_at", flat=True).first()
    claimed = events.filter(verb="claimed").order_by("id").values_list("occurred_at", flat=True).first()

    def since_kill(when):
        return round((when - killed_wall).total_seconds(), 3) if when else None

    finished = wait_for(lambda: Task.objects.filter(pk=task.pk, state__in=["succeeded", "failed", "dead_lettered"])
                        .exists(), timeout=60, interval=0.1)
    settled_after = time.monotonic() - killed if finished else None
    task.refresh_from_db()
    refunds = at_provider("refunds", order_id=order)
    messages = at_provider("messages", operation_key="kill-refund-1:notify_customer:v1")
    stack.stop("worker-f2")
    stack.stop("sweeper")
    client.close()
    provider.close()
    target = lease + 2
    seconds = since_kill(claimed) if claimed else resumed_after
    results["f_kill_to_resume"] = {
        "lease_seconds": lease, "killed_worker": owner, "victim_pid": victim.pid,
        "lease_left_at_kill_s": round((lease_until - killed_wall).total_seconds(), 3),
        "kill_to_lease_taken_back_s": since_kill(taken_back), "kill_to_claimed_s": since_kill(claimed),
        "kill_to_seen_running_s": resumed_after and round(resumed_after, 3),
        "seconds": seconds, "target_at_most": target, "pass": seconds is not None and seconds <= target,
        "task_final_state": task.state, "task_finished_within_60s": bool(finished),
        "kill_to_task_finished_s": settled_after and round(settled_after, 3),
        "sandbox_refunds_for_order": refunds, "sandbox_messages_for_task": messages,
    }
    r = results["f_kill_to_resume"]
    say(f"   lease left at the kill {r['lease_left_at_kill_s']} s; taken back by the sweeper after "
        f"{r['kill_to_lease_taken_back_s']} s; claimed by the fresh worker after {r['kill_to_claimed_s']} s")
    say(f"   task then {task.state} ({r['kill_to_task_finished_s']} s after the kill: the stalled refund is verified "
        f"once its lease plus CONNECTOR_TIMEOUT has passed); refunds at the sandbox for the order: {refunds} "
        f"(must be 1); confirmation messages: {messages}")


# --- the run ----------------------------------------------------------------------------------------


POOLED_FIGURES = [("b_action_new", "(b) POST actions, new keys"), ("c_action_replay", "(c) POST actions, replayed keys"),
                  ("d_end_to_end", "(d) actions end to end, 2 workers")]
# The ways `--pooler` measures (b)-(d) again, beside the direct figures: without prepared statements
# alone (what the setting costs), then through PgBouncer as well (what the pooler adds).
POOLED_WAYS = {"unprepared": "direct, DATABASE_POOLER=transaction (nothing prepared)",
               "through_pgbouncer": "through PgBouncer (pool_mode = transaction), DATABASE_POOLER=transaction"}


def figures_through_the_pooler(stack, token, args, results, logs):
    """(b)-(d) once more each way of POOLED_WAYS: a second gunicorn, and (d)'s workers, with
    DATABASE_POOLER=transaction, straight to PostgreSQL and then with DATABASE_URL at PgBouncer,
    on the same database and provider (this process still talks to PostgreSQL directly). Each
    figure is then set beside its direct one: throughput, and CPU per request (PgBouncer's
    counted as the server's)."""
    from .pgbouncer import PgBouncer

    ratios = {}
    with PgBouncer(pool_size=POOL_SIZE) as bouncer:
        envs = {"unprepared": {"DATABASE_POOLER": "transaction"},
                "through_pgbouncer": {"DATABASE_URL": bouncer.url(DB_NAME), "DATABASE_POOLER": "transaction"}}
        for way, label in POOLED_WAYS.items():
            say(f"\n--pooler: (b)-(d) again, {label}" + (f", {POOL_SIZE} server connections" if "PgBouncer" in label
                                                        else ""))
            again = Stack(logs, gunicorn_workers=args.gunicorn_workers, gunicorn_threads=args.gunicorn_threads,
                          provider_url=stack.provider_url, env=envs[way])
            # The provider is counted as in the direct (d); PgBouncer, where it serves, as this server.
            others = {pid: part for pid, part in stack.named_pids().items() if part == "provider"}
            if way == "through_pgbouncer":
                others[bouncer.process.pid] = "gunicorn"
            monitor = CpuMonitor(lambda again=again, others=others: {**again.named_pids(), **others},
                                 databases={PROVIDER_DB_NAME: "provider_postgres"})
            results[way] = figures = {}
            try:
                again.start_server()
                figure_a_b_c(again, token, argparse.Namespace(**{**vars(args), "only": "bc"}), figures, logs, monitor,
                             tag=f"{way}-")
                if "d" in args.only:
                    figure_d(again, token, args, figures, monitor, tag=f"{way}-")
            finally:
                again.stop_all()
            for name, _ in POOLED_FIGURES:
                if name in figures and name in results and results[name]["ok_rps"]:
                    direct_ms, again_ms = (r[name].get("cpu_ms_per_request", {}).get("total") for r in (results, figures))
                    ratios.setdefault(way, {})[name] = {
                        "throughput": round(figures[name]["ok_rps"] / results[name]["ok_rps"], 3),
                        "cpu_per_request": round(again_ms / direct_ms, 3) if direct_ms and again_ms else None}
    return ratios


def summary(results, pooled=None):
    say("\n" + "=" * 78)
    say("SUMMARY")
    rows = [("(a) baseline insert (2 commits)", "a_insert", "req/s"), ("(a) baseline read", "a_read", "req/s"),
            ("(b) POST actions, new keys", "b_action_new", "req/s"),
            ("(c) POST actions, replayed keys", "c_action_replay", "req/s"),
            ("(d) actions end to end, 2 workers", "d_end_to_end", "actions/s")]
    for label, name, unit in rows:
        if name in results:
            say(f"  {label:<40} {results[name]['ok_rps']:>9.1f} {unit}")
    ratios = {}
    for ratio, (num, den, target) in TARGETS.items():
        if num in results and den in results and results[den]["ok_rps"]:
            value = round(results[num]["ok_rps"] / results[den]["ok_rps"], 3)
            ratios[ratio] = {"value": value, "target_at_least": target, "pass": value >= target}
            say(f"  ratio {ratio:<34} {value:>9.3f}   target >= {target:<5} {'PASS' if value >= target else 'MISS'}")
            num_ms = results[num].get("cpu_ms_per_request", {}).get("total")
            den_ms = results[den].get("cpu_ms_per_request", {}).get("total")
            if num_ms and den_ms:
                ratios[ratio]["cpu_bound_estimate"] = round(den_ms / num_ms, 3)
                say(f"        {'':<34} {den_ms / num_ms:>9.3f}   (CPU-bound estimate: CPU ms per request "
                    f"{den_ms} / {num_ms}; unaffected by others' load)")
                provider_ms = results[num]["cpu_ms_per_request"].get("provider_total")
                paired = results[num].get("paired_cpu_bound_ratio_median")
                if paired:  # (d): each round against the insert view measured right before it
                    ratios[ratio]["cpu_bound_paired_median"] = paired
                    each = ", ".join(str(r["paired"]["cpu_bound_ratio"]) for r in results[num]["rounds"])
                    say(f"        {'':<34} {paired:>9.3f}   (the same per round, against the insert view measured "
                        f"just before it: median of {each})")
                if provider_ms:  # (d): the same with the provider's CPU counted as Surety's
                    with_provider = round(den_ms / (num_ms + provider_ms), 3)
                    ratios[ratio]["cpu_bound_estimate_with_provider"] = with_provider
                    say(f"        {'':<34} {with_provider:>9.3f}   (the same, counting the provider's "
                        f"{provider_ms} ms too, as if it ran on this machine)")
    others = [fig["cpu"].get("others", 0) for fig in results.values() if isinstance(fig, dict) and "cpu" in fig]
    if others and max(others) > 0.2:
        say(f"  ! other processes used up to {max(others):.2f} of {os.cpu_count()} CPUs during these measurements: "
            "throughputs understate a quiet machine; compare the CPU-bound estimates")
    if "e_step_overhead" in results:
        e = results["e_step_overhead"]
        say(f"  (e) ms per noop step (median)            {e['ms_per_step_median']:>9.3f} ms  vs "
            f"{e['baseline_two_commits_one_enqueue']['ms_per_iteration']:.3f} ms for 2 commits + 1 enqueue "
            f"({e['ratio_step_to_baseline']}x); all-in {e['ms_per_step_including_task_overhead']} ms; "
            f"CPU per step {e['ratio_cpu_per_step_to_baseline_cpu']}x the baseline's")
    if "f_kill_to_resume" in results:
        f = results["f_kill_to_resume"]
        say(f"  (f) SIGKILL -> task running again        {f['seconds']:>9.3f} s   target <= {f['target_at_most']:g} s "
            f"(lease + 2)   {'PASS' if f['pass'] else 'MISS'}")
    for way, label in POOLED_WAYS.items():
        for name, figure in (pooled or {}).get(way, {}).items():
            direct, again, ratio = results[name], results[way][name], figure
            say(f"  {dict(POOLED_FIGURES)[name]}, {label.split(' (')[0]} / direct: {ratio['throughput']:.3f} "
                f"({again['ok_rps']} / {direct['ok_rps']}); CPU per request {ratio['cpu_per_request']}x "
                f"({again['cpu_ms_per_request']['total']} / {direct['cpu_ms_per_request']['total']} ms)")
    return ratios


def print_probe(shapes, timing, noop):
    say("\nper request, in-process (Django test client, one at a time; no HTTP, no gunicorn; medians of 200):")
    say(f"  {'request':<18} {'status':>6} {'queries':>8} {'commits':>8} {'wall ms':>9} {'Python CPU ms':>14}")
    for name, shape in shapes.items():
        t = timing.get(name, {})
        say(f"  {name:<18} {shape['status']:>6} {shape['queries']:>8} {shape['commits']:>8} "
            f"{t.get('wall_ms', ''):>9} {t.get('cpu_ms', ''):>14}")
    say(f"  a noop task run in a worker ({noop['steps']} local steps, {noop['state']}): claim "
        f"{noop['claim']['queries']} queries / {noop['claim']['commits']} commit(s); run {noop['run']['queries']} "
        f"queries / {noop['run']['commits']} commits = {noop['per_step']['queries']} queries and "
        f"{noop['per_step']['commits']} commits per step")
    for name in ("action_new", "action_replay"):
        say(f"  SQL of {name}:")
        for sql in shapes[name]["sql"]:
            say(f"    - {sql[:150]}")
    say("  SQL of a noop task run, first statements:")
    for sql in noop["sql_first_step"]:
        say(f"    - {sql[:150]}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["pages"]:  # `python -m bench pages [options]`: the dashboard pages section alone
        from . import pages

        pages.main(argv[1:])
        return
    if argv[:1] == ["scale"]:  # every figure at 1M and at 10M actions (bench/scale.py)
        from . import scale

        scale.main(argv[1:])
        return
    if argv[:1] == ["archive"]:  # what archive_expired costs, and the space it gives back (bench/archive.py)
        from . import archive

        archive.main(argv[1:])
        return
    if argv[:1] == ["seal"]:  # the sealer's throughput against the intake's (bench/seal.py)
        from . import seal

        seal.main(argv[1:])
        return
    if argv[:1] == ["mechanisms"]:  # each speed mechanism against the plain code (bench/mechanisms.py)
        from . import mechanisms

        mechanisms.main(argv[1:])
        return
    if argv[:1] == ["health_checks"]:  # (b) and (c) per way of keeping connections (bench/health_checks.py)
        from . import health_checks

        health_checks.main(argv[1:])
        return
    if argv[:1] == ["sharded"]:  # what the shards' router costs a request (bench/sharded.py)
        from . import sharded

        sharded.main(argv[1:])
        return
    if argv[:1] == ["partitioned_writes"]:  # the hot statements on a partitioned ledger (bench/partitioned_writes.py)
        from . import partitioned_writes

        partitioned_writes.main(argv[1:])
        return
    args = parse_args(argv)
    if set(args.only) <= {"p"}:
        from . import pages

        pages.main(["--out", str(Path(args.out).with_name("bench-pages.json"))])
        return
    os.chdir(ROOT)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    logs = out.parent / "bench-logs"
    logs.mkdir(exist_ok=True)
    began = time.monotonic()
    say(f"bench: fresh database surety_bench, Redis DB 15, gunicorn -k gthread -w {args.gunicorn_workers} "
        f"--threads {args.gunicorn_threads}, load generator: bench/load.py (asyncio, separate process); "
        f"logs in {logs}/")
    lanes = int(os.environ.get("DRAIN_LANES", 4))
    # Two gunicorns (Surety's, the provider's) + workers, sweeper, this process.
    needed = 2 * args.gunicorn_workers * args.gunicorn_threads + 2 * (lanes + 1) + 4
    free, limit = wait_for_connection_slots(needed)
    if free < needed:
        say(f"   ! only {free} of {limit} PostgreSQL connections are free (others' test runs hold the rest); "
            f"this run needs about {needed} and may fail with 'too many clients'")
    flush_redis()
    if args.database:  # the server, the workers and this process all read STACK_ENV
        STACK_ENV["DATABASE_URL"] = database_url(args.database)
    else:
        reset_database()
    reset_database(PROVIDER_DB_NAME)
    stack = Stack(logs, gunicorn_workers=args.gunicorn_workers, gunicorn_threads=args.gunicorn_threads,
                  provider_database=PROVIDER_DB_NAME)
    results = {}
    try:
        stack.migrate()
        # A kept database (--database) holds earlier runs' agent and keys: this run's are its own.
        tag = f"r{int(time.time())}-" if args.database else ""
        token = stack.create_agent(f"bench{tag.rstrip('-')}", GRANTS)
        setup_django()
        stack.start_server()
        stack.start_provider()
        say(f"   ready after {time.monotonic() - began:.1f} s (migrated, agent created, server up at {stack.url}, "
            f"the provider at {stack.provider_url})")
        monitor = CpuMonitor(stack.named_pids, database=args.database or DB_NAME,
                             databases={PROVIDER_DB_NAME: "provider_postgres"})
        figure_a_b_c(stack, token, args, results, logs, monitor, tag)
        seal_cost(results)
        from . import probe

        shapes = probe.query_counts(token)
        cpu = probe.cpu_per_request(token)
        noop = probe.noop_task_counts(token)
        results["probe"] = {"per_request": shapes, "in_process_ms_per_request": cpu, "noop_task_run": noop}
        print_probe(shapes, cpu, noop)
        if args.profile:
            for name, text in probe.profile(token).items():
                say(f"\ncProfile of {name} (in-process):\n{text}")
        if "d" in args.only:
            figure_d_paired(stack, token, args, results, monitor, tag)
        if "e" in args.only:
            figure_e(stack, token, args, results, monitor)
        if "f" in args.only:
            figure_f(stack, token, args, results)
        pooled = figures_through_the_pooler(stack, token, args, results, logs) if args.pooler else None
    finally:
        stack.stop_all()
    ratios = summary(results, pooled)
    if pooled:
        ratios["over_direct"] = pooled
    document = {
        "when": datetime.now(UTC).isoformat(), "seconds": round(time.monotonic() - began, 1),
        "setup": {"gunicorn": f"-k gthread -w {args.gunicorn_workers} --threads {args.gunicorn_threads}",
                  "concurrency": args.concurrency, "duration_s": args.duration, "warmup_s": args.warmup,
                  "rounds": args.rounds,
                  "load_generator": "bench/load.py (asyncio HTTP/1.1 keep-alive, separate process)",
                  "cpus": os.cpu_count(), "settings": "bench.settings", "env": STACK_ENV},
        "results": results, "ratios": ratios,
    }
    write_results(out, document)
    say(f"\nwritten to {out} in {document['seconds']} s")
    if "p" in args.only:
        # (p) the dashboard's list and search pages at 1,000 rows and at volume (bench/pages.py),
        # after the stack above is stopped, so nothing of it competes for the CPU.
        from . import pages

        say("\n(p) dashboard pages at 1,000 rows and at volume (`python -m bench pages --help` for its options)")
        pages.main(["--out", str(out.with_name("bench-pages.json"))])


if __name__ == "__main__":
    main()
