"""`python -m bench archive`: what `archive_expired` costs, and what deleting gives back.

1. A fresh database `surety_bench_archive` (its own, so that it runs beside `make bench`), migrated.
2. `--actions` settled refunds recorded 401 days ago (past the 400-day key lifetime), each with
   its `requested` audit event, inserted in bulk, then sealed (a checkpoint every 10,000 events).
3. `archive_expired` into a temporary folder, run after run until nothing is left (`--limit`
   actions a run): each run's wall time and this process's CPU time, the rows it removed.
4. The ledger's and the audit trail's size on disk before, after the runs, and after a plain
   VACUUM: what deleting rows gives back, and what dropping the audit trail's partitions does
   (PARTITION_EVENTS=N in the environment sets their size; the load keeps one ahead).

Prints the figures and writes artifacts/bench-archive.json.
"""

import argparse
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from .results import write_results
from .stack import ROOT, STACK_ENV, database_url, reset_database

DB_NAME = "surety_bench_archive"


def say(*parts):
    print(*parts, flush=True)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m bench archive")
    parser.add_argument("--actions", type=int, default=50_000)
    parser.add_argument("--limit", type=int, default=10_000, help="actions per run (archive_expired --limit)")
    parser.add_argument("--out", default=str(ROOT / "artifacts" / "bench-archive.json"))
    return parser.parse_args(argv)


def sizes(connection):
    """Each table's size on disk, indexes included; a partitioned one's is its partitions' (its own is 0)."""
    with connection.cursor() as cursor:
        def megabytes(table):
            cursor.execute("SELECT coalesce((SELECT sum(pg_total_relation_size(relid)) "
                           "FROM pg_partition_tree(%s::regclass)), pg_total_relation_size(%s::regclass))",
                           [table, table])
            return round(float(cursor.fetchone()[0]) / 2**20, 1)

        return {f"{table}_mb": megabytes(table) for table in ("ledger_action", "ledger_auditevent")}


def load(count):
    """`count` settled refunds 401 days old and their audit events, in bulk; sealed."""
    from django.contrib.auth import get_user_model
    from django.db import transaction
    from django.utils import timezone

    from ledger.agents import agent_create
    from ledger.audit import content_hash
    from ledger.models import Action, AuditEvent
    from ledger.partitions import partitions_extend

    owner = get_user_model().objects.create(username="bench-owner")
    agent, _ = agent_create("bench-archive", actor="system:bench", owner=owner)
    when = timezone.now() - timedelta(days=401)
    for start in range(0, count, 5000):
        with transaction.atomic():
            actions = Action.objects.bulk_create([
                Action(operation_key=f"refund:ORD-{i}:dec-{i}", fingerprint="f" * 64, action_type="refund",
                       target=f"ORD-{i}", customer=f"CUST-{i % 1000}", params={"amount": "25.00", "currency": "EUR"},
                       amount="25.00", currency="EUR", decision_id=f"dec-{i}", agent=agent, status="succeeded",
                       external_ref=f"re_{i}", created_at=when)
                for i in range(start, min(start + 5000, count))])
            events = []
            for action in actions:
                event = AuditEvent(occurred_at=when, actor=f"agent:{agent.name}", verb="requested",
                                   object_type="ledger.action", object_id=str(action.pk),
                                   object_label=action.operation_key, after={"status": "queued"})
                event.content_hash = content_hash(event.content_fields())
                events.append(event)
            AuditEvent.objects.bulk_create(events)
        partitions_extend()  # as the sweeper keeps a partition ahead of the ids
    AuditEvent.objects.seal(batch=10_000)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    reset_database(DB_NAME)
    os.environ.update({**STACK_ENV, "DATABASE_URL": database_url(DB_NAME)})
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from dlq.archive import archive_expired

    call_command("migrate", verbosity=0)
    began = time.perf_counter()
    load(args.actions)
    say(f"loaded {args.actions:,} settled actions 401 days old, with their audit events, sealed, "
        f"in {time.perf_counter() - began:.1f} s")
    before = sizes(connection)
    runs = []
    with tempfile.TemporaryDirectory() as folder:
        while True:
            wall, cpu = time.perf_counter(), time.process_time()
            archive, counts = archive_expired(folder, limit=args.limit)
            if archive is None:
                break
            runs.append({"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu, "removed": counts,
                         "file_mb": (Path(folder) / archive.file).stat().st_size / 2**20})
            say(f"  run {len(runs)}: {counts} in {runs[-1]['wall_s']:.2f} s ({runs[-1]['cpu_s']:.2f} s CPU here), "
                f"file {runs[-1]['file_mb']:.1f} MB")
    after = sizes(connection)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ledger_action, ledger_auditevent")
    vacuumed = sizes(connection)
    rows = sum(sum(run["removed"].values()) for run in runs)
    actions = sum(run["removed"].get("ledger.action", 0) for run in runs)
    wall = sum(run["wall_s"] for run in runs)
    cpu = sum(run["cpu_s"] for run in runs)
    summary = {"actions": args.actions, "limit": args.limit, "runs": runs, "rows_removed": rows,
               "actions_removed": actions, "wall_s": wall, "cpu_s": cpu,
               "rows_per_s": rows / wall if wall else None,
               "ms_per_action": 1000 * wall / actions if actions else None,
               "cpu_ms_per_action": 1000 * cpu / actions if actions else None,
               "size_before": before, "size_after": after, "size_after_vacuum": vacuumed}
    say(f"archive: {actions:,} actions ({rows:,} rows) in {len(runs)} runs, {wall:.1f} s: {summary['rows_per_s']:,.0f} "
        f"rows/s, {summary['ms_per_action']:.2f} ms and {summary['cpu_ms_per_action']:.2f} ms of CPU here per action")
    say(f"size on disk: before {before}, after {after}, after VACUUM {vacuumed}")
    say(f"wrote {write_results(args.out, summary)}")
