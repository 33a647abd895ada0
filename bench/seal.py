"""`python -m bench seal`: the sealer's throughput against the intake's, at 10 and 100 writers.

The audit chain has one sealer at a time (ledger/audit.py: one lock, one chain), while every
request writes its events in its own transaction. This measures whether one sealer keeps up:

1. A fresh database `surety_bench_seal` (its own, so that it runs beside `make bench`), migrated.
2. For each number of writers N (`--writers 10,100`): N threads over up to 4 processes, each
   writing one audit event per transaction (`AuditEvent.objects.record`, what an action's
   intake writes) as fast as it can; PostgreSQL's connections are few (max_connections), so
   the threads of a process share Django's psycopg pool, at most MOST_CONNECTIONS in all, as
   they would behind a pooler.
3. Meanwhile in this process one sealer thread runs `AuditEvent.objects.seal()` back to back
   (the sweeper's step, without its interval), and the backlog is read every 0.25 s: the
   unsealed events and the age of the oldest (the seal's lag).
4. After a warm-up, for `--duration` seconds: events written/s (ids allocated), events
   sealed/s (seqs given), their ratio, the lag's median and maximum. A sealer that keeps up
   seals what is written, so then its capacity is measured: held off `--hold` seconds (the
   seal's lock taken, as a slow sealer would), it is timed while it works the backlog off
   with the writers still writing: events sealed/s then, and that over the intake's.

Prints one line per N and writes artifacts/bench-seal.json. About 35 s per N with the defaults.
"""

import argparse
import multiprocessing
import os
import statistics
import sys
import threading
import time

from .results import write_results
from .stack import ROOT, STACK_ENV, connection_slots, database_url, reset_database

DB_NAME = "surety_bench_seal"
PROCESSES = 4
# The writers' connections at most: half of the server's default max_connections (100), which
# other sessions share; past it, writers wait for a pooled connection as behind a pooler.
MOST_CONNECTIONS = 48
ENV = {**STACK_ENV, "DATABASE_URL": database_url(DB_NAME)}


def say(*parts):
    print(*parts, flush=True)


