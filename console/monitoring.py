"""Monitoring: `/metrics` in Prometheus's text format, `/healthz` for the whole system and
`/healthz/web` for load balancers (both answered by `HealthChecksMiddleware`, ahead of the rest).

`/metrics` shows the ledger's registry (ledger.metrics): the figures counted where they
happen, and those read from the database at scrape time by the collectors listed here."""

import hmac
import ipaddress
import logging
from datetime import timedelta

import redis
from django.conf import settings
from django.db import Error, connection
from django.http import HttpResponseForbidden, JsonResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from prometheus_client.django import PrometheusDjangoView
from rq import Worker

from approvals.metrics import DecisionCollector, ReviewCollector
from dlq.metrics import DeadLetterCollector
from ledger.jobs import redis_connection
from ledger.metrics import REGISTRY, SWEEPER_SEEN_KEY, LedgerCollector
from ledger.outages import REDIS_UNREACHABLE, Outage, database_unreachable

logger = logging.getLogger("surety.metrics")

# Read at every scrape, in this order: actions per status and stuck; the review queues'
# backlog and their decisions; the open dead-letter entries.
COLLECTORS = (LedgerCollector(), ReviewCollector(), DecisionCollector(), DeadLetterCollector())
for collector in COLLECTORS:
    REGISTRY.register(collector)


def metrics_allowed(request):
    """A bearer token (METRICS_TOKEN) or a client address in METRICS_ALLOWED_IPS opens
    `/metrics`. With neither configured it is open on loopback outside production, and
    closed in production. The address is the direct peer's: behind a proxy, use the token."""
    token = settings.METRICS_TOKEN
    scheme, _, sent = request.headers.get("Authorization", "").partition(" ")
    # The scheme's name in any case, as the API takes it (RFC 9110).
    if token and scheme.lower() == "bearer" and hmac.compare_digest(sent.encode(), token.encode()):
        return True
    try:
        client = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    # Behind a listener on [::] (dual-stack) an IPv4 peer's address is IPv4-mapped: ::ffff:10.0.0.5
    # is 10.0.0.5, whether the allow-list names it as such or mapped.
    addresses = {client, getattr(client, "ipv4_mapped", None) or client}
    networks = [ipaddress.ip_network(allowed) for allowed in settings.METRICS_ALLOWED_IPS]
    if any(address in network for address in addresses for network in networks):
        return True
    configured = token or settings.METRICS_ALLOWED_IPS
    return not configured and not settings.PRODUCTION and any(address.is_loopback for address in addresses)


_exposition = PrometheusDjangoView.as_view(registry=REGISTRY)


@never_cache
def metrics_view(request):
    if not metrics_allowed(request):
        return HttpResponseForbidden("Metrics need the METRICS_TOKEN or an allowed address.\n")
    return _exposition(request)


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


# A load balancer polls every few seconds: an outage of the database, or of Redis, is one line
# in the log each, not a traceback a poll.
_DATABASE_OUTAGE = Outage("/healthz", logger)
_REDIS_OUTAGE = Outage("/healthz", logger)


def _check(probe):
    try:
        return "ok" if probe() else "down"
    # Django's Error, not only its DatabaseError: an InterfaceError (a connection already closed,
    # or in a state it cannot be used in) is none, and is the database down all the same.
    except (Error, redis.RedisError, OSError) as exc:
        if database_unreachable(exc):
            _DATABASE_OUTAGE.failed(exc)
        elif isinstance(exc, REDIS_UNREACHABLE):
            _REDIS_OUTAGE.failed(exc)
        else:
            logger.warning("health check %s failed", probe.__name__, exc_info=True)
        return "down"


def _database_state():
    state = _check(_database_answers)
    if state == "ok":
        _DATABASE_OUTAGE.answered()
    return state


def _answer(report):
    return JsonResponse(report, status=503 if "down" in report.values() else 200)


@never_cache
def healthz_view(request):
    """200 when the database, Redis, a worker and the sweeper were seen; 503 naming what is
    down. Only the names and "ok"/"down" (or "not used"/"not checked" when jobs run
    in-process without Redis): nothing else for anonymous callers."""
    report = {"database": _database_state()}
    if not settings.RQ_ASYNC:
        report.update(redis="not used", worker="not used", sweeper="not checked")
    elif (redis_state := _check(_redis_answers)) == "ok":
        _REDIS_OUTAGE.answered()
        report.update(redis="ok", worker=_check(_worker_seen), sweeper=_check(_sweeper_seen))
    else:
        # Workers and sweepers are seen through Redis alone: asking it for them too would cost
        # each its own timeout (three in all, past a load balancer's patience, while every poll
        # holds a web thread) to learn nothing more.
        report.update(redis=redis_state, worker="down", sweeper="down")
    return _answer(report)


@never_cache
def healthz_web_view(request):
    """Whether this web process can serve, for a load balancer: 200 when its database answers,
    503 otherwise. Redis, the workers and the sweeper are left out: every web process shares
    them, so a load balancer heeding them would take every one out at once, and the API and the
    pages answer without them. An action is recorded without them and waits for a worker; a
    doorbell Redis did not take is rung by the sweeper once Redis answers. Asking Redis would
    only cost a poll its timeout while Redis hangs; `/healthz` tells the whole system."""
    return _answer({"database": _database_state()})


HEALTH_CHECKS = {"/healthz": healthz_view, "/healthz/web": healthz_web_view}


class HealthChecksMiddleware:
    """Answers the health checks ahead of every other middleware, whatever the request's `Host`
    and over plain HTTP. Load balancers and platforms' probes ask a server by its own address (an
    AWS target group, a Kubernetes probe by default), which ALLOWED_HOSTS does not name: Django's
    host check answered them 400 and every web server was taken out. Nothing in their answers is
    made of the host, and they tell nothing secret (nor does anything behind them run for them:
    the sessions, the second factor, the HTTPS redirect)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        check = HEALTH_CHECKS.get(request.path_info)
        return check(request) if check else self.get_response(request)
