"""RQ jobs: thin, and never one per action.

The web side only rings a doorbell after commit; a drain job then claims ready rows one by
one with SKIP LOCKED, in a few threads at once, until none are left. About one drain job
waits in the queue per kind (the doorbell names it), and a job that found work rings again
so that an idle worker joins in. The database stays the truth: if Redis loses the job, the sweeper rings.

The drain jobs themselves are `ledger.executor.drain_actions` and `ledger.runner.drain_tasks`;
the doorbell names them by path, so that everything may ring without importing what runs.
"""

import contextvars
import logging
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta

import django_rq
import redis
from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from . import clock
from .compiled import register_cache
from .outages import REDIS_UNREACHABLE, Outage, connection_lost, rolled_back, waited_out

logger = logging.getLogger("surety.jobs")
DOORBELL_TTL_SECONDS = 15
_in_process = contextvars.ContextVar("surety_in_process_job", default=False)
DRAIN_SECONDS = 60


def _doorbell(kind):
    return f"surety:doorbell:{kind}"


_clients = {}
register_cache("ledger.jobs._clients", holds="one Redis client per RQ configuration", clear=_clients.clear,
               stale_when="never: the key is the configuration itself")


def redis_connection():
    """One Redis client, and so one connection pool, per process and configuration:
    django-rq builds a new client, hence a new TCP connection, on every call."""
    config = settings.RQ_QUEUES["default"]
    key = tuple(sorted((k, str(v)) for k, v in config.items()))
    client = _clients.get(key)
    if client is None:
        client = _clients.setdefault(key, django_rq.get_connection("default"))
    return client


def worker_name():
    return f"{socket.gethostname()}:{os.getpid()}"


def _queue(connection):
    """The one queue every job goes to."""
    return django_rq.get_queue("default", connection=connection)


def enqueue(func, *args, at=None):
    """Hand work (a function, or its dotted path) to RQ, now or `at` a time on the database's clock
    (ledger.clock). Without Redis (the embedded default) run it here and now; work due later is
    then left to the sweeper's next pass."""
    if not settings.RQ_ASYNC:
        # In-process, a drain already running picks up what its own moves made runnable.
        if at is None and not _in_process.get():
            token = _in_process.set(True)
            try:
                (import_string(func) if isinstance(func, str) else func)(*args)
            finally:
                _in_process.reset(token)
        return None
    queue = _queue(redis_connection())
    options = {"job_timeout": DRAIN_SECONDS * 3, "result_ttl": 0, "failure_ttl": 3600}
    job = None
    with _redis_call(f"enqueueing {func}"):
        if at is None:
            job = queue.enqueue(func, *args, **options)
        else:
            # `at` is on the database's clock, as every due time is (ledger.clock); RQ's scheduler
            # fires by its host's: it is given the same moment on this host's, the closest a process
            # can tell it (a host ahead fired the job early, and it found nothing due yet). RQ keeps
            # whole seconds and may fire up to one early.
            on_this_host = timezone.now() + (at - clock.now())
            job = queue.enqueue_at(on_this_host + timedelta(seconds=1), func, *args, **options)
        _REDIS_OUTAGE.answered()
    return job


# One per process, shared by its threads: while Redis does not answer, a line when it went
# away and one with the count of failed calls when it answers again, not a traceback per request.
_REDIS_OUTAGE = Outage("doorbell (the sweeper rings for what it misses)", logger)


@contextmanager
def _redis_call(what):
    """Around calls to Redis that may fail (each block calls `_REDIS_OUTAGE.answered()` once
    Redis did what it was asked): the database is the truth, and the sweeper rings for whatever a
    failed ring or enqueue left runnable."""
    try:
        yield
    except REDIS_UNREACHABLE as exc:
        _REDIS_OUTAGE.failed(exc)
    except redis.RedisError:
        logger.exception("%s failed; the sweeper will ring", what)


def ring(kind):
    """Make sure a drain job for `kind` ("actions" or "tasks") is on its way.

    The doorbell names the drain job it announced; it is trusted only while that job still
    waits in the queue: it starts after this commit, so it sees what was committed. A job that
    a worker took and died with (before its first line cleared the doorbell) must not silence
    every ring until the key expires. Asked on every commit, one round trip: not asking again
    for a moment saved nothing measurable (decision 10).
    """
    if not settings.RQ_ASYNC:
        enqueue(DRAINS[kind])
        return
    with _redis_call(f"the doorbell for {kind}"):
        client = redis_connection()
        if _announced_job_waits(client, kind):
            _REDIS_OUTAGE.answered()
            return
        # Counts its own failure, or Redis being back: a Redis that refuses writes (full, a
        # replica) still answered the look above, which must not end the outage on each ring.
        job = enqueue(DRAINS[kind])
        if job is not None:
            client.set(_doorbell(kind), job.id, ex=DOORBELL_TTL_SECONDS)


# The doorbell names the job it announced; that job still in the queue's list makes another ring
# unnecessary. The list, not the job's status: a worker killed between taking the job off the
# list and marking it started leaves it "queued" in its hash, and that silenced every ring until
# the doorbell expired. Searched from the tail, where a new job is; one round trip, by digest.
_ANNOUNCED_JOB_WAITS = """
local announced = redis.call('GET', KEYS[1])
return announced and redis.call('LPOS', KEYS[2], announced, 'RANK', -1) and 1 or 0
"""


