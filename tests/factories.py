"""Named actors and small helpers shared by the tests.

The actors are fixtures too (tests/conftest.py loads this module as a plugin): `agent`, the
billing agent; `operator`, olga, a person without rights; `auditor`, aldo, in the auditors'
group. A test module that needs one of them otherwise defines its own under the same name,
built with the same factories.
"""

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from decimal import Decimal
from types import SimpleNamespace

import httpx
import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.db import OperationalError, connection, transaction
from django.db.models import F
from django.utils import timezone

from approvals.decisions import review_decide
from approvals.models import ReviewItem
from console.sweeper import sweep_once
from ledger.actions import action_request
from ledger.agents import agent_create
from ledger.models import Action, ActionStatus, Agent, AuditEvent, Grant, StepStatus, Task, TaskStep
from ledger.tasks import task_request
from tests.conftest import _database_url, free_port, wait_until


GRANTS = ("refund", "send_message", "create_booking")


def make_agent(name, grants=GRANTS, owner=None, live=True):
    """Returns (agent, token). Its owner (every agent has one) is `owner`, or a person of the
    tests' own who decides nothing. Its grants are live unless `live` is false (then shadow,
    as a new agent's are in the product)."""
    owner = owner or get_user_model().objects.get_or_create(username="agents-owner")[0]
    agent, token = agent_create(name, actor="system:tests", grants=grants, owner=owner)
    if live:
        make_grants_live(agent)
    return agent, token


def person(username, group=None):
    """A person (no password) in `group` if one is named, the roles set up first."""
    call_command("setup_roles", verbosity=0)
    user = get_user_model().objects.create_user(username, password=None)
    if group:
        user.groups.add(Group.objects.get(name=group))
    return user


def confirmed_absent(action, *, by=None):
    """The recorded `action` claimed, its call's outcome unknown, the look unable to tell, and
    marked failed ("confirmed absent") by a person (`by`, else an approver): the ledger's own
    moves, as the executor and the review page make them. Returns it, refreshed."""
    action.claim(owner="tests:1")
    action.mark_unknown(actor="system:executor", claim=action.fence, verify_at=timezone.now(),
                        evidence={"code": "timeout"})
    action.mark_needs_review(actor="system:executor", evidence={"found": None})
    review_decide(ReviewItem.objects.get(action=action, status="open"), user=by or person("alice", "approvers"),
                  decision="mark_failed", reason="not in the provider's dashboard")
    action.refresh_from_db()
    return action


@pytest.fixture
def agent(db):
    """billing, an agent with the tests' usual grants, live; its API token as `agent.token`."""
    agent, token = make_agent("billing")
    agent.token = token
    return agent


@pytest.fixture
def operator(db):
    """olga, a person in no group and with no permission of her own."""
    return get_user_model().objects.create_user(username="olga", password=None)


@pytest.fixture
def auditor(db):
    """aldo, in the auditors' group."""
    return person("aldo", "auditors")


def make_grants_live(agent, until=None):
    """Every grant of the agent live until `until` (a year ahead), written straight to the
    table: past the replay gate and four eyes, which tests/ledger/test_shadow_grants.py tests."""
    promoter = get_user_model().objects.get_or_create(username="grants-promoter")[0]
    Grant.objects.filter(agent=agent).update(live_until=until or timezone.now() + timedelta(days=365),
                                             promoted_by=promoter, promoted_at=timezone.now())
    Agent.objects.filter(pk=agent.pk).update(grants_version=F("grants_version") + 1)
    agent.refresh_from_db(fields=["grants_version"])


def make_agent_on(client, name="billing", grants=GRANTS):
    """A new agent whose token Django's test `client` sends with every request from now on."""
    agent, token = make_agent(name, grants)
    client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    return agent


def api_client(base_url, token):
    return httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def agent_api(base_url, name="billing", grants=GRANTS):
    """A new agent's API client on the live server; the agent is `client.agent`, its token `client.token`."""
    agent, token = make_agent(name, grants)
    client = api_client(base_url, token)
    client.agent, client.token = agent, token
    return client


