"""Never silent, for every action: a standalone action that fails for good (the provider refused
it) or runs out of attempts gets a dead-letter entry and an alert in the same transaction, with
its ledger row and evidence in the alert; the agent's owner hears of a refusal; the entry is
redriven through the guarded executor, resolved or discarded, each audited; the database
refuses an entry about both a task and an action, or about neither."""

import re

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core import mail
from django.core.management import call_command
from django.db import IntegrityError, transaction
from guardian.shortcuts import assign_perm

from dlq.alerts import alert_deliver, channels
from dlq.entries import deadletter_discard, deadletter_redrive, deadletter_resolve
from dlq.models import Alert, DeadLetter, EntryStatus
from ledger.access import WORK_DLQ
from ledger.actions import action_request
from ledger.audit import actor_label
from ledger.executor import action_claim_next, action_run_claimed
from ledger.models import Action, Agent, Booking, Capability, InvalidTransition, Task
from tests.conftest import free_port, wait_until
from tests.factories import (api_client, audit_events, dead_letter, make_action, make_agent, post_action, refund_body,
                             sandbox, sandbox_list)

E = EntryStatus
User = get_user_model()


def owned_agent(name, owner):
    """An agent whose owner is `owner` (the factory's agents belong to a person of the tests')."""
    agent, token = make_agent(name, grants=("refund",))
    Agent.objects.filter(pk=agent.pk).update(owner=owner)
    agent.owner, agent.token = owner, token
    return agent


@pytest.fixture
def owner(stack):
    return User.objects.create_user(username="oona", email="oona@surety.example", password=None)


@pytest.fixture
def agent(stack, owner):
    return owned_agent("billing", owner)


@pytest.fixture
def operator(stack):
    """olga, an operator: the role works an action's entry by the permission on its action
    type, a task's by the one on its workflow."""
    call_command("setup_roles", verbosity=0)
    user = User.objects.create_user(username="olga", password=None)
    user.groups.add(Group.objects.get(name="operators"))
    return user


def declined(stack, agent, key, order):
    """A standalone refund the sandbox provider declines, run by the executor in this process
    (no worker listens, so its alert waits to be delivered by the test)."""
    client = api_client(stack.url, agent.token)
    assert sandbox(client, "POST", "faults", json={"target": order, "fault": "decline", "times": 1}).status_code in (200, 201)
    assert post_action(client, key, refund_body(order=order, customer=f"CUST-{order}")).status_code == 201
    action_run_claimed(action_claim_next("tests:1"))
    return Action.objects.get(operation_key=key)


def test_a_refund_the_provider_declines_ends_failed_with_an_open_entry_and_one_alert(stack, agent):
    client = api_client(stack.url, agent.token)
    assert sandbox(client, "POST", "faults", json={"target": "ORD-DEC", "fault": "decline", "times": 1}).status_code in (200, 201)
    stack.start_worker()
    assert post_action(client, "refund:ORD-DEC:full:dec-1", refund_body(order="ORD-DEC")).status_code == 201

    action = wait_until(lambda: Action.objects.filter(operation_key="refund:ORD-DEC:full:dec-1", status="failed").first(),
                        message="the declined refund to fail")
    assert action.error["code"] == "declined" and action.error["retryable"] is False
    entry = DeadLetter.objects.get(action=action)
    assert entry.status == E.OPEN and entry.task is None and entry.attempts == 1
    assert entry.last_error == action.error
    assert entry.snapshot["operation_key"] == action.operation_key and entry.snapshot["status"] == "failed"
    [opened] = audit_events(entry, "dead_letter_opened")
    assert opened.actor == "system:executor"
    [alert] = entry.alerts.all()
    assert "refund:ORD-DEC:full:dec-1" in alert.subject
    for text in ("Operation key: refund:ORD-DEC:full:dec-1", "Target: ORD-DEC", "Customer: CUST-17",
                 "Amount: 25.00 EUR", "Status: failed", "declined", "not retryable"):
        assert text in alert.body, (text, alert.body)
    assert not sandbox_list(client, "refunds", order_id="ORD-DEC")

    # The worker delivers it: to operations, and to the agent's owner (a refusal is theirs to fix).
    delivered = wait_until(lambda: Alert.objects.filter(pk=alert.pk, delivered_at__isnull=False).first(),
                           message="the alert to be delivered")
    deliveries = {d.channel: d for d in delivered.deliveries.all()}
    assert set(deliveries) == {"email", "owner"} and all(d.ok for d in deliveries.values())
    assert deliveries["owner"].detail == "mailed to oona@surety.example"