def _announced_job_waits(client, kind):
    script = client.register_script(_ANNOUNCED_JOB_WAITS)
    return script(keys=[_doorbell(kind), _queue(client).key])


def ring_after_commit(kind, at=None):
    """Ring for `kind` once this transaction commits, or at `at` (on the database's clock, as
    `enqueue` takes it), for work due later."""
    # robust: a Redis hiccup after commit must not turn a recorded request into an error.
    if at is not None and at > clock.now():
        transaction.on_commit(lambda: enqueue(DRAINS[kind], at=at), robust=True)
    else:
        transaction.on_commit(lambda: ring(kind), robust=True)


def drain(kind, claim_next, run_claimed, give_back=None):
    """Claim and run until nothing is left or DRAIN_SECONDS have passed, in DRAIN_LANES
    threads: most of an action's time is spent waiting for the provider and the database,
    so one worker process keeps several in flight (each lane has its own connection).

    `give_back(claimed)`: for a run the database interrupted (its connection lost midway), called
    once it answers again, so that the run is handed back at once and spends nothing; without it
    (or if the lane ends first) the claim waits for its lease to lapse and the sweeper."""
    if settings.RQ_ASYNC:
        try:
            redis_connection().delete(_doorbell(kind))
        except redis.RedisError:  # the doorbell then expires by itself
            logger.warning("could not clear the doorbell for %s", kind)
    deadline = time.monotonic() + DRAIN_SECONDS
    lanes = settings.DRAIN_LANES if settings.RQ_ASYNC and connection.vendor == "postgresql" else 1
    if lanes == 1:
        handled = _drain_lane(kind, claim_next, run_claimed, give_back, deadline)
    else:
        handled = sum(_lane_pool(lanes).map(
            lambda lane: _drain_lane(kind, claim_next, run_claimed, give_back, deadline), range(lanes)))
    if settings.RQ_ASYNC and time.monotonic() >= deadline:
        ring(kind)
    return handled


def _drain_lane(kind, claim_next, run_claimed, give_back, deadline):
    """Claim and run until nothing is left.

    While the database is unreachable the lane waits and tries again until the deadline
    (`_OUTAGES` logs it once per outage; in-process it ends at once). A run it interrupted is
    given back (`give_back`) as soon as the database answers again; one it could not give back
    before the lane ended keeps its claim until the lease lapses, and the sweeper takes it back
    then: nothing is lost with the job."""
    close_old_connections()  # a lane's thread outlives jobs: drop a connection gone stale
    outage = _OUTAGES[kind]
    owner = worker_name()
    handled = 0
    interrupted = []
    while time.monotonic() < deadline:
        try:
            while interrupted:
                give_back(interrupted[-1])
                interrupted.pop()
            claimed = claim_next(owner)
        except Exception as exc:
            if not waited_out(exc):
                raise
            if not _went_on(outage, exc):
                break
            continue
        outage.answered()
        if claimed is None:
            break
        if handled == 0 and settings.RQ_ASYNC:
            ring(kind)  # there is work: an idle worker may join in
        try:
            run_claimed(claimed)
        except Exception as exc:
            if not waited_out(exc):
                # A bug met by one run must not end the lane (and with several lanes, fail the job
                # and skip its re-ring): the run settled what it claimed, or its claim stands until
                # the lease lapses, so the next claim is another's, never the same one again at once.
                logger.exception("drain of %s: the run of %s failed; going on with the next", kind, claimed)
                handled += 1
                continue
            # Given back only when the connection itself was lost, or the database rolled the run's
            # transaction back to break a deadlock: an error the database answered otherwise (a
            # statement timeout, a full disk) would fail the run the same way again, and given
            # back each time it would never spend its attempts nor reach a person.
            if give_back is not None and (connection_lost(exc) or rolled_back(exc)):
                interrupted.append(claimed)
            if rolled_back(exc):  # a deadlock the database broke: it is there, no outage
                continue
            if not _went_on(outage, exc):
                break
            continue
        handled += 1
    # A run cut short as the drain ended is given back now if the database answers: left, it
    # would wait for its lease to lapse and the sweeper, and spend an attempt (dead-lettered on its last).
    try:
        while interrupted:
            give_back(interrupted[-1])
            interrupted.pop()
    except Exception as exc:
        if not waited_out(exc):
            raise
        logger.warning("drain of %s: %d interrupted run(s) left to their leases", kind, len(interrupted))
    return handled


def _went_on(outage, exc):
    """After a database error, whether the lane goes on: a worker's lane does, after a moment's
    wait. In-process the drain runs inside a request, which must not wait: it ends, and the
    sweeper's next pass rings again."""
    wait = outage.failed(exc)
    if not settings.RQ_ASYNC:
        return False
    time.sleep(wait)
    return True


# One per kind and process, shared by its lanes: one line in the log per outage, not per lane.
_OUTAGES = {kind: Outage(f"drain of {kind}", logger) for kind in ("actions", "tasks")}


_pools = {}
register_cache("ledger.jobs._pools", holds="the drain lanes' threads (and their connections), per lane count",
               stale_when="never: they live as long as the worker", clear=_pools.clear)


def _lane_pool(lanes):
    """Threads that live as long as the worker process, and so keep their connections."""
    pool = _pools.get(lanes)
    if pool is None:
        pool = _pools.setdefault(lanes, ThreadPoolExecutor(lanes, thread_name_prefix="drain-lane"))
    return pool


DRAINS = {"actions": "ledger.executor.drain_actions", "tasks": "ledger.runner.drain_tasks"}