def send_together(url, token, sends):
    """Call every `send(client)` at the same moment, each on a connection and thread of its
    own (all connect first, then a barrier releases them); return the answers in order. One
    that raised fails the test with its exception."""
    barrier = threading.Barrier(len(sends))
    answers = [None] * len(sends)

    def run(i, send):
        try:
            with api_client(url, token) as client:
                client.get("/api/v1/schema")  # connect first, so the barrier releases ready sockets
                barrier.wait(60)
                answers[i] = send(client)
        except Exception as exc:  # noqa: BLE001 (reported below, with the others)
            answers[i] = exc
            barrier.abort()

    threads = [threading.Thread(target=run, args=(i, send)) for i, send in enumerate(sends)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    failed = [a for a in answers if not isinstance(a, httpx.Response)]
    assert not failed, f"{len(failed)} of {len(sends)} requests did not come back: {failed[:3]!r}"
    return answers


def sessions_waiting_for_a_lock(table=None):
    """How many other connections to this database wait for a lock (a row, an advisory lock,
    a unique key being written), in a statement naming `table` if given (PostgreSQL)."""
    with connection.cursor() as cursor:
        # Inside a transaction PostgreSQL answers from its first look at pg_stat_activity.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid() AND query ILIKE %s",
                       [f"%{table or ''}%"])
        return cursor.fetchone()[0]


def another_waits_for_a_lock(seconds=30):
    """Whether, within `seconds`, another connection waits for a lock: what a test racing two
    transactions waits for before it lets the first one commit, instead of a sleep. It answers as
    soon as one does: the bound is for a loaded machine, where the other may take seconds to get there."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if sessions_waiting_for_a_lock():
            return True
        time.sleep(0.01)
    return False


@contextmanager
def send_timed(monkeypatch, connector_class):
    """Times each `_send` of `connector_class` (observed, not replaced) while the block runs: yields
    the list of their seconds. What a call's deadline bounds is the send: the claim and the ledger's
    writes around it, which a loaded machine stretches, are left out."""
    took = []
    send = connector_class._send

    def timed(connector, action):
        started = time.monotonic()
        try:
            return send(connector, action)
        finally:
            took.append(time.monotonic() - started)

    monkeypatch.setattr(connector_class, "_send", timed)
    try:
        yield took
    finally:
        monkeypatch.setattr(connector_class, "_send", send)


def in_a_thread(work):
    """`work()` started in a thread of its own (its own connection, closed once it ends): the thread,
    and a list that holds, once it has ended, what `work()` answered or raised."""
    answer = []

    def run():
        try:
            answer.append(work())
        except BaseException as exc:  # noqa: BLE001 (looked at in the test's thread)
            answer.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, answer


def in_threads(*sends):
    """Run each `send()` in a thread of its own (its own connection) at once; their answers, in order."""
    started = [in_a_thread(send) for send in sends]
    for thread, _ in started:
        thread.join(30)
    return [answer[0] if answer else None for _, answer in started]


@contextmanager
def another_transaction(hold, *, commit_when_waited_on=False):
    """Run `hold()` in a transaction on a connection and thread of its own, and keep that
    transaction open while the with-block runs: what a request does while another one holds
    its locks, or has written rows it has not committed (PostgreSQL).

    It commits when the block ends or, with `commit_when_waited_on`, as soon as another
    connection waits for a lock (at the most 30 s), so that the block itself may wait on it;
    then the yielded `.waited` says whether one did. An error in `hold()` is raised here."""
    other = SimpleNamespace(waited=None, error=None)
    held, release = threading.Event(), threading.Event()

    def run():
        try:
            with transaction.atomic():
                hold()
                held.set()
                if commit_when_waited_on:
                    other.waited = another_waits_for_a_lock()
                else:
                    release.wait(30)
        except BaseException as exc:  # noqa: BLE001 (raised in the test's thread)
            other.error = exc
        finally:
            held.set()
            connection.close()  # the thread's own connection, or the test database stays in use

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert held.wait(10), "the other transaction did not get its locks"
        if other.error is None:
            yield other
    finally:
        release.set()
        thread.join(30)
    if other.error is not None:
        raise other.error


def refund_body(order="ORD-8841", amount="25.00", currency="EUR", customer="CUST-17", decision="dec-77", **extra):
    """A refund request. Two refunds of one order need two decisions: the ledger makes one
    refund per order and decision, whatever the key."""
    return {"action_type": "refund", "target": order, "customer": customer, "decision_id": decision,
            "params": {"amount": amount, "currency": currency, **extra}}


def message_body(target="ada@example.com", **params):
    return {"action_type": "send_message", "target": target, "decision_id": "dec-1",
            "params": {"channel": "email", "message_type": "receipt", "body": "Thanks!", **params}}


def booking_body(start="2026-09-10T10:00:00Z", end="2026-09-10T11:00:00Z", customer="CUST-17", decision="dec-1"):
    """A booking of ROOM-1; a `customer` of None leaves the field out."""
    body = {"action_type": "create_booking", "target": "ROOM-1", "decision_id": decision,
            "params": {"service": "massage", "start": start, "end": end}}
    if customer is not None:
        body["customer"] = customer
    return body


def post_action(client, key, body):
    """POST /api/v1/actions to a live server, with an httpx client."""
    return client.post("/api/v1/actions", json=body, headers={"Idempotency-Key": key})


def post_action_in_process(client, key, body, *, headers=None, content_type="application/json"):
    """POST /api/v1/actions with Django's test client: a dict or a list is sent as JSON, bytes
    or a str as they are; a `key` of None sends no Idempotency-Key."""
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    headers = {**({} if key is None else {"Idempotency-Key": key}), **(headers or {})}
    return client.generic("POST", "/api/v1/actions", content, content_type=content_type, headers=headers)


def required_in(status, retryable=True):
    """What the database's check constraints ask of an action row in `status` (and what a
    failed row needs to be retried or not)."""
    S = ActionStatus
    return {
        S.SUCCEEDED: {"external_ref": "re_existing"},
        S.FAILED: {"error": {"code": "declined", "message": "no", "retryable": retryable}},
        S.QUEUED: {"next_attempt_at": timezone.now()},
        S.UNKNOWN: {"next_attempt_at": timezone.now()},
        S.PENDING: {"lease_expires_at": timezone.now() + timedelta(seconds=30)},
        S.EXPIRED: {"error": {"code": "approval_expired", "message": "nobody decided", "retryable": False}},
    }.get(status, {})


def new_action(agent, status, *, key="refund:ORD-1:full:dec-1", target="ORD-1", amount="25.00", retryable=True,
               **fields):
    """An action row made straight in `status`, not through the intake, and not saved yet: a
    refund of `amount` EUR, with what its status requires; `fields` set any other column."""
    values = {"operation_key": key, "fingerprint": "f" * 64, "action_type": "refund", "target": target,
              "params": {"amount": amount, "currency": "EUR"}, "amount": Decimal(amount), "currency": "EUR",
              "agent": agent, "status": status}
    return Action(**{**values, **required_in(status, retryable), **fields})


def make_action(agent, status, **kwargs):
    """`new_action`, saved."""
    action = new_action(agent, status, **kwargs)
    action.save(force_insert=True)
    return action


def audit_events(obj, verb=None):
    """The audit events about `obj`, oldest first; with `verb`, only those."""
    events = AuditEvent.objects.history(obj)
    return events if verb is None else events.filter(verb=verb)


def sandbox(client, method, path, **kwargs):
    return client.request(method, f"/sandbox/v1/{path}", **kwargs)


def sandbox_without_idempotency(client):
    """The sandbox provider stops recognising repeated keys: only the ledger then stands between
    a lost answer and a second effect."""
    response = sandbox(client, "PUT", "settings", json={"idempotency": False})
    assert response.json() == {"idempotency": False}, response.text


def sandbox_order(client, order, customer, amount="100.00"):
    """A new order at the sandbox provider, which a refund task's `lookup_order` finds."""
    response = sandbox(client, "POST", "orders",
                       json={"order_id": order, "customer": customer, "amount": amount, "currency": "EUR"})
    assert response.status_code == 201, response.text