def test_the_owner_is_mailed_the_row_and_evidence_and_an_ownerless_mail_goes_to_operations_only(stack, agent):
    action = declined(stack, agent, "refund:ORD-OWN:full:dec-1", "ORD-OWN")
    alert = DeadLetter.objects.get(action=action).alerts.get()

    alert_deliver(alert.pk)

    by_recipient = {tuple(m.to): m for m in mail.outbox}
    assert set(by_recipient) == {tuple(settings.ALERT_EMAILS), ("oona@surety.example",)}
    owner_mail = by_recipient[("oona@surety.example",)]
    assert "refund:ORD-OWN:full:dec-1" in owner_mail.subject
    for text in ("Operation key: refund:ORD-OWN:full:dec-1", "Type: refund", "Target: ORD-OWN", "Amount: 25.00 EUR",
                 "declined", f"/dlq/{alert.dead_letter_id}/"):
        assert text in owner_mail.body, (text, owner_mail.body)
    assert owner_mail.body == by_recipient[tuple(settings.ALERT_EMAILS)].body

    # An owner without an address (or not an active user) is not a channel: operations only.
    silent_owner = User.objects.create_user(username="no-mail", password=None)
    other = owned_agent("other", silent_owner)
    second = DeadLetter.objects.get(action=declined(stack, other, "refund:ORD-NOMAIL:full:dec-1", "ORD-NOMAIL")).alerts.get()
    assert channels(second) == ["email"]


def test_a_refund_that_never_reaches_the_provider_is_dead_lettered_after_the_last_attempt_then_redriven_once(
        stack, agent, operator):
    client = api_client(stack.url, agent.token)
    unreachable = stack.start_worker(SANDBOX_BASE_URL=f"http://127.0.0.1:{free_port()}/sandbox/v1")
    key = "refund:ORD-NOTSENT:full:dec-1"
    assert post_action(client, key, refund_body(order="ORD-NOTSENT")).status_code == 201

    action = wait_until(lambda: Action.objects.filter(operation_key=key, status="failed").first(), seconds=30,
                        message="the refund to run out of attempts")
    stack.kill_worker(unreachable)
    assert action.attempts == settings.MAX_ATTEMPTS == 3
    assert action.error["code"] == "connect_failed" and action.error["retryable"] is True
    entry = DeadLetter.objects.get(action=action, status=E.OPEN)
    assert [e["attempt"] for e in entry.snapshot["evidence"]] == [1, 2]  # the two requeued attempts
    [alert] = entry.alerts.all()
    assert "Evidence (2):" in alert.body and "connect_failed" in alert.body
    assert channels(alert) == ["email"]  # retryable: operations, not the owner

    stack.start_worker()
    redriven = deadletter_redrive(entry, actor=operator, reason="provider reachable again")
    assert redriven.status == E.REDRIVEN and redriven.decided_by == "user:olga"
    action = wait_until(lambda: Action.objects.filter(operation_key=key, status="succeeded").first(),
                        message="the redriven refund to succeed")
    assert action.attempts == 4
    assert [r["operation_key"] for r in sandbox_list(client, "refunds", order_id="ORD-NOTSENT")] == [key]
    [requeued] = [e for e in audit_events(action, "requeued") if e.actor == "user:olga"]
    assert requeued.reason == "provider reachable again" and requeued.before["status"] == "failed"
    assert not audit_events(action, "retry_allowed")  # it was retryable: nothing lifted
    assert DeadLetter.objects.filter(action=action).count() == 1