def setup_django(pool=None):
    os.environ.update(ENV)
    if pool:
        os.environ["BENCH_DATABASE_POOL"] = str(pool)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def writer_process(threads, pool, stop):
    """`threads` writers, one event per transaction each, until `stop` is set."""
    setup_django(pool)
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction

    from ledger.models import AuditEvent

    subject = get_user_model().objects.get(username="bench-seal")
    connection.close()

    def write():
        n = 0
        while not stop.is_set():
            with transaction.atomic():
                AuditEvent.objects.record(actor="system:bench", verb="bench_wrote", obj=subject, after={"n": n})
            connection.close()  # back to the pool, for the process's other writers
            n += 1

    workers = [threading.Thread(target=write) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def top():
    """(the newest id, the newest seq): events written and sealed so far."""
    from django.db import connection

    with connection.cursor() as c:
        c.execute("SELECT (SELECT max(id) FROM ledger_auditevent), (SELECT max(seq) FROM ledger_auditevent)")
        written, sealed = c.fetchone()
    return written or 0, sealed or 0


def backlog():
    """(unsealed events, seconds the oldest has waited): the seal's lag."""
    from django.db import connection

    with connection.cursor() as c:
        c.execute("SELECT count(*), coalesce(extract(epoch FROM now() - min(occurred_at)), 0) "
                  "FROM ledger_auditevent WHERE seq IS NULL")
        count, age = c.fetchone()
    return count, float(age)


def wait_until(predicate, timeout, interval=0.1):
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(interval)


def measure(writers, args, free_slots):
    """The figures of `writers` writers (the steps of the module's docstring, 2 to 4)."""
    from django.db import connection, transaction

    from ledger.locks import AUDIT_SEAL, take_turns
    from ledger.models import AuditEvent

    processes = min(PROCESSES, writers)
    threads = [writers // processes + (1 if i < writers % processes else 0) for i in range(processes)]
    pool = max(1, min(max(threads), free_slots // processes))
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    children = [ctx.Process(target=writer_process, args=(t, pool, stop)) for t in threads]
    for child in children:
        child.start()
    done = threading.Event()

    def seal_back_to_back():
        while not done.is_set():
            AuditEvent.objects.seal()
        connection.close()

    sealer = threading.Thread(target=seal_back_to_back)
    sealer.start()
    try:
        first = top()[0]
        wait_until(lambda: top()[0] > first, timeout=60)  # the writers' processes are up
        time.sleep(args.warmup)
        # The steady state: the sealer keeping up (or not) with the writers.
        samples, started, (written0, sealed0) = [], time.monotonic(), top()
        while time.monotonic() < started + args.duration:
            samples.append(backlog())
            time.sleep(0.25)
        seconds, (written1, sealed1) = time.monotonic() - started, top()
        # Its capacity under the same load: held off for a while (this transaction takes the
        # seal's lock, as a slow sealer would), then timed while it works the backlog off.
        with transaction.atomic():
            take_turns(AUDIT_SEAL)
            time.sleep(args.hold)
        resumed, (_, sealed_from), held = time.monotonic(), top(), backlog()[0]
        steady = max(100, max(count for count, _ in samples))
        wait_until(lambda: backlog()[0] <= steady, timeout=30)
        drained, (_, sealed_to) = time.monotonic() - resumed, top()
    finally:
        stop.set()
        for child in children:
            child.join(timeout=30)
        done.set()
        sealer.join()
    written, sealed = (written1 - written0) / seconds, (sealed1 - sealed0) / seconds
    lags, backlogs = [age for _, age in samples], [count for count, _ in samples]
    capacity = (sealed_to - sealed_from) / drained
    return {"writers": writers, "processes": processes, "connections": sum(min(t, pool) for t in threads),
            "seconds": round(seconds, 2), "written_per_s": round(written, 1), "sealed_per_s": round(sealed, 1),
            "sealed_over_written": round(sealed / written, 3) if written else None,
            "lag_s_median": round(statistics.median(lags), 3), "lag_s_max": round(max(lags), 3),
            "backlog_median": statistics.median(backlogs), "backlog_max": max(backlogs),
            "held_s": args.hold, "backlog_after_hold": held, "drain_s": round(drained, 2),
            "capacity_sealed_per_s": round(capacity, 1),
            "capacity_over_written": round(capacity / written, 3) if written else None,
            "load_average_1m": round(os.getloadavg()[0], 2)}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench seal", description=__doc__.split("\n\n")[0])
    p.add_argument("--writers", default="10,100", help="numbers of concurrent writers, comma-separated")
    p.add_argument("--duration", type=float, default=20.0, help="seconds measured per number (default 20)")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of warm-up before each (default 3)")
    p.add_argument("--hold", type=float, default=5.0,
                   help="seconds the sealer is held off before its capacity is timed (default 5)")
    p.add_argument("--out", default="artifacts/bench-seal.json")
    args = p.parse_args(argv)
    os.chdir(ROOT)
    reset_database(DB_NAME)
    setup_django()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    get_user_model().objects.create(username="bench-seal")
    say(f"bench seal: database {DB_NAME}, one event per transaction, {os.cpu_count()} CPUs; the sealer runs "
        "back to back in this process while the writers write")
    results = []
    for writers in [int(n) for n in args.writers.split(",")]:
        free, _ = connection_slots()
        figure = measure(writers, args, min(MOST_CONNECTIONS, free - 20))  # room for others' sessions
        results.append(figure)
        say(f"  {writers:>4} writers ({figure['connections']} connections): written {figure['written_per_s']:>8.1f}/s"
            f"  sealed {figure['sealed_per_s']:>8.1f}/s  ratio {figure['sealed_over_written']:.3f}  "
            f"lag median {figure['lag_s_median']:.3f} s, max {figure['lag_s_max']:.3f} s "
            f"(backlog median {figure['backlog_median']}, max {figure['backlog_max']})")
        say(f"  {'':>4} held off {figure['held_s']:g} s ({figure['backlog_after_hold']} events waiting), it sealed "
            f"{figure['capacity_sealed_per_s']}/s while the writers went on = {figure['capacity_over_written']}x "
            f"the intake, back under the steady backlog in {figure['drain_s']} s "
            f"[load average {figure['load_average_1m']} on {os.cpu_count()} CPUs]")
    out = write_results(args.out, {"cpus": os.cpu_count(), "duration_s": args.duration, "results": results})
    say(f"written to {out}")
