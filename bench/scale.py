"""`python -m bench scale` (`make bench scale`): the figures at 1M and at 10M actions, and how each grows.

Two databases, loaded once and kept (bench/scale_load.py): `surety_scale_1m` (seed_volume, 1M
actions over 90 days) and `surety_scale` (the same grown ten times in SQL: 10M). Then, on each:

  summaries  the sweeper's step summarising every closed day of the what-if's 90 (approvals.summaries);
  what-if    bench/whatif.py as it is (POST /policies/whatif over 7, 30 and 90 days), from the summaries;
  from rows  the same 90-day counts read from every day's rows (the what-if before its summaries), and
             with a covering index for it, with what that index costs each insert (`--covering`);
  analytics  approvals.analytics.decision_analytics (the analytics page's figures, 30 days);
  pages      bench/pages.py with the 1M database as its small side and the 10M one as its volume;
  (b)-(d)    bench/__main__.py's figures on a stack over each database (`--database`, the rows it writes kept).

Each is printed at 1M and 10M with its growth (10M / 1M); everything goes to artifacts/bench-scale.json.
`--only` picks sections (e.g. `--only whatif,analytics`). The machine is shared: the load runs
once, and the sections that use the shared bench databases (b-d) run under the bench lock.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from . import scale_load
from .pages import DJANGO_ENV, PYTHON, ROOT, db_url, row_counts, say

SECTIONS = ("summaries", "whatif", "rows", "analytics", "pages", "bcd")
TAG = "@@bench-scale "
LOCK = "/tmp/surety-bench.lock"


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=",".join(SECTIONS), help=f"sections, comma-separated (default all: {SECTIONS})")
    p.add_argument("--covering", action="store_true",
                   help="also build the covering index for the rows' what-if (in a transaction rolled back; "
                        "about a minute at 10M) and time inserts with and without it")
    p.add_argument("--requests", type=int, default=5, help="timed requests per what-if case and page (default 5)")
    p.add_argument("--out", default="artifacts/bench-scale.json")
    return p.parse_args(argv)


# --- children: one process per database, Django set up on it --------------------------------------


def child(database, name, *args):
    """Run `name` (a function below) in a process of its own on `database`; its JSON answer."""
    env = {**os.environ, "DATABASE_URL": db_url(database), **DJANGO_ENV}
    done = subprocess.run([PYTHON, "-m", "bench.scale", "--child", name, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    answers = [line[len(TAG):] for line in done.stdout.splitlines() if line.startswith(TAG)]
    if done.returncode != 0 or not answers:
        raise RuntimeError(f"bench scale: {name} on {database} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(answers[-1])


def timed(function, n):
    """Wall ms of n calls after one untimed; their median and max."""
    function()
    times = []
    for _ in range(n):
        started = time.perf_counter()
        function()
        times.append((time.perf_counter() - started) * 1000)
    return {"p50_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1), "n": n}


def summarise_all():
    """The sweeper's step until no closed day is left to summarise."""
    from django.db import connection

    from approvals.models import ActionSummary, SummaryDay
    from approvals.summaries import summarise_due

    started, days = time.perf_counter(), 0
    while done := summarise_due():
        days += done
    seconds = time.perf_counter() - started
    with connection.cursor() as cursor:  # as autovacuum would soon: the summaries are read by index alone
        cursor.execute(f"VACUUM (ANALYZE) {ActionSummary._meta.db_table}")
    return {"days": days, "seconds": round(seconds, 1), "s_per_day": round(seconds / days, 2) if days else None,
            "summary_days": SummaryDay.objects.count(), "summary_rows": ActionSummary.objects.count()}


def analytics(n):
    from approvals.analytics import decision_analytics

    return timed(decision_analytics, int(n))