def test_a_refund_verified_absent_after_its_last_attempt_is_dead_lettered_then_redriven_to_one_effect(
        stack, agent, operator):
    client = api_client(stack.url, agent.token)
    key = "refund:ORD-SLOW:full:dec-1"
    # Each call stalls past the connector's timeout without committing: outcome unknown, then
    # verified absent at the provider, three times.
    fault = {"target": "ORD-SLOW", "fault": "timeout_before_commit", "times": settings.MAX_ATTEMPTS}
    assert sandbox(client, "POST", "faults", json=fault).status_code in (200, 201)
    stack.start_worker()
    assert post_action(client, key, refund_body(order="ORD-SLOW")).status_code == 201

    action = wait_until(lambda: Action.objects.filter(operation_key=key, status="failed").first(), seconds=60,
                        message="the refund to be verified absent after its last attempt")
    assert action.error["code"] == "attempts_exhausted" and action.attempts == settings.MAX_ATTEMPTS
    entry = DeadLetter.objects.get(action=action, status=E.OPEN)
    assert [e.get("found") for e in entry.snapshot["evidence"] if "found" in e] == [False] * settings.MAX_ATTEMPTS
    assert "attempts_exhausted" in entry.alerts.get().body
    assert not sandbox_list(client, "refunds", order_id="ORD-SLOW")

    deadletter_redrive(entry, actor=operator, reason="provider recovered")
    action = wait_until(lambda: Action.objects.filter(operation_key=key, status="succeeded").first(), seconds=30,
                        message="the redriven refund to succeed")
    assert [r["operation_key"] for r in sandbox_list(client, "refunds", order_id="ORD-SLOW")] == [key]


def test_a_refusal_is_redriven_only_by_a_person_who_gives_a_reason(stack, agent, operator):
    action = declined(stack, agent, "refund:ORD-FIX:full:dec-1", "ORD-FIX")
    entry = DeadLetter.objects.get(action=action)
    assert entry.redrive_needs_reason

    for actor, reason, refusal in ((operator, "  ", "reason"), ("system:sweeper", "fixed", "person")):
        with pytest.raises(ValueError, match=refusal):
            deadletter_redrive(entry, actor=actor, reason=reason)
    assert DeadLetter.objects.get(pk=entry.pk).status == E.OPEN
    assert Action.objects.get(pk=action.pk).status == "failed" and not audit_events(action, "retry_allowed")

    deadletter_redrive(entry, actor=operator, reason="card limit raised by the customer")
    action.refresh_from_db()
    assert action.status == "queued" and action.error["retryable"] is True
    [allowed] = audit_events(action, "retry_allowed")
    assert allowed.actor == "user:olga" and allowed.reason == "card limit raised by the customer"
    assert allowed.before["error"]["retryable"] is False and allowed.before["error"]["code"] == "declined"

    action_run_claimed(action_claim_next("tests:2"))  # the guarded executor, as a worker runs it
    action.refresh_from_db()
    assert action.status == "succeeded"
    client = api_client(stack.url, agent.token)
    assert [r["operation_key"] for r in sandbox_list(client, "refunds", order_id="ORD-FIX")] == [action.operation_key]


