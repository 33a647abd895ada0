"""Leases, verification and due times are told by the database's clock, whatever a host's says.

The hosts here share one clock, so a host whose clock is off is this process with Django's
`timezone.now` moved (the only stand-in in these tests: the host clock itself cannot be set
from a test). Each test also shows that the host's clock alone would have decided otherwise.
"""

import threading
import time
from datetime import timedelta

import django_rq
import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rq.registry import ScheduledJobRegistry

from ledger import clock, jobs
from ledger.actions import action_request
from ledger.executor import action_claim_next, action_expire_leases
from ledger.models import Action
from ledger.retry import backoff_until
from ledger.tasks import task_claim_next, task_request
from tests.factories import host_clock_off_by, make_agent, refund_input

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]


@pytest.fixture(autouse=True)
def _read_the_clock_afresh():
    clock.forget()
    yield
    clock.forget()


def database_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def refund(agent, key="clock-1"):
    action, _ = action_request(agent=agent, operation_key=key, action_type="refund", target="ORD-1",
                               params={"amount": "5.00", "currency": "EUR"})
    return action


def test_a_sweeper_whose_clock_runs_ahead_leaves_a_live_lease_alone(agent, monkeypatch):
    refund(agent)
    action = action_claim_next("worker-on-time")
    assert action.status == "pending"
    host_clock_off_by(monkeypatch, 60)  # the sweeper's host
    # On its own clock the lease ended long ago, CONNECTOR_TIMEOUT included:
    assert timezone.now() - timedelta(seconds=settings.CONNECTOR_TIMEOUT) > action.lease_expires_at
    assert action_expire_leases() == 0
    assert Action.objects.get(pk=action.pk).status == "pending"


def test_a_verifier_whose_clock_runs_ahead_does_not_look_before_the_provider_could_answer(agent, monkeypatch):
    refund(agent)
    action = action_claim_next("worker")
    action.mark_unknown(actor="system:tests", claim=action.fence,
                        verify_at=clock.now() + timedelta(seconds=settings.CONNECTOR_TIMEOUT), evidence={})
    host_clock_off_by(monkeypatch, 60)  # the verifier's host
    assert Action.objects.get(pk=action.pk).next_attempt_at < timezone.now()  # due, on its own clock
    assert action_claim_next("verifier") is None


def test_a_worker_whose_clock_runs_behind_still_holds_its_lease_for_the_whole_lease(agent, monkeypatch):
    refund(agent)
    host_clock_off_by(monkeypatch, -60)  # the worker's host
    action = action_claim_next("worker-behind")
    left = (action.lease_expires_at - database_now()).total_seconds()
    assert settings.LEASE_SECONDS - 2 < left <= settings.LEASE_SECONDS
    assert abs(action.lease_left() - left) < 2


@pytest.mark.parametrize("ahead", [60, 0.05], ids=["a minute", "a round trip"])
def test_what_a_host_whose_clock_runs_ahead_records_is_due_at_once_on_every_other(agent, monkeypatch, ahead):
    """Recorded on a host ahead (by a minute, or by no more than the half round trip the
    database's clock is read within), an action or a task is due now for a worker on time: on
    the recording host's own clock it waited that long, and a drain rung for it found nothing."""
    host_clock_off_by(monkeypatch, ahead)  # the intake's host
    action = refund(agent)
    task, _ = task_request(agent=make_agent("tasks-bot", grants=("refund", "send_message"))[0], task_id="clock-t",
                           workflow="refund", input=refund_input("ORD-2", "C-2"))
    assert action.next_attempt_at < timezone.now() - timedelta(seconds=ahead) + timedelta(seconds=1)
    host_clock_off_by(monkeypatch, 0)  # the worker's host
    assert action_claim_next("worker-on-time").pk == action.pk
    assert task_claim_next("worker-on-time").pk == task.pk


def test_a_backoff_is_counted_on_the_database_clock(agent, monkeypatch):
    host_clock_off_by(monkeypatch, 60)
    until = backoff_until(1)
    assert until - database_now() <= timedelta(seconds=settings.BACKOFF_BASE_SECONDS)


def test_the_database_clock_is_read_once_a_minute(monkeypatch):
    with CaptureQueriesContext(connection) as reads:
        first, second = clock.now(), clock.now()
    assert len(reads) == 1 and abs((second - first).total_seconds()) < 1
    theirs, at, wall = clock._reading
    monkeypatch.setattr(clock, "_reading", (theirs, at - clock.REFRESH_SECONDS - 1, wall - clock.REFRESH_SECONDS - 1))
    with CaptureQueriesContext(connection) as reads:
        clock.now()
    assert len(reads) == 1


