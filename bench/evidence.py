"""`python -m bench.evidence`: the time and the queries to build an action's evidence record.

1. A fresh `surety_bench` database (the one `make bench` recreates at each run), migrated; one
   gunicorn serving the sandbox provider and the webhook receiver.
2. Through the product's own code paths (bench/evidence_scenario.py), an action with over 20
   audit events: a limit, a grant promoted after a replay run, two approvals, a decline and
   its dead-letter entry redriven, an unknown outcome verified twice (once by a person's
   request), a success, its webhook delivered twice; the audit events sealed.
3. In this process, timed (median of --repeat runs after one warm-up): the record as JSON
   (`evidence_export` plus serialising it), the dashboard's printable page and JSON file
   through Django's test client (a superuser), each with its SQL statements counted; and
   `record_problems` (what `evidence_verify` does) against the database.

Prints the events covered, the sizes, the milliseconds and the statements. About 30 s.
Options: --repeat N.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from .stack import DATABASE_URL, DB_NAME, REDIS_URL, Stack, flush_redis, reset_database

def say(*parts):
    print(*parts, flush=True)


def timed(repeat, run):
    """(median ms, statements of one run, what the last run returned)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    run()  # warm-up: templates compiled, connections opened
    times = []
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            result = run()
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), len(queries), result


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.evidence", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args(argv)

    stack = Stack(tempfile.mkdtemp(prefix="bench-evidence-"), gunicorn_workers=1, gunicorn_threads=4)
    # This process runs the executor against the server's sandbox, step by step: the jobs the
    # scenario's commits enqueue wait in Redis, where no worker listens. Short waits keep its
    # verification and retry steps quick.
    os.environ.update(DJANGO_SETTINGS_MODULE="config.settings", DATABASE_URL=DATABASE_URL, REDIS_URL=REDIS_URL,
                      SANDBOX_BASE_URL=f"{stack.url}/sandbox/v1", SITE_URL=stack.url, LOG_LEVEL="WARNING",
                      CONNECTOR_TIMEOUT="2", LEASE_SECONDS="10", LEASE_MARGIN_SECONDS="1",
                      BACKOFF_BASE_SECONDS="0.2", BACKOFF_MAX_SECONDS="1")
    reset_database()
    flush_redis()
    stack.migrate()
    stack.start_server()
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client

    from console.evidence import evidence_export
    from ledger.evidence import evidence_actions, record_problems

    from .evidence_scenario import rich_action

    try:
        started = time.monotonic()
        action = rich_action(stack.url)
        say(f"action {action.operation_key}: {action.status} after {action.attempts} attempts, "
            f"built through the product's code paths in {time.monotonic() - started:.1f}s")
        admin = get_user_model().objects.create_superuser("bench-evidence", password=None)
        client = Client()
        client.force_login(admin)

        def export():
            return json.dumps(evidence_export(evidence_actions().get(pk=action.pk)))

        def page(path):
            def get():
                response = client.get(path)
                assert response.status_code == 200, response.status_code
                return response.content
            return get

        ms, statements, body = timed(args.repeat, export)
        record = json.loads(body)
        events = record["audit"]["events"]
        say(f"record: {len(events)} audit events ({sum(1 for e in events if e['seq'])} sealed), "
            f"{len(record['sections']['approvals']['review_items'])} review items, "
            f"{len(record['sections']['dead_letters']['dead_letters'])} dead-letter entries, "
            f"{len(record['provider_evidence'])} provider evidence entries, {len(record['webhooks'])} webhooks; "
            f"{len(body) / 1024:.1f} KiB of JSON")
        say(f"{'what':<44} {'median ms':>10} {'statements':>11}")
        say(f"{'evidence_export + json.dumps':<44} {ms:>10.1f} {statements:>11}")
        for label, path in (("GET /actions/<pk>/evidence (printable page)", f"/actions/{action.pk}/evidence"),
                            ("GET /actions/<pk>/evidence.json", f"/actions/{action.pk}/evidence.json")):
            ms, statements, body = timed(args.repeat, page(path))
            say(f"{label:<44} {ms:>10.1f} {statements:>11}   ({len(body) / 1024:.1f} KiB)")
        ms, statements, problems = timed(args.repeat, lambda: record_problems(record))
        say(f"{'record_problems against the database':<44} {ms:>10.1f} {statements:>11}")
        if problems or len(events) < 20:
            say(f"MISS: {problems or f'only {len(events)} events'}")
            return 1
        return 0
    finally:
        stack.stop_all()
        connection.close()
        flush_redis()
        say(f"(the database {DB_NAME} is left as it is, for a look)")


if __name__ == "__main__":
    sys.exit(main())
