"""Retries of a task: a non-retryable error stops at once; a retryable one backs off
exponentially with jitter (ledger/retry.py) until the dead-letter queue; "run now" skips a
backoff and is audited.

A retryable failure is made real: the worker's SANDBOX_BASE_URL points at a port nobody
listens on, so `lookup_order` cannot connect (NotSent, retryable) on every attempt.
"""

import time
from datetime import datetime, timedelta

import django_rq
import psycopg
import pytest
import redis
from django.db import OperationalError, connection
from django.utils import timezone

from dlq.models import DeadLetter
from ledger import clock, jobs, runner
from ledger.connectors import http
from ledger.models import Action, ActionStatus, Task, TaskState
from ledger.runner import drain_tasks
from ledger.tasks import defer_until, task_expire_leases, task_request, task_run_now
from tests.conftest import REDIS_URL, _database_url, free_port, wait_until
from tests.factories import (a_real_deadlock, agent_api, audit_events, make_agent, refund_input, sandbox, sandbox_order, settled,
                             start_refund_task)

# BASE as in the stack (tests/conftest.py STACK_ENV); the cap is set lower where it shows.
BASE, CAP = 0.2, 0.8


def closed_port_url():
    return f"http://127.0.0.1:{free_port()}/sandbox/v1"  # nothing listens there


@pytest.fixture
def client(stack):
    return agent_api(stack.url, grants=("refund", "send_message"))


def test_an_unknown_order_fails_after_one_attempt_without_scheduling_a_retry(stack, client):
    task = start_refund_task(client, "refund-unknown", order="ORD-NOPE")
    stack.start_worker()
    row = settled(task)
    assert row.state == "failed"
    assert row.attempts == 1
    assert row.last_error["code"] == "unknown_order" and row.last_error["retryable"] is False
    assert not audit_events(row, "retry_scheduled").exists()
    # Failed for good: for a person to resolve or discard, never to redrive (not the attempts' queue).
    [entry] = DeadLetter.objects.filter(task=row)
    assert entry.status == "open" and entry.redrive_refusal


def test_a_retryable_failure_backs_off_exponentially_with_jitter_then_dead_letters(stack, client, settings):
    # Six attempts, so that five backoffs show the growth and then the cap.
    settings.MAX_ATTEMPTS = 6
    task, _ = task_request(agent=client.agent, task_id="refund-unreachable", workflow="refund",
                           input={"order_id": "ORD-1", "amount": "25.00", "currency": "EUR", "customer": "CUST-1"})
    stack.start_worker(SANDBOX_BASE_URL=closed_port_url(), BACKOFF_MAX_SECONDS=CAP)
    row = settled(task)
    assert row.state == "dead_lettered", row.last_error
    assert row.attempts == row.max_attempts == 6
    assert row.last_error["code"] == "connect_failed" and row.last_error["retryable"] is True

    retries = audit_events(row, "retry_scheduled")
    assert [e.after["attempts"] for e in retries] == [1, 2, 3, 4, 5]
    delays = [(datetime.fromisoformat(e.after["next_attempt_at"]) - e.occurred_at).total_seconds() for e in retries]
    # Attempt n waits between half and all of min(CAP, BASE * 2**(n-1)) ("equal jitter"),
    # counted from a moment a few milliseconds before the event was written.
    ceilings = [min(CAP, BASE * 2 ** (attempt - 1)) for attempt in range(1, 6)]
    assert ceilings == [0.2, 0.4, 0.8, 0.8, 0.8]
    for ceiling, delay in zip(ceilings, delays):
        assert ceiling / 2 - 0.05 <= delay <= ceiling + 0.01, (ceilings, delays)
    # Growth: each uncapped wait's floor is the previous one's ceiling.
    assert delays[0] <= delays[1] + 0.05 and delays[1] <= delays[2] + 0.05, delays
    # Each retry ran only after its backoff had passed.
    claims = audit_events(row, "claimed")
    assert len(claims) == 6
    for retry, next_claim in zip(retries, claims[1:]):
        assert next_claim.occurred_at >= datetime.fromisoformat(retry.after["next_attempt_at"])
    entry = DeadLetter.objects.get(task=row)
    assert entry.attempts == 6 and entry.last_error["code"] == "connect_failed"
    assert entry.alerts.count() == 1


