"""`python -m bench.whatif`: the time to render the policy what-if over 1,000,000 actions.

The volume database is `bench pages`' own (`surety_volume`, `--volume-db`), loaded by
`seed_volume` (1M actions over 90 days, 55 % refunds, 70 % of them in EUR) and reused as it is
(migrated) unless `--seed-volume` says otherwise: see bench/README.md. The refund EUR limit of
the seed's review items (500 / two approvers above 5,000 / 2,000 a customer a day) is set on
it if there is none, through `Limit.limit_set` (audited), so that the preview compares with a
current limit as a real one would.

Measured in-process, as bench pages measures: Django's test client (no HTTP), a superuser
logged in, `POST /policies/whatif` as htmx sends it (the fragment rendered and read), for each
window: --warmup untimed, then --requests timed requests; wall time p50/p95/max, the SQL time
and statements per request. Windows: 7 days, the default 30 and the longest, 90 (every
seeded action). The proposal lowers all three thresholds (250 / 2,500 / 1,000 a day), so the
customers' daily totals are summed and examples change.

Prints a table and writes artifacts/bench-whatif.json.
"""

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace

from . import pages
from .results import write_results

CURRENT_LIMIT = {"max_amount": "500", "dual_approval_above": "5000", "daily_customer_total": "2000"}
PROPOSED = {"action_type": "refund", "currency": "EUR", "max_amount": "250", "dual_approval_above": "2500",
            "daily_customer_total": "1000"}
CASES = {  # name -> form values beyond PROPOSED
    "the last 7 days": {"days": "7"},
    "the last 30 days (default)": {"days": "30"},
    "the last 90 days (longest)": {"days": "90"},
}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench.whatif", description=__doc__.split("\n\n")[0])
    p.add_argument("--volume-db", default="surety_volume", help="the 1M-action database (default surety_volume)")
    p.add_argument("--seed-volume", choices=("auto", "always", "never"), default="auto",
                   help="auto: load it only if it is missing or empty (~2 min); always: reload; never: stop if missing")
    p.add_argument("--requests", type=int, default=10, help="timed requests per case (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed requests first (default 2)")
    p.add_argument("--out", default="artifacts/bench-whatif.json")
    return p.parse_args(argv)


def setup_django(database):
    os.environ.update({"DATABASE_URL": pages.db_url(database), **pages.DJANGO_ENV})
    sys.path.insert(0, str(pages.ROOT))
    import django

    django.setup()


def client_logged_in():

    from django.contrib.auth import get_user_model
    from django.test import Client

    from approvals.models import Limit

    user = get_user_model().objects.filter(username=pages.BENCH_USER).first()
    if user is None:
        user = get_user_model().objects.create_superuser(pages.BENCH_USER, f"{pages.BENCH_USER}@bench.invalid", None)
    if not Limit.objects.filter(action_type="refund", currency="EUR").exists():
        Limit.limit_set(actor=user, reason="bench.whatif: the seed's refund limit", action_type="refund",
                        currency="EUR", **{name: Decimal(value) for name, value in CURRENT_LIMIT.items()})
    client = Client()
    client.force_login(user)
    return client


def measure(client, form, n, warmup):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(warmup):
        client.post("/policies/whatif", form, headers={"HX-Request": "true"})
    wall, in_sql, statements = [], [], []
    for _ in range(n):
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            response = client.post("/policies/whatif", form, headers={"HX-Request": "true"})
            response.content  # noqa: B018 - rendered and read, as a server would send it
            wall.append((time.perf_counter() - started) * 1000)
        in_sql.append(sum(float(q["time"]) for q in captured.captured_queries) * 1000)
        statements.append(len(captured.captured_queries))
    page = response.content.decode()
    if response.status_code != 200 or 'id="whatif-counts"' not in page:
        raise RuntimeError(f"the what-if answered {response.status_code} without its figures: {page[:500]}")
    return {"p50_ms": round(pages.percentile(wall, 50), 1), "p95_ms": round(pages.percentile(wall, 95), 1),
            "max_ms": round(max(wall), 1), "sql_ms_median": round(statistics.median(in_sql), 1),
            "statements": max(statements), "requests": n}


def window_sizes(cases):
    """How many actions each case's window holds (what the preview reads)."""
    from approvals.whatif import window_start
    from ledger.models import Action

    sizes = {}
    for name, extra in cases.items():
        since = window_start(int(extra["days"]))
        sizes[name] = Action.objects.filter(action_type="refund", currency="EUR", created_at__gte=since).count()
    return sizes


def main(argv=None):
    args = parse_args(argv if argv is not None else sys.argv[1:])
    os.chdir(pages.ROOT)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    timings = {}
    pages.say(f"bench whatif: POST /policies/whatif (htmx) in-process on {args.volume_db} "
              f"(--seed-volume {args.seed_volume}), {args.warmup} warm-up + {args.requests} timed requests per case")
    pages.prepare_volume(SimpleNamespace(volume_db=args.volume_db, seed_volume=args.seed_volume), timings)
    sizes = pages.row_counts(args.volume_db)
    pages.say("   volume: " + ", ".join(f"{t} {n:,}" for t, n in sizes.items()))
    setup_django(args.volume_db)
    client = client_logged_in()
    in_window = window_sizes(CASES)
    results = {}
    for name, extra in CASES.items():
        results[name] = {**measure(client, {**PROPOSED, **extra}, args.requests, args.warmup),
                         "refund_eur_in_window": in_window[name]}
        r = results[name]
        pages.say(f"   {name:<28} {r['refund_eur_in_window']:>9,} refunds in EUR  p50 {r['p50_ms']:>7.1f} ms  "
                  f"p95 {r['p95_ms']:>7.1f} ms  SQL {r['sql_ms_median']:>7.1f} ms  {r['statements']} statements")
    document = {"when": datetime.now(UTC).isoformat(), "seconds": round(time.monotonic() - began, 1),
                "timings": timings, "volume_db": args.volume_db, "sizes": sizes, "proposed": PROPOSED,
                "current_limit": CURRENT_LIMIT, "client": "django.test.Client, in-process, force_login superuser",
                "cpus": os.cpu_count(), "cases": results}
    write_results(out, document)
    pages.say(f"\nwritten to {out} in {document['seconds']} s")
    return document


if __name__ == "__main__":
    main()
