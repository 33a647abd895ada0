"""Monitoring: `/metrics` in Prometheus's text format and `/healthz` for load balancers.

Two kinds of figures end up in one registry, `REGISTRY`:

1. Read from the database at scrape time by collectors: the ledger's own below (actions per
   status, actions stuck pending or unknown); the apps built on the ledger add theirs with
   `register_collector` from their `AppConfig.ready()`. Cheap queries only: a scrape comes
   every 15-60 s from each Prometheus server.
2. Counted where they happen: the API's replays and reused keys (web processes) and the
   connectors' calls (RQ workers). Each process counts its own, so with several processes the
   figures add up only in prometheus_client's multiprocess mode: `PROMETHEUS_MULTIPROC_DIR`
   names a directory that every process of the host shares (the web app's and the workers'),
   set before they start and emptied before they start. Without it each process reports only
   what it counted itself (fine for `runserver`, wrong behind gunicorn with several workers).
"""

import hmac
import ipaddress
import logging
import os
import time
from datetime import timedelta

import redis
from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models import Count
from django.http import HttpResponseForbidden, JsonResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.django import PrometheusDjangoView
from prometheus_client.multiprocess import MultiProcessCollector
from rq import Worker

from .dashboard import HISTORY_EXACT_UP_TO, action_counts
from .jobs import redis_connection
from .models import Action, ActionStatus
from .outages import Outage, database_unreachable

logger = logging.getLogger("surety.metrics")

REGISTRY = CollectorRegistry()


def register_collector(collector):
    """Add a collector (an object whose `collect()` yields metric families) to `/metrics`."""
    REGISTRY.register(collector)


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
    "Calls to providers by connector, operation (perform, find_effect) and outcome: ok; found, absent "
    "or inconclusive for a look-up; not_sent, outcome_unknown, rejected or error for a failure, whose "
    "code says more (timeout, connect_failed, http_500, a provider's decline code).",
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


register_collector(LedgerCollector())


# --- The views -------------------------------------------------------------------------------


def metrics_allowed(request):
    """A bearer token (METRICS_TOKEN) or a client address in METRICS_ALLOWED_IPS opens
    `/metrics`. With neither configured it is open on loopback outside production, and
    closed in production. The address is the direct peer's: behind a proxy, use the token."""
    token = settings.METRICS_TOKEN
    sent = request.headers.get("Authorization", "")
    if token and hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
        return True
    try:
        client = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    if any(client in ipaddress.ip_network(allowed) for allowed in settings.METRICS_ALLOWED_IPS):
        return True
    configured = token or settings.METRICS_ALLOWED_IPS
    return not configured and not settings.PRODUCTION and client.is_loopback


_exposition = PrometheusDjangoView.as_view(registry=REGISTRY)


@never_cache
def metrics_view(request):
    if not metrics_allowed(request):
        return HttpResponseForbidden("Metrics need the METRICS_TOKEN or an allowed address.\n")
    return _exposition(request)


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


def _database_answers():
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        return cursor.fetchone() == (1,)


def _redis_answers():
    return redis_connection().ping()


def _worker_seen():
    """An RQ worker whose heartbeat is recent. RQ itself forgets a worker worker_ttl + 60 s
    (480 s by default) after its last heartbeat, and an idle worker beats every worker_ttl -
    15 s: run workers with a smaller --worker-ttl to notice a dead one sooner."""
    since = timezone.now() - timedelta(seconds=settings.HEALTHZ_WORKER_SECONDS)
    return any(worker.last_heartbeat and worker.last_heartbeat >= since
               for worker in Worker.all(connection=redis_connection()))


def _sweeper_seen():
    return bool(redis_connection().exists(SWEEPER_SEEN_KEY))


# A load balancer polls every few seconds: an outage of the database is one line in the log.
_DATABASE_OUTAGE = Outage("/healthz", logger)


def _check(probe):
    try:
        return "ok" if probe() else "down"
    except (DatabaseError, redis.RedisError, OSError) as exc:
        if database_unreachable(exc):
            _DATABASE_OUTAGE.failed(exc)
        else:
            logger.warning("health check %s failed", probe.__name__, exc_info=True)
        return "down"


@never_cache
def healthz_view(request):
    """200 when the database, Redis, a worker and the sweeper were seen; 503 naming what is
    down. Only the names and "ok"/"down" (or "not used"/"not checked" when jobs run
    in-process without Redis): nothing else for anonymous callers."""
    report = {"database": _check(_database_answers)}
    if report["database"] == "ok":
        _DATABASE_OUTAGE.answered()
    if settings.RQ_ASYNC:
        report.update(redis=_check(_redis_answers), worker=_check(_worker_seen), sweeper=_check(_sweeper_seen))
    else:
        report.update(redis="not used", worker="not used", sweeper="not checked")
    return JsonResponse(report, status=503 if "down" in report.values() else 200)