def sandbox_list(client, kind, **params):
    """What the sandbox provider holds: its `kind` ("refunds", "messages", "bookings") matching `params`."""
    response = sandbox(client, "GET", kind, params=params)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def refund_input(order, customer, amount="25.00"):
    return {"order_id": order, "amount": amount, "currency": "EUR", "customer": customer}


def refund_task_body(order="ORD-8841", amount="25.00", customer="CUST-17"):
    return {"workflow": "refund", "input": refund_input(order, customer, amount)}


def post_task(client, task_id, body):
    return client.post("/api/v1/tasks", json=body, headers={"Idempotency-Key": task_id})


def start_refund_task(client, task_id, order="ORD-8841", customer="CUST-17"):
    """POST a refund task (201) and return its row."""
    response = post_task(client, task_id, refund_task_body(order, customer=customer))
    assert response.status_code == 201, response.text
    return Task.objects.get(task_id=task_id)


def settled(task, seconds=30):
    """The task's row once it is neither queued nor running. Sweeps meanwhile, as the sweeper
    process would: it rings again for work whose job was lost with a killed worker."""
    def check():
        sweep_once()
        row = Task.objects.get(pk=task.pk)
        return row.state not in ("queued", "running") and row

    return wait_until(check, seconds=seconds, interval=0.2, message=f"task {task.task_id} to settle")


def dead_letter(agent, task_id, *, order=None, customer=None, done=None):
    """A refund task that ran out of attempts, made in this process: claimed once, optionally
    with steps already done in its checkpoint (`done`: step name -> result), then dead-lettered."""
    task, _ = task_request(agent=agent, task_id=task_id, workflow="refund",
                           input=refund_input(order or f"ORD-{task_id}", customer or f"CUST-{task_id}"))
    task.claim(owner="tests:1")
    for name, result in (done or {}).items():
        TaskStep.objects.filter(task=task, name=name).update(status=StepStatus.DONE, result=result)
    error = {"code": "crash", "message": "the worker gave up", "retryable": True, "step": "call_refund_api"}
    return open_entry(task.mark_dead_lettered(actor="system:tests", error=error))


