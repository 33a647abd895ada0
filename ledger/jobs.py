"""RQ jobs: thin, and never one per action.

The web side only rings a doorbell after commit; a drain job then claims ready rows one by
one with SKIP LOCKED until none are left. At most one drain job waits in the queue per
kind (a Redis key set with NX), and a job that found work rings again so that an idle
worker joins in. The database stays the truth: if Redis loses the job, the sweeper rings.
"""

import logging
import time
from datetime import timedelta

import django_rq
import redis
from django.db import transaction
from django.utils import timezone

logger = logging.getLogger("surety.jobs")
DOORBELL_TTL_SECONDS = 15
DRAIN_SECONDS = 60


def _doorbell(kind):
    return f"surety:doorbell:{kind}"


def ring(kind):
    """Make sure a drain job for `kind` ("actions" or "tasks") is on its way."""
    queue = django_rq.get_queue("default")
    try:
        if queue.is_async and not queue.connection.set(_doorbell(kind), 1, nx=True, ex=DOORBELL_TTL_SECONDS):
            return
        queue.enqueue(DRAINS[kind], job_timeout=DRAIN_SECONDS * 3, result_ttl=0, failure_ttl=3600)
    except redis.RedisError:
        logger.exception("could not enqueue a %s drain; the sweeper will", kind)


def ring_at(kind, when):
    """A drain for work that becomes due later (a backoff, a verification that must wait)."""
    queue = django_rq.get_queue("default")
    if not queue.is_async:
        return  # in-process mode: the sweeper's next pass finds it
    try:
        # RQ's scheduler keeps whole seconds and may fire up to one early.
        queue.enqueue_at(when + timedelta(seconds=1), DRAINS[kind], job_timeout=DRAIN_SECONDS * 3, result_ttl=0, failure_ttl=3600)
    except redis.RedisError:
        logger.exception("could not schedule a %s drain; the sweeper will", kind)


def ring_after_commit(kind, at=None):
    # robust: a Redis hiccup after commit must not turn a recorded request into an error.
    if at is not None and at > timezone.now():
        transaction.on_commit(lambda: ring_at(kind, at), robust=True)
    else:
        transaction.on_commit(lambda: ring(kind), robust=True)


def _drain(kind, claim_next, run_claimed):
    from .executor import worker_name

    queue = django_rq.get_queue("default")
    if queue.is_async:
        queue.connection.delete(_doorbell(kind))
    owner = worker_name()
    deadline = time.monotonic() + DRAIN_SECONDS
    handled = 0
    while time.monotonic() < deadline:
        claimed = claim_next(owner)
        if claimed is None:
            return handled
        if handled == 0 and queue.is_async:
            ring(kind)
        run_claimed(claimed)
        handled += 1
    ring(kind)
    return handled


def drain_actions():
    from .executor import action_claim_next, action_run_claimed

    return _drain("actions", action_claim_next, action_run_claimed)


def drain_tasks():
    from .tasks import task_claim_next, task_run_claimed

    return _drain("tasks", task_claim_next, task_run_claimed)


DRAINS = {"actions": drain_actions, "tasks": drain_tasks}
