"""`python -m bench.reconcile`: the time of one reconciliation pass over N actions (100,000 by default).

1. A fresh PostgreSQL database `surety_bench_reconcile`, migrated, loaded by `seed_volume`
   with N actions over 90 days (no tasks, no dead-letter entries).
2. The sandbox provider's tables get one effect per succeeded action, as the sandbox
   connector would have made it (same operation key, reference, amount, time), with SQL;
   then PLANTED doubles, orphans and amount mismatches each.
3. One gunicorn serves the sandbox's API; this process runs `reconcile()` over a window
   holding every effect, timed: the sandbox's listing over HTTP, a page of 1,000 at a time,
   and one ledger query per 1,000 records. Then the same window again (nothing new opens),
   and the listing alone, to tell the provider's share from the ledger's.

Prints the records read, the incidents opened (3 × PLANTED expected), the seconds per pass,
records per second and the peak memory of this process. About a minute, most of it loading.
Options: --actions N, --keep (leave the database for a look).
"""

import argparse
import os
import resource
import sys
import tempfile
import time
from datetime import timedelta

from .stack import ADMIN_URL, Stack

DB_NAME = "surety_bench_reconcile"
DATABASE_URL = f"postgres://postgres@127.0.0.1:5432/{DB_NAME}"
PLANTED = 10

EFFECTS = [
    """INSERT INTO sandbox_sandboxrefund (operation_key, idempotency_key, metadata, created_at, refund_id, order_id,
                                          amount, currency)
       SELECT operation_key, operation_key, jsonb_build_object('operation_key', operation_key), updated_at,
              external_ref, target, amount, currency
       FROM ledger_action WHERE action_type = 'refund' AND status = 'succeeded'""",
    """INSERT INTO sandbox_sandboxmessage (operation_key, idempotency_key, metadata, created_at, message_id, recipient,
                                           channel, message_type, body)
       SELECT operation_key, operation_key, jsonb_build_object('operation_key', operation_key), updated_at,
              external_ref, target, params->>'channel', params->>'message_type', params->>'body'
       FROM ledger_action WHERE action_type = 'send_message' AND status = 'succeeded'""",
    """INSERT INTO sandbox_sandboxbooking (operation_key, idempotency_key, metadata, created_at, booking_id, resource,
                                           customer, service, start, "end")
       SELECT operation_key, operation_key, jsonb_build_object('operation_key', operation_key), updated_at,
              external_ref, target, customer, params->>'service', (params->>'start')::timestamptz,
              (params->>'end')::timestamptz
       FROM ledger_action WHERE action_type = 'create_booking' AND status = 'succeeded'""",
]
# Each kind of finding, PLANTED times, among the refunds.
PLANTS = [
    # an amount the ledger does not have (the newest refunds)
    """UPDATE sandbox_sandboxrefund SET amount = amount + 1
       WHERE id IN (SELECT id FROM sandbox_sandboxrefund ORDER BY id DESC LIMIT %(n)s)""",
    # a second effect for a key the ledger recorded once (the oldest refunds)
    """INSERT INTO sandbox_sandboxrefund (operation_key, metadata, created_at, refund_id, order_id, amount, currency)
       SELECT operation_key, metadata, created_at + interval '1 minute', refund_id || '_2', order_id, amount, currency
       FROM sandbox_sandboxrefund ORDER BY id LIMIT %(n)s""",
    # effects under keys the ledger never recorded
    """INSERT INTO sandbox_sandboxrefund (operation_key, metadata, created_at, refund_id, order_id, amount, currency)
       SELECT 'refund:ORD-GHOST-' || i || ':full', '{}', now() - interval '1 day', 're_ghost_' || i, 'ORD-GHOST-' || i,
              10, 'EUR'
       FROM generate_series(1, %(n)s) AS i""",
]


def say(*parts):
    print(*parts, flush=True)


def drop_database(*, create_again=False):
    import psycopg
    from psycopg import sql

    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DB_NAME)))
        if create_again:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB_NAME)))


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.reconcile", description=__doc__.split("\n\n")[0])
    p.add_argument("--actions", type=int, default=100_000)
    p.add_argument("--keep", action="store_true", help=f"leave the database {DB_NAME} when done")
    args = p.parse_args(argv)

    logs = tempfile.mkdtemp(prefix="bench-reconcile-")
    stack = Stack(logs, gunicorn_workers=1, gunicorn_threads=4)
    stack.env["DATABASE_URL"] = DATABASE_URL
    # This process: the same database and sandbox; alerts are delivered here, into memory.
    os.environ.update(DJANGO_SETTINGS_MODULE="config.settings", DATABASE_URL=DATABASE_URL, RQ_ASYNC="false",
                      SANDBOX_BASE_URL=f"{stack.url}/sandbox/v1", LOG_LEVEL="WARNING",
                      EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend")

    say(f"database {DB_NAME}: created, migrated, {args.actions:,} actions loaded ...")
    t0 = time.monotonic()
    drop_database(create_again=True)
    stack.migrate()
    stack.manage("seed_volume", "--actions", str(args.actions), "--deadletters", "0", "--tasks", "0", "--seed", "1",
                 "--no-vacuum", "-v", "0")

    import django

    django.setup()
    from django.db import connection
    from django.db.models import Count
    from django.utils import timezone

    from dlq.incidents import Incident
    from dlq.reconcile import Window, reconcile
    from ledger.connectors import connector_for

    with connection.cursor() as cursor:
        for statement in EFFECTS:
            cursor.execute(statement)
        for statement in PLANTS:
            cursor.execute(statement, {"n": PLANTED})
        cursor.execute("VACUUM ANALYZE")
        cursor.execute("SELECT (SELECT count(*) FROM sandbox_sandboxrefund)"
                       " + (SELECT count(*) FROM sandbox_sandboxmessage)"
                       " + (SELECT count(*) FROM sandbox_sandboxbooking), (SELECT min(created_at) FROM ledger_action)")
        effects, oldest = cursor.fetchone()
    say(f"  loaded in {time.monotonic() - t0:.1f}s: {effects:,} effects at the sandbox,"
        f" {PLANTED} of each finding planted")

    stack.start_server()
    try:
        window = Window(oldest - timedelta(days=2), timezone.now() + timedelta(minutes=5))
        for label in ("first pass", "second pass (same window)"):
            started = time.monotonic()
            report = reconcile(window)["sandbox"]
            seconds = time.monotonic() - started
            say(f"{label}: {report['records']:,} records, {report['findings']} findings, {report['opened']} opened"
                f" in {seconds:.2f}s ({report['records'] / seconds:,.0f} records/s)")
        started = time.monotonic()
        listed = sum(1 for _ in connector_for("refund").records(window.since, window.until))
        seconds = time.monotonic() - started
        say(f"the sandbox's listing alone (no ledger): {listed:,} records in {seconds:.2f}s")
        kinds = dict(Incident.objects.order_by().values_list("kind").annotate(n=Count("id")))
        say(f"incidents: {kinds}")
        say(f"peak memory of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
        if sorted(kinds.values()) != [PLANTED] * 3:
            say(f"MISS: expected {PLANTED} incidents of each kind")
            return 1
        return 0
    finally:
        stack.stop_all()
        connection.close()
        if not args.keep:
            drop_database()
            say(f"(database {DB_NAME} dropped; --keep leaves it)")


if __name__ == "__main__":
    sys.exit(main())
