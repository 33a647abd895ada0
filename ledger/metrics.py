"""The ledger's figures for monitoring; `/metrics` (console.monitoring) shows `REGISTRY`.

Two kinds of figures end up in that registry:

1. Read from the database at scrape time by collectors: the ledger's own below (actions per
   status, actions stuck pending or unknown); console.monitoring lists it with the apps'
   collectors. Cheap queries only: a scrape comes every 15-60 s from each Prometheus server.
2. Counted where they happen: the API's replays and reused keys (web processes) and the
   connectors' calls (RQ workers). Each process counts its own, so with several processes the
   figures add up only in prometheus_client's multiprocess mode: `PROMETHEUS_MULTIPROC_DIR`
   names a directory that every process of the host shares (the web app's and the workers'),
   set before they start and emptied before they start. Without it each process reports only
   what it counted itself (fine for `runserver`, wrong behind gunicorn with several workers).
"""

import os
import time
from datetime import timedelta

from django.conf import settings
from django.db.models import Count
from django.utils import timezone
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from .counts import HISTORY_EXACT_UP_TO, action_counts
from .jobs import redis_connection
from .models import Action, ActionStatus

REGISTRY = CollectorRegistry()


# --- Counted where it happens ----------------------------------------------------------------

# prometheus_client picks its storage when it is imported, from this same variable.
_MULTIPROCESS = "PROMETHEUS_MULTIPROC_DIR" in os.environ
# In multiprocess mode the counters live in files; the registry reads every process's files.
_counted_in = None if _MULTIPROCESS else REGISTRY
if _MULTIPROCESS:
    MultiProcessCollector(REGISTRY)

API_REPLAYS = Counter(
    "surety_api_replays", "Requests answered as replays (same key, same request), per agent.",
    ["agent"], registry=_counted_in,
)
API_KEY_REUSED = Counter(
    "surety_api_key_reused", "Requests refused with 422 idempotency_key_reused, per agent.",
    ["agent"], registry=_counted_in,
)
CONNECTOR_CALLS = Counter(
    "surety_connector_calls",
    "Calls to providers by connector, operation (perform, find_effect) and outcome: ok; found, absent, "
    "inconclusive or rate_limited (asked again after the provider's Retry-After) for a look-up; not_sent, "
    "outcome_unknown, rejected or error for a failure, whose code says more (timeout, connect_failed, "
    "http_500, a provider's decline code).",
    ["connector", "operation", "outcome", "code"], registry=_counted_in,
)
CONNECTOR_SECONDS = Histogram(
    "surety_connector_call_seconds", "How long calls to providers took, whatever their outcome.",
    ["connector", "operation"], registry=_counted_in,
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


def connector_call_observed(connector, operation, started, outcome, code=""):
    CONNECTOR_SECONDS.labels(connector, operation).observe(time.perf_counter() - started)
    CONNECTOR_CALLS.labels(connector, operation, outcome, code).inc()


# --- Read from the database at scrape time ---------------------------------------------------

class LedgerCollector:
    def collect(self):
        by_status = GaugeMetricFamily(
            "surety_actions",
            f"Actions per status: exact for work in flight; for settled statuses exact up to {HISTORY_EXACT_UP_TO}, "
            "beyond that PostgreSQL's estimate.", labels=["status"])
        counts, estimates = action_counts()
        for status, n in counts.items():
            by_status.add_metric([status], max(n, estimates.get(status, 0)))
        yield by_status

        window = settings.METRICS_STALE_SECONDS
        stale = GaugeMetricFamily(
            "surety_actions_stale",
            f"Actions pending or unknown since longer than METRICS_STALE_SECONDS ({window:g} s).", labels=["status"])
        stuck = dict.fromkeys([ActionStatus.PENDING, ActionStatus.UNKNOWN], 0)
        stuck.update(Action.objects.filter(status__in=list(stuck), updated_at__lt=timezone.now() - timedelta(seconds=window))
                     .order_by().values_list("status").annotate(n=Count("id")).values_list("status", "n"))
        for status, n in stuck.items():
            stale.add_metric([status], n)
        yield stale



# --- The sweeper's trace, which /healthz looks for ------------------------------------------

SWEEPER_SEEN_KEY = "surety:sweeper:seen"


def sweeper_seen():
    """The sweeper's trace, left after each pass that succeeded: a key that expires
    HEALTHZ_SWEEPER_SECONDS later, so `/healthz` sees a sweeper that stopped, hangs or cannot
    reach the database (any sweeper's trace will do: with several, one is enough). A Redis
    error reaches the caller, whose loop counts it with the outage (ledger.sweeper). Without
    Redis there is no shared place for it, and `/healthz` does not check the sweeper."""
    if settings.RQ_ASYNC:
        redis_connection().set(SWEEPER_SEEN_KEY, timezone.now().isoformat(),
                               px=int(settings.HEALTHZ_SWEEPER_SECONDS * 1000))