def test_a_step_of_the_host_clock_after_the_reading_does_not_move_the_ledgers(monkeypatch):
    """NTP stepping a clock that was a minute off, after the process read the database's."""
    clock.now()
    real_time, real_now = time.time, timezone.now
    monkeypatch.setattr(time, "time", lambda: real_time() + 60)
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(seconds=60))
    with CaptureQueriesContext(connection) as reads:
        told = clock.now()
    assert abs((told - database_now()).total_seconds()) < 1
    assert len(reads) == 1  # the wall clock and the monotonic one disagree: it was read again


@pytest.mark.parametrize("ahead", [60, -60], ids=["ahead", "behind"])
def test_a_drain_due_later_is_scheduled_for_that_moment_on_the_hosts_clock(monkeypatch, ahead):
    """A due time is the database's; RQ's scheduler fires a job by its host's clock. On a host a
    minute ahead, the drain for work due in 30 s was set to fire 30 s ago (the drain found nothing
    due, and the work waited for the sweeper's ring); a minute behind, 90 s late. (PostgreSQL
    only, as this file: on SQLite the database's clock is the host's.)"""
    redis_client = jobs.redis_connection()
    redis_client.flushdb()
    host_clock_off_by(monkeypatch, ahead)
    with transaction.atomic():
        jobs.ring_after_commit("actions", at=clock.now() + timedelta(seconds=30))
    registry = ScheduledJobRegistry(queue=django_rq.get_queue("default", connection=redis_client))
    [job_id] = registry.get_job_ids()
    fires = registry.get_scheduled_time(job_id)
    # RQ keeps whole seconds, and jobs.enqueue adds one for its scheduler's early firing.
    assert abs((fires - (timezone.now() + timedelta(seconds=31))).total_seconds()) < 2
    redis_client.flushdb()


def test_a_thread_whose_reading_is_slow_keeps_no_other_thread_waiting():
    """Each thread reads on its own connection: one whose round trip hangs (a connection the network
    lost, a database blip) must not hold every thread of the process that asks the time meanwhile."""
    from django.db import connections

    started, release = threading.Event(), threading.Event()

    def slow(execute, sql, params, many, context):
        started.set()
        release.wait(5)
        return execute(sql, params, many, context)

    def slow_reader():
        try:
            with connection.execute_wrapper(slow):
                clock.now()
        finally:
            connections.close_all()

    reader = threading.Thread(target=slow_reader)
    reader.start()
    try:
        assert started.wait(5)
        began = time.monotonic()
        told = clock.now()  # this thread's own reading, while the other's hangs
        assert time.monotonic() - began < 1
        assert abs((told - database_now()).total_seconds()) < 1
    finally:
        release.set()
        reader.join(10)


def test_a_bulk_redrive_keeps_its_rate_on_the_database_clock(agent, monkeypatch):
    """The job that takes a run over may run on a host whose clock is ahead: on its own clock the
    next slot (the last redrive plus the rate's spacing, 10 s here) had passed, and it redrove the
    next entry at once, past the rate the person set for the provider's sake."""
    from dlq import bulk
    from dlq.redrive_runs import BulkRedrive, BulkRedriveItem, Outcome, Plan
    from tests.factories import dead_letter, person

    olga = person("olga")
    first, second = dead_letter(agent, "bulk-1"), dead_letter(agent, "bulk-2")
    run = BulkRedrive.objects.create(status="running", planned_by="olga", started_by=olga, started_at=clock.now(),
                                     rate=6, ceiling=60)
    BulkRedriveItem.objects.create(run=run, entry=first, position=1, plan=Plan.TASK_RESUME,
                                   outcome=Outcome.REDRIVEN, redriven_at=clock.now())
    waiting = BulkRedriveItem.objects.create(run=run, entry=second, position=2, plan=Plan.TASK_RESUME)
    naps = []
    monkeypatch.setattr(bulk.time, "sleep", naps.append)
    host_clock_off_by(monkeypatch, 30)  # the host of the job that takes the run over

    bulk.bulk_redrive_work(run.pk, "job-on-a-host-ahead", seconds=0.2)

    assert BulkRedriveItem.objects.get(pk=waiting.pk).outcome == Outcome.PLANNED
    assert naps and set(naps) == {bulk.POLL_SECONDS}  # it waits for the slot, a short nap at a time