def from_rows(covering):
    """The 90-day counts of bench/whatif.py's proposal read from every day's rows; with
    `covering`, again with a covering index, and the cost of an insert with and without it."""
    from django.db import connection, transaction

    from approvals.intake import rule_for
    from approvals.whatif import MAX_DAYS, Proposal, _from_rows, _one_large_read, window_start

    from .whatif import PROPOSED

    proposal = Proposal(PROPOSED["action_type"], PROPOSED["currency"],
                        *(Decimal(PROPOSED[name]) for name in ("max_amount", "dual_approval_above",
                                                               "daily_customer_total")))
    current = rule_for(proposal.action_type, proposal.currency)
    since = window_start(MAX_DAYS)

    def read():
        with transaction.atomic():
            _one_large_read()
            for day in range(MAX_DAYS):
                _from_rows(proposal, current, since + timedelta(days=day))

    result = {"rows_90_days": timed(read, 1)}
    if covering != "yes":
        return result
    with transaction.atomic():
        result["insert_ms_without"] = inserts(connection)
        started = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the inserts' foreign keys, checked before the index
            cursor.execute("CREATE INDEX bench_whatif_covering ON ledger_action (action_type, currency, created_at) "
                           "INCLUDE (customer, amount, status, supersedes_id)")
            cursor.execute("ANALYZE ledger_action")
        result["covering_build_s"] = round(time.perf_counter() - started, 1)
        result["rows_90_days_covering"] = timed(read, 1)
        result["insert_ms_with"] = inserts(connection)
        transaction.set_rollback(True)
    return result