def test_three_retryable_failures_through_the_api_dead_letter_after_two_backoffs(stack, client):
    task = start_refund_task(client, "refund-unreachable-api")
    stack.start_worker(SANDBOX_BASE_URL=closed_port_url())
    row = settled(task)
    assert (row.state, row.attempts, row.max_attempts) == ("dead_lettered", 3, 3)
    assert [e.after["attempts"] for e in audit_events(row, "retry_scheduled")] == [1, 2]


def test_a_task_whose_workers_keep_dying_is_dead_lettered_by_the_sweeper(stack, client):
    task, _ = task_request(agent=client.agent, task_id="refund-cursed", workflow="refund",
                           input={"order_id": "ORD-1", "amount": "25.00", "currency": "EUR", "customer": "CUST-1"})
    for attempt in range(1, 4):
        # A worker claims the task, then vanishes: its lease runs out without a heartbeat.
        Task.objects.get(pk=task.pk).claim(owner=f"tests:doomed-{attempt}")
        Task.objects.filter(pk=task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        assert task_expire_leases() == 1
    row = Task.objects.get(pk=task.pk)
    assert row.state == "dead_lettered" and row.attempts == 3
    assert row.last_error["code"] == "worker_lost" and "tests:doomed-3" in row.last_error["message"]
    assert len(audit_events(row, "lease_expired")) == 2
    [dead] = audit_events(row, "dead_lettered")
    assert dead.actor == "system:sweeper"
    entry = DeadLetter.objects.get(task=row)
    assert entry.status == "open" and entry.alerts.count() == 1


def test_run_now_moves_a_long_backoff_to_now_and_is_audited(stack, client):
    sandbox_order(client, "ORD-1", "CUST-1")
    task = start_refund_task(client, "refund-later", order="ORD-1", customer="CUST-1")
    # A backoff of about an hour, so the task sits in the queue until an operator acts.
    failing = stack.start_worker(SANDBOX_BASE_URL=closed_port_url(), BACKOFF_BASE_SECONDS=3600, BACKOFF_MAX_SECONDS=3600)
    row = wait_until(lambda: audit_events(task, "retry_scheduled").exists() and Task.objects.get(pk=task.pk),
                     seconds=20, message="the first retry to be scheduled")
    # Let the worker finish its follow-up drain job first: killed inside it, it would leave
    # the doorbell rung and swallow the ring below (see test_task_doorbell.py).
    doorbell = redis.Redis.from_url(REDIS_URL)
    wait_until(lambda: not doorbell.exists("surety:doorbell:tasks") and not django_rq.get_queue("default").count,
               seconds=10, message="the worker to go idle")
    stack.kill_worker(failing)
    assert row.state == "queued"
    assert row.next_attempt_at > timezone.now() + timedelta(minutes=25)

    stack.start_worker()
    before = timezone.now()
    task_run_now(row, actor="system:tests", reason="the provider is back")
    moved = Task.objects.get(pk=task.pk)
    assert before <= moved.next_attempt_at <= timezone.now()
    [event] = audit_events(moved, "run_now")
    assert event.actor == "system:tests" and event.reason == "the provider is back"
    assert datetime.fromisoformat(event.before["next_attempt_at"]) == row.next_attempt_at
    assert datetime.fromisoformat(event.after["next_attempt_at"]) == moved.next_attempt_at

    # The doorbell rang after commit: the task runs without waiting for the sweeper.
    done = wait_until(lambda: (t := Task.objects.get(pk=task.pk)).state == "succeeded" and t, seconds=20,
                      message="the task to run now")
    assert done.attempts == 2
    assert len(sandbox(client, "GET", "refunds", params={"order_id": "ORD-1"}).json()["data"]) == 1


def test_run_now_leaves_a_task_that_is_not_queued_alone(stack, client):
    task = start_refund_task(client, "refund-unknown-2", order="ORD-NOPE")
    stack.start_worker()
    row = settled(task)
    assert task_run_now(row, actor="system:tests").state == "failed"
    assert not audit_events(row, "run_now").exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("jobs_to_test_redis")
@pytest.mark.parametrize("past_the_drains_end", [False, True])
def test_a_run_the_database_cut_short_is_given_back_without_spending_an_attempt(settings, monkeypatch,
                                                                                past_the_drains_end):
    """The database drops the worker's connection mid-run (terminated for real, as a failover
    does) on the task's last attempt. The lane waits, and once the database answers gives the
    run back, its attempt with it: before, the task sat `running` until its lease lapsed, and
    the sweeper dead-lettered it `worker_lost`. Also when the run ends past the drain's end (a
    lane gave back only while its drain lasted). (The order look-up's answer is staged here: the
    provider is not what this is about.)"""
    settings.DRAIN_LANES = 1  # the lane runs in this thread, on this connection
    if past_the_drains_end:
        monkeypatch.setattr(jobs, "DRAIN_SECONDS", 1)
    agent = make_agent("billing", grants=("refund", "send_message"))[0]
    task, _ = task_request(agent=agent, task_id="refund-blip", workflow="refund", input=refund_input("ORD-B", "C-B"))
    Task.objects.filter(pk=task.pk).update(attempts=task.max_attempts - 1)
    cut = []

    def provider_while_the_database_drops_us(method, url, **kwargs):
        if method == "POST":  # the refund, then the customer's message
            return {"id": f"eff_{kwargs['headers']['Idempotency-Key']}"}
        if not cut:  # the first look-up of the order
            cut.append(connection.connection.info.backend_pid)
            with psycopg.connect(_database_url(), autocommit=True) as other:
                other.execute("SELECT pg_terminate_backend(%s)", cut)
            if past_the_drains_end:
                time.sleep(1.2)
        return {"order_id": "ORD-B", "customer": "C-B", "amount": "100.00"}

    monkeypatch.setattr(http, "call", provider_while_the_database_drops_us)
    drain_tasks()

    task.refresh_from_db()
    if past_the_drains_end:  # given back as the lane ended, for the next drain
        assert cut and (task.state, task.attempts) == (TaskState.QUEUED, task.max_attempts - 1), task.last_error
    else:
        assert cut and (task.state, task.attempts) == (TaskState.SUCCEEDED, task.max_attempts), task.last_error
    [given_back] = audit_events(task, "deferred")
    assert given_back.reason == "the database was unreachable during the run"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("jobs_to_test_redis")
def test_a_run_the_database_refused_is_not_given_back(settings, monkeypatch):
    """A statement the database refuses (here a real statement timeout) fails every run alike:
    given back each time with its attempt, the task looped for good instead of spending its
    attempts and reaching a person. Only a lost connection gives a run back."""
    settings.DRAIN_LANES = 1
    monkeypatch.setattr(jobs, "DRAIN_SECONDS", 2)
    agent = make_agent("billing", grants=("refund", "send_message"))[0]
    task, _ = task_request(agent=agent, task_id="refund-refused", workflow="refund",
                           input=refund_input("ORD-T", "C-T"))

    def look_up_past_the_statement_timeout(method, url, **kwargs):
        with connection.cursor() as cursor:
            cursor.execute("SET statement_timeout = '10ms'")
            try:
                cursor.execute("SELECT pg_sleep(0.2)")
            finally:
                cursor.execute("SET statement_timeout = 0")

    monkeypatch.setattr(http, "call", look_up_past_the_statement_timeout)
    drain_tasks()

    task.refresh_from_db()
    assert (task.state, task.attempts) == (TaskState.RUNNING, 1)  # left to its lease and the sweeper
    assert not audit_events(task, "deferred").exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("jobs_to_test_redis")
def test_a_run_the_database_rolled_back_for_a_deadlock_is_given_back_and_is_no_outage(settings, monkeypatch, caplog):
    """A deadlock is the database there, breaking a tie: the run is given back with its attempt
    (on its last one here), and the log says nothing of the database being away. (The look-up
    that meets it is staged; the deadlock is PostgreSQL's own.)"""
    settings.DRAIN_LANES = 1
    agent = make_agent("billing", grants=("refund", "send_message"))[0]
    task, _ = task_request(agent=agent, task_id="refund-tie", workflow="refund", input=refund_input("ORD-D", "C-D"))
    Task.objects.filter(pk=task.pk).update(attempts=task.max_attempts - 1)
    deadlock, met = a_real_deadlock(), []

    def provider_once_deadlocked(method, url, **kwargs):
        if method == "POST":
            return {"id": f"eff_{kwargs['headers']['Idempotency-Key']}"}
        if not met:
            met.append(True)
            raise deadlock
        return {"order_id": "ORD-D", "customer": "C-D", "amount": "100.00"}

    monkeypatch.setattr(http, "call", provider_once_deadlocked)
    drain_tasks()

    task.refresh_from_db()
    assert (task.state, task.attempts) == (TaskState.SUCCEEDED, task.max_attempts), task.last_error
    assert "unreachable" not in caplog.text


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("jobs_to_test_redis")
def test_a_run_whose_connection_dropped_after_its_wait_was_committed_is_not_given_back(settings, monkeypatch):
    """The run's last move (the task waits for a person) was committed, but the connection
    dropped before its COMMIT was answered. Given back, the waiting task was queued behind the
    person's back and its attempt returned a second time: on its first attempt, a CHECK refused
    the negative count, and the error ended the drain."""
    settings.DRAIN_LANES = 1
    agent = make_agent("billing", grants=("refund", "send_message"))[0]
    task, _ = task_request(agent=agent, task_id="refund-commit-lost", workflow="refund",
                           input=refund_input("ORD-C", "C-C"))

    def run_losing_the_answer_to_its_commit(task):
        task.wait_for_person(claim=task.fence, reason="refund-commit-lost:call_refund_api:v1 is needs_review")
        raise OperationalError("server closed the connection unexpectedly")  # no SQLSTATE: the connection is lost

    monkeypatch.setattr(runner, "task_run", run_losing_the_answer_to_its_commit)
    drain_tasks()

    task.refresh_from_db()
    assert (task.state, task.attempts) == (TaskState.WAITING, 0)
    assert not audit_events(task, "deferred").exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("jobs_to_test_redis")
def test_a_look_up_answer_postgresql_cannot_store_is_checkpointed_as_near_as_it_can(settings, monkeypatch):
    """An order whose answer carries a NUL (staged: the sandbox's own database cannot hold one) is
    checkpointed with it replaced, as an effect's answer is, instead of failing its checkpoint on
    every attempt until the task is dead-lettered."""
    settings.DRAIN_LANES = 1
    agent = make_agent("billing", grants=("refund", "send_message"))[0]
    task, _ = task_request(agent=agent, task_id="refund-nul", workflow="refund", input=refund_input("ORD-N", "C-N"))

    def provider(method, url, **kwargs):
        if method == "POST":
            return {"id": f"eff_{kwargs['headers']['Idempotency-Key']}"}
        return {"order_id": "ORD-N", "customer": "C-N\x00", "amount": "100.00"}

    monkeypatch.setattr(http, "call", provider)
    drain_tasks()

    task.refresh_from_db()
    assert task.state == TaskState.SUCCEEDED, task.last_error
    assert task.steps.get(name="lookup_order").result["customer"] == "C-N\ufffd"


@pytest.mark.django_db
@pytest.mark.parametrize("pending_for, looked_at_in", [(0.2, 1), (20, 10), (60, 1)])
def test_a_task_whose_action_is_pending_under_another_claim_looks_again_after_half_its_wait(
        settings, pending_for, looked_at_in):
    """A second at first (a call settles within seconds); after 20 s pending (its worker died), 10 s
    on, not every second until the sweeper takes it (each look is a claim and a deferral, two audit
    events); past the sweeper's moment (its lease's end and CONNECTOR_TIMEOUT), a second again."""
    settings.LEASE_SECONDS, settings.CONNECTOR_TIMEOUT = 30, 5
    now = clock.now()
    claimed = Action(status=ActionStatus.PENDING, lease_expires_at=now + timedelta(seconds=30 - pending_for))
    waited = (defer_until(claimed) - now).total_seconds()
    assert looked_at_in <= waited < looked_at_in + 0.5