def attempt_failed(action, *, retryable):
    """The action's one attempt failed: retryable (never reached the provider) or for good (declined)."""
    action = action.claim(owner="tests:1")
    return action.mark_failed(actor="system:executor", code="connect_failed" if retryable else "declined",
                              message="it did not happen", retryable=retryable, claim=action.fence)


def dead_lettered_with_a_declined_step(agent, task_id, customer):
    """(a refund task, its step's refund): the refund declined for good, then the task dead-lettered
    as the sweeper does when its worker's lease lapses."""
    task, _ = task_request(agent=agent, task_id=task_id, workflow="refund", input=refund_input("ORD-T", customer))
    task = task.claim(owner="tests:1")
    declined, _ = action_request(agent=agent, operation_key=f"{task_id}:call_refund_api:v1", action_type="refund",
                                 target="ORD-T", customer=customer, decision_id=task_id, task=task,
                                 params={"amount": "25.00", "currency": "EUR"})
    declined = attempt_failed(declined, retryable=False)
    task.refresh_from_db()
    task.mark_dead_lettered(actor="system:sweeper", claim=task.fence,
                            error={"code": "worker_lost", "message": "the lease lapsed", "retryable": True})
    return task, declined


def failed_task_entry(agent, task_id):
    """A refund task whose refund was refused for good, made in this process: final (no redrive),
    with its open entry."""
    task, _ = task_request(agent=agent, task_id=task_id, workflow="refund",
                           input=refund_input(f"ORD-{task_id}", f"CUST-{task_id}"))
    task.claim(owner="tests:1")
    error = {"code": "declined", "message": "refused", "retryable": False, "step": "call_refund_api"}
    return open_entry(task.mark_failed(actor="system:tests", error=error))


def open_entry(task):
    """The task's open dead-letter entry (the dead-letter queue's reaction to its move)."""
    return task.dead_letters.get(status="open")


def a_real_deadlock():
    """A deadlock PostgreSQL broke, as Django raises it: two sessions each wait for the lock the
    other holds, and the database rolls one of them back."""
    url = _database_url()
    with psycopg.connect(url) as first, psycopg.connect(url) as second:
        first.execute("SELECT pg_advisory_xact_lock(23001)")
        second.execute("SELECT pg_advisory_xact_lock(23002)")

        def wait_for(session, key):
            try:
                session.execute("SELECT pg_advisory_xact_lock(%s)", [key])
            except psycopg.errors.DeadlockDetected as exc:
                return exc
            finally:
                session.rollback()

        with ThreadPoolExecutor(2) as both:
            waits = [both.submit(wait_for, first, 23002), both.submit(wait_for, second, 23001)]
            [broken] = [wait.result() for wait in waits if wait.result() is not None]
    try:
        raise OperationalError(*broken.args) from broken
    except OperationalError as wrapped:
        return wrapped


@contextmanager
def database_away():
    """The database does not answer: this process's connection closed and pointed at a port
    where nothing listens, as if PostgreSQL had gone away (put back afterwards)."""
    port = connection.settings_dict["PORT"]
    connection.close()
    connection.settings_dict["PORT"] = free_port()
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict["PORT"] = port


REAL_NOW = timezone.now


def host_clock_off_by(monkeypatch, seconds):
    """This process's host clock `seconds` ahead of the database's (behind if negative), read afresh:
    the host clock itself cannot be set from a test, so Django's `timezone.now` is moved."""
    from ledger import clock

    monkeypatch.setattr(timezone, "now", lambda: REAL_NOW() + timedelta(seconds=seconds))
    clock.forget()


def stripe_webhooks_configured(settings, live_secret, test_secret, api_key="sk_live_x"):
    """Refunds through the Stripe connector (its own key `api_key`) whose webhooks are signed with
    `live_secret`, and with `test_secret` in its test mode (the replay set's; None: no secret of
    its own, as STRIPE_TEST_API_KEY alone configures it): for tests that deliver signed events in
    process and never call Stripe (its API base answers nothing)."""
    settings.SURETY_CONNECTORS = {**settings.SURETY_CONNECTORS, "refund": {
        "class": "ledger.connectors.stripe.StripeConnector",
        "options": {"api_key": api_key, "api_base": "http://stripe.invalid", "webhook_secret": live_secret},
        "test_mode": {"options": {"api_key": "sk_test_x", **({"webhook_secret": test_secret} if test_secret else {})}},
    }}