def inserts(connection, n=2000):
    """Wall ms per single-row INSERT of an action (a copy of a recent one under a new key), as the intake writes one."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT max(id) FROM ledger_action")
        newest = cursor.fetchone()[0]
        tag = time.monotonic_ns()
        started = time.perf_counter()
        for i in range(n):
            cursor.execute(
                "INSERT INTO ledger_action (operation_key, fingerprint, action_type, target, customer, params, amount,"
                " currency, decision_id, agent_id, status, attempts, external_ref, evidence, lease_owner, fence,"
                " created_at, updated_at, approved_fingerprint) SELECT %s, fingerprint, action_type, %s, customer,"
                " params, amount, currency, '', agent_id, 'cancelled', 0, '', evidence, '', 0, now(), now(), ''"
                " FROM ledger_action WHERE id = %s", [f"bench-insert-{tag}-{i}", f"bench-{tag}-{i}", newest - i % 1000])
        return round((time.perf_counter() - started) * 1000 / n, 3)


CHILDREN = {"summarise": summarise_all, "analytics": analytics, "rows": from_rows}


def serve_child(name, args):
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    print(TAG + json.dumps(CHILDREN[name](*args), default=str), flush=True)


# --- the run ------------------------------------------------------------------------------------------


def run(module, argv, locked=False):
    """A bench module of its own (`python -m bench.pages ...`), its output passed on; `locked`:
    it uses the bench databases others share (surety_bench, Redis DB 15), so it waits for their lock."""
    command = [PYTHON, "-m", module, *argv]
    if locked:
        command = ["flock", LOCK, *command]
    say(f"   $ {' '.join(command)}")
    subprocess.run(command, cwd=ROOT, check=True)


def growth(at_1m, at_10m):
    return round(at_10m / at_1m, 2) if at_1m else None


def main(argv=None):
    args = parse_args(argv if argv is not None else sys.argv[1:])
    os.chdir(ROOT)
    only = set(args.only.split(","))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    timings = {}
    say(f"bench scale: {scale_load.ONE_M} (1M actions) and {scale_load.TEN_M} (10M), loaded once and kept")
    scale_load.ensure(timings)
    databases = {"1M": scale_load.ONE_M, "10M": scale_load.TEN_M}
    results = {"sizes": {label: row_counts(name) for label, name in databases.items()}}
    for label, counts in results["sizes"].items():
        say(f"   {label}: " + ", ".join(f"{t} {n:,}" for t, n in counts.items()))
    rows = []  # (figure, 1M, 10M, unit)
    if "summaries" in only:
        say("\nsummaries: the sweeper's step over every closed day of the last 90")
        for label, name in databases.items():
            s = results.setdefault("summaries", {})[label] = child(name, "summarise")
            say(f"   {label}: {s['days']} days summarised in {s['seconds']} s ({s['s_per_day']} s a day); "
                f"{s['summary_rows']:,} summary rows for {s['summary_days']} days")
    if "whatif" in only:
        say("\nwhat-if (bench/whatif.py)")
        for label, name in databases.items():
            path = out.with_name(f"bench-scale-whatif-{label}.json")
            run("bench.whatif", ["--volume-db", name, "--seed-volume", "never", "--requests", str(args.requests),
                                 "--warmup", "1", "--out", str(path)])
            results.setdefault("whatif", {})[label] = json.loads(path.read_text())["cases"]
        for case in results["whatif"]["1M"]:
            rows.append((f"what-if, {case}", results["whatif"]["1M"][case]["p50_ms"],
                         results["whatif"]["10M"][case]["p50_ms"], "ms p50"))
    if "rows" in only:
        say("\nthe 90-day what-if from rows" + (" (and with a covering index)" if args.covering else ""))
        for label, name in databases.items():
            r = results.setdefault("rows", {})[label] = child(name, "rows", "yes" if args.covering else "no")
            say(f"   {label}: {r}")
        rows.append(("what-if, 90 days from rows", results["rows"]["1M"]["rows_90_days"]["p50_ms"],
                     results["rows"]["10M"]["rows_90_days"]["p50_ms"], "ms"))
        if args.covering:
            rows.append(("  the same with a covering index", results["rows"]["1M"]["rows_90_days_covering"]["p50_ms"],
                         results["rows"]["10M"]["rows_90_days_covering"]["p50_ms"], "ms"))
            for key, what in (("insert_ms_without", "an action's INSERT"),
                              ("insert_ms_with", "  the same with the covering index")):
                rows.append((what, results["rows"]["1M"][key], results["rows"]["10M"][key], "ms"))
    if "analytics" in only:
        say("\nanalytics: decision_analytics (30 days)")
        for label, name in databases.items():
            results.setdefault("analytics", {})[label] = child(name, "analytics", str(args.requests))
        rows.append(("analytics (30 days)", results["analytics"]["1M"]["p50_ms"],
                     results["analytics"]["10M"]["p50_ms"], "ms p50"))
    if "pages" in only:
        say("\npages (bench/pages.py: the 1M database as its small side, the 10M one as its volume)")
        path = out.with_name("bench-scale-pages.json")
        run("bench.pages", ["--small-db", scale_load.ONE_M, "--keep-small", "--volume-db", scale_load.TEN_M,
                            "--seed-volume", "never", "--requests", str(args.requests * 2), "--rounds", "2",
                            "--out", str(path)])
        results["pages"] = json.loads(path.read_text())["pages"]
        for page, row in results["pages"].items():
            rows.append((f"page: {page}", row["small"]["p95_ms"], row["volume"]["p95_ms"], "ms p95"))
    if "bcd" in only:
        say("\n(b)-(d) on a stack over each database (bench/__main__.py --database)")
        for label, name in databases.items():
            path = out.with_name(f"bench-scale-bcd-{label}.json")
            run("bench", ["--only", "abcd", "--database", name, "--out", str(path)], locked=True)
            results.setdefault("bcd", {})[label] = json.loads(path.read_text())
        for figure, what in (("b_action_new", "(b) POST actions, new keys"), ("c_action_replay", "(c) replayed keys"),
                             ("d_end_to_end", "(d) end to end, 2 workers")):
            got = [results["bcd"][label]["results"][figure] for label in databases]
            rows.append((f"{what}, per s", got[0]["ok_rps"], got[1]["ok_rps"], "/s"))
            rows.append((f"{what}, Surety's CPU ms", got[0]["cpu_ms_per_request"]["total"],
                         got[1]["cpu_ms_per_request"]["total"], "ms"))
    say("\n" + "=" * 100)
    say(f"SCALE: {'figure':<52} {'1M':>10} {'10M':>10} {'10M/1M':>8}")
    for figure, one, ten, unit in rows:
        say(f"       {figure[:52]:<52} {one:>10} {ten:>10} {growth(one, ten) or '':>8}  {unit}")
    document = {"when": datetime.now(UTC).isoformat(), "seconds": round(time.monotonic() - began, 1),
                "timings": timings, "databases": databases, "cpus": os.cpu_count(), "results": results,
                "table": [{"figure": f, "1M": one, "10M": ten, "growth": growth(one, ten), "unit": u}
                          for f, one, ten, u in rows]}
    out.write_text(json.dumps(document, indent=2, default=str) + "\n")
    say(f"\nwritten to {out} in {document['seconds']} s")
    return document


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        serve_child(sys.argv[2], sys.argv[3:])
    else:
        main()