def test_the_dashboard_refuses_a_refusals_redrive_without_a_reason_and_a_person_without_the_permission(
        stack, agent, operator, client):
    entry = DeadLetter.objects.get(action=declined(stack, agent, "refund:ORD-PAGE:full:dec-1", "ORD-PAGE"))
    client.force_login(operator)
    page = client.get(f"/dlq/{entry.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "refund:ORD-PAGE:full:dec-1" in html and 'id="action-row"' in html and "Action history" in html
    assert 'id="redrive-form"' in html and "say what was fixed" in html

    answer = client.post(f"/dlq/{entry.pk}/redrive", {"reason": ""}, follow=True)
    assert answer.status_code == 200 and "Not done: a reason is required" in answer.content.decode()
    assert DeadLetter.objects.get(pk=entry.pk).status == E.OPEN
    assert Action.objects.get(pk=entry.action_id).status == "failed"

    client.force_login(User.objects.create_user(username="nora", password=None))
    call_command("setup_roles", verbosity=0)
    User.objects.get(username="nora").groups.add(Group.objects.get(name="auditors"))
    assert client.post(f"/dlq/{entry.pk}/redrive", {"reason": "fixed"}).status_code == 403
    assert DeadLetter.objects.get(pk=entry.pk).status == E.OPEN

    queue = client.get("/dlq/").content.decode()
    assert "refund:ORD-PAGE:full:dec-1" in queue and "refund action" in queue


def test_a_bulk_discard_touches_the_action_entries_of_types_the_person_may_work_only(stack, agent, operator, client):
    entries = [DeadLetter.objects.get(action=declined(stack, agent, f"refund:ORD-B{n}:full:dec-1", f"ORD-B{n}"))
               for n in range(2)]
    task_only = User.objects.create_user(username="tom", password=None)
    task_only.groups.add(Group.objects.get(name="auditors"))  # on the dashboard, with a workflow's permission only
    assign_perm(f"ledger.{WORK_DLQ}", task_only, Capability.objects.get(kind="workflow", name="refund"))
    client.force_login(task_only)
    assert client.post("/dlq/bulk", {"op": "discard", "status": "open", "code": "declined"}).context["total"] == 0

    client.force_login(operator)
    preview = client.post("/dlq/bulk", {"op": "discard", "status": "open", "code": "declined"})
    assert preview.context["total"] == 2
    # Ids no row can have (past a bigint, past what Python's int() reads) are passed over, not a 500.
    shown = [*(entry.pk for entry in entries), "1" * 5000, str(2**63)]
    done = client.post("/dlq/bulk", {"op": "discard", "status": "open", "code": "declined", "confirm_count": "2",
                                     "entry": shown, "reason": "duplicates of refunds made by hand"})
    assert done.status_code == 302
    assert set(DeadLetter.objects.values_list("status", flat=True)) == {E.DISCARDED}
    for entry in entries:
        [event] = audit_events(entry, "discarded")
        assert (event.actor, event.reason) == ("user:olga", "duplicates of refunds made by hand")


def test_resolving_and_discarding_an_action_entry_need_a_reason_leave_it_failed_and_are_audited(stack, agent, operator):
    first = DeadLetter.objects.get(action=declined(stack, agent, "refund:ORD-R:full:dec-1", "ORD-R"))
    second = DeadLetter.objects.get(action=declined(stack, agent, "refund:ORD-D:full:dec-1", "ORD-D"))
    with pytest.raises(ValueError):
        deadletter_resolve(first, actor=operator, note=" ")
    with pytest.raises(ValueError):
        deadletter_discard(second, actor=operator, reason="")

    deadletter_resolve(first, actor=operator, note="refunded by hand, ticket 8812")
    deadletter_discard(second, actor=operator, reason="the customer withdrew the claim")

    [resolved] = audit_events(first, "resolved")
    [discarded] = audit_events(second, "discarded")
    assert (resolved.actor, resolved.reason) == ("user:olga", "refunded by hand, ticket 8812")
    assert (discarded.actor, discarded.reason) == ("user:olga", "the customer withdrew the claim")
    assert set(Action.objects.filter(pk__in=[first.action_id, second.action_id]).values_list("status", flat=True)) == {
        "failed"}
    with pytest.raises(InvalidTransition, match="already discarded"):
        deadletter_redrive(second, actor=operator, reason="changed my mind")


# --- Which failures open an entry -----------------------------------------------------------------


def failed_from(agent, status, *, key, retryable, attempts, task=None):
    action = make_action(agent, status, key=key, target=key, attempts=attempts, task=task)
    return action.mark_failed(actor="system:tests", code="x", message="no", retryable=retryable)


@pytest.mark.django_db
def test_every_standalone_failure_opens_an_entry_and_a_tasks_own_does_not(settings):
    """Nothing runs a failed action again by itself: one a person marked failed with attempts left
    (from needs_review) needs its entry as much as one the executor gave up on."""
    settings.MAX_ATTEMPTS = 3
    agent, _ = make_agent("billing", grants=())
    task = Task.objects.create(task_id="refund-t", fingerprint="x", workflow="refund", input={}, agent=agent,
                               max_attempts=3, state="failed")

    permanent = failed_from(agent, "pending", key="k-permanent", retryable=False, attempts=1)
    exhausted = failed_from(agent, "unknown", key="k-exhausted", retryable=True, attempts=3)
    attempts_left = failed_from(agent, "needs_review", key="k-left", retryable=True, attempts=2)
    in_a_task = failed_from(agent, "pending", key="k-task", retryable=False, attempts=1, task=task)

    assert set(DeadLetter.objects.values_list("action__operation_key", flat=True)) == {
        "k-permanent", "k-exhausted", "k-left"}
    assert not in_a_task.dead_letters.exists()
    assert [a.dead_letters.get().alerts.count() for a in (permanent, exhausted, attempts_left)] == [1, 1, 1]


# --- The database's rules ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_database_refuses_an_entry_about_both_a_task_and_an_action_or_neither(jobs_to_test_redis):
    agent, _ = make_agent("billing", grants=())
    task = Task.objects.create(task_id="refund-both", fingerprint="x", workflow="refund", input={}, agent=agent,
                               max_attempts=3, state="dead_lettered", attempts=3)
    action = make_action(agent, "failed", key="k-both", retryable=False)

    for about in ({"task": task, "action": action}, {}):
        with pytest.raises(IntegrityError, match="deadletter_task_or_action"):
            with transaction.atomic():
                entry = DeadLetter.objects.create(snapshot={}, attempts=1, **about)
                Alert.objects.create(kind="dead_letter", dead_letter=entry, subject="s", link="/")
    assert not DeadLetter.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_an_action_is_in_the_queue_once_and_never_without_an_alert(jobs_to_test_redis):
    agent, _ = make_agent("billing", grants=())
    action = make_action(agent, "failed", key="k-once", retryable=False)
    with pytest.raises(IntegrityError, match="has no alert"):
        DeadLetter.objects.create(action=action, snapshot={}, attempts=1)

    DeadLetter.objects.open_for_action(action, actor="system:tests")
    with pytest.raises(IntegrityError, match="deadletter_one_open_per_action"):
        DeadLetter.objects.open_for_action(action, actor="system:tests")
    assert DeadLetter.objects.filter(action=action).count() == 1


def test_a_tasks_alert_carries_its_checkpoint_as_text(stack):
    agent, _ = make_agent("tasks", grants=("refund",))
    entry = dead_letter(agent, "refund-text", done={"lookup_order": {"order_id": "ORD-refund-text"}})
    body = entry.alerts.get().body
    for text in ("Error: crash: the worker gave up (retryable)", "Task: refund-text", "Workflow: refund",
                 "State: dead_lettered", "Attempts: 1 of 3", "lookup_order: done", "call_refund_api: pending"):
        assert text in body, (text, body)


@pytest.mark.parametrize("op", ["redrive", "resolve", "discard"])
def test_every_operation_on_an_entry_without_a_reason_is_refused_changes_nothing_and_the_page_says_so(
        stack, agent, operator, client, op):
    entry = DeadLetter.objects.get(action=declined(stack, agent, "refund:ORD-WHY:full:dec-1", "ORD-WHY"))
    events = len(audit_events(entry))
    work = {"redrive": lambda: deadletter_redrive(entry, actor=operator, reason=" "),
            "resolve": lambda: deadletter_resolve(entry, actor=operator, note=" "),
            "discard": lambda: deadletter_discard(entry, actor=operator, reason=" ")}[op]
    with pytest.raises(ValueError):
        work()
    client.force_login(operator)
    answer = client.post(f"/dlq/{entry.pk}/{op}", {"reason": "  "}, follow=True)
    assert answer.status_code == 200 and "Not done:" in answer.content.decode()
    assert DeadLetter.objects.get(pk=entry.pk).status == E.OPEN
    assert Action.objects.get(pk=entry.action_id).status == "failed"
    assert len(audit_events(entry)) == events


def test_a_person_with_a_150_character_name_resolves_an_entry_under_the_audit_trails_label(db):
    long_named = User.objects.create_user(username="r" * 150, password=None)
    agent, _ = make_agent("billing")
    with transaction.atomic():
        action = make_action(agent, "failed", key="refund:ORD-LONG:full:dec-1", retryable=False)
        entry = DeadLetter.objects.open_for_action(action, actor="system:executor")
        entry.resolve(actor=long_named, note="refunded by hand")
    entry = DeadLetter.objects.get(pk=entry.pk)
    assert entry.status == E.RESOLVED and entry.decided_by == actor_label(long_named)
    assert len(entry.decided_by) == 150
    assert [e.actor for e in audit_events(entry, "resolved")] == [entry.decided_by]


@pytest.mark.django_db
def test_a_booking_given_up_in_the_queue_lets_go_of_its_slot(settings):
    """Out of attempts, a booking's failure may still be retried and keeps its slot for the retry;
    discarded, no retry comes, and a slot nobody will use must not refuse every other booking of it."""
    settings.MAX_ATTEMPTS = 1
    agent, _ = make_agent("booker", grants=())
    slot = {"service": "massage", "start": "2026-09-10T10:00:00Z", "end": "2026-09-10T11:00:00Z"}
    booking, _ = action_request(agent=agent, operation_key="create_booking:ROOM-9:CUST-1:dec-1",
                                action_type="create_booking", target="ROOM-9", customer="CUST-1", decision_id="dec-1",
                                params=slot)
    booking.claim(owner="tests:1")
    booking.mark_failed(actor="system:executor", code="connect_failed", message="never reached the provider",
                        retryable=True, claim=booking.fence)
    entry = DeadLetter.objects.get(action=booking)
    assert Booking.objects.get(action=booking).status == "pending"

    deadletter_discard(entry, actor=User.objects.create_user(username="olga", password=None),
                       reason="the customer booked by phone for another day")
    assert Booking.objects.get(action=booking).status == "released"
    other, created = action_request(agent=agent, operation_key="create_booking:ROOM-9:CUST-2:dec-7",
                                    action_type="create_booking", target="ROOM-9", customer="CUST-2",
                                    decision_id="dec-7", params=slot)
    assert created and other.status == "queued"
    booking.refresh_from_db()
    assert booking.error["retryable"] is False  # failed for good now: it tells the agent no retry comes
    assert audit_events(booking, "given_up").get().reason == "the customer booked by phone for another day"
    # Given up, its decision may be asked again, at another time, as after any failure for good.
    again, created = action_request(agent=agent, operation_key="create_booking:ROOM-9:CUST-1:dec-1:again",
                                    action_type="create_booking", target="ROOM-9", customer="CUST-1",
                                    decision_id="dec-1",
                                    params={**slot, "start": "2026-09-11T10:00:00Z", "end": "2026-09-11T11:00:00Z"})
    assert created and again.status in ("queued", "held")


@pytest.mark.django_db
def test_a_booking_failed_for_good_offers_no_redrive_and_says_why(client):
    """Its slot was let go when it failed: a redrive is refused alone and in bulk, and its page
    offers none (it offered one, which was then refused)."""
    agent, _ = make_agent("booker", grants=())
    booking = make_action(agent, "failed", key="create_booking:ROOM-9:CUST-1:dec-1", action_type="create_booking",
                          target="ROOM-9", retryable=False)
    entry = DeadLetter.objects.open_for_action(booking, actor="system:executor")
    assert entry.redrive_refusal == "its slot was given up when it failed: request a new booking"
    olga = User.objects.create_user(username="olga", password=None)
    call_command("setup_roles", verbosity=0)
    olga.groups.add(Group.objects.get(name="operators"))
    with pytest.raises(InvalidTransition, match="its slot was given up"):
        deadletter_redrive(entry, actor=olga, reason="try again")
    client.force_login(olga)
    page = client.get(f"/dlq/{entry.pk}/").content.decode()
    assert 'id="no-redrive"' in page and 'id="redrive-form"' not in page


@pytest.mark.django_db
def test_a_redrive_held_behind_another_action_says_so(client):
    """Redriven while another action is in flight on its order, the action is held, not queued:
    the page says so rather than only "redrive done"."""
    agent, _ = make_agent("billing", grants=())
    failed = make_action(agent, "failed", key="refund:ORD-H:full:dec-1", target="ORD-H", retryable=True)
    entry = DeadLetter.objects.open_for_action(failed, actor="system:executor")
    make_action(agent, "pending", key="refund:ORD-H:full:dec-2", target="ORD-H", decision_id="dec-2")
    client.force_login(User.objects.create_superuser("root", password=None))
    page = client.post(f"/dlq/{entry.pk}/redrive", {"reason": "the provider is back"}, follow=True).content.decode()
    assert Action.objects.get(pk=failed.pk).status == "held"
    assert "held while another action on its target or customer is in flight" in page


@pytest.mark.django_db
def test_a_bulk_discard_past_its_cap_says_how_many_it_discards(client, monkeypatch):
    """Past BULK_MAX the button said "Discard 3 entries" and discarded the 2 it listed."""
    monkeypatch.setattr("console.dlq_views.BULK_MAX", 2)
    agent, _ = make_agent("billing", grants=("refund",))  # the refund capability, which a superuser may work
    for n in range(3):
        DeadLetter.objects.open_for_action(make_action(agent, "failed", key=f"refund:ORD-C{n}:full:dec-1",
                                                       target=f"ORD-C{n}", retryable=False), actor="system:executor")
    client.force_login(User.objects.create_superuser("root", password=None))
    page = client.post("/dlq/bulk", {"op": "discard", "status": "open"}).content.decode()
    assert re.search(r'id="bulk-confirm">Discard 2 entries</button>', page)


@pytest.mark.django_db
@pytest.mark.parametrize("close", ["discard", "resolve"])
def test_a_failure_closed_in_the_queue_lets_go_of_what_it_held_for_its_retry(close, settings):
    """Out of attempts, a failure that may be retried keeps what it held: its retry goes first. Its
    entry discarded or resolved, no retry comes: what it held is looked at as after a failure for
    good, and released when nothing else holds it (it waited for a person for good)."""
    settings.MAX_ATTEMPTS = 1
    agent, _ = make_agent("billing", grants=())
    body = {"action_type": "refund", "target": "ORD-G", "customer": "CUST-G",
            "params": {"amount": "25.00", "currency": "EUR"}}
    first, _ = action_request(agent=agent, operation_key="refund:ORD-G:full:dec-1", decision_id="dec-1", **body)
    first.claim(owner="tests:1")
    second, _ = action_request(agent=agent, operation_key="refund:ORD-G:full:dec-2", decision_id="dec-2", **body)
    first.mark_failed(actor="system:executor", code="connect_failed", message="never reached the provider",
                      retryable=True, claim=first.fence)
    assert Action.objects.get(pk=second.pk).status == "held"

    olga = User.objects.create_user(username="olga", password=None)
    entry = DeadLetter.objects.get(action=first)
    if close == "discard":
        deadletter_discard(entry, actor=olga, reason="refunded by bank transfer")
    else:
        deadletter_resolve(entry, actor=olga, note="refunded by bank transfer, ticket 81")

    assert Action.objects.get(pk=second.pk).status == "queued"
    assert audit_events(second, "released").get().reason == "refund:ORD-G:full:dec-1 is failed: nothing else holds it"
    assert Action.objects.get(pk=first.pk).status == "failed"
