"""Dead-letter entries: redrive from the checkpoint, resolve by hand, discard with a reason —
each audited, each only once; an entry never exists without its alert; alerts are delivered
by e-mail and by an HMAC-signed webhook, and a failed delivery is recorded and retried."""

import hashlib
import hmac
import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer

import django_rq
import pytest
from django.core import mail
from django.db import IntegrityError, transaction
from django.utils import timezone
from rq.registry import ScheduledJobRegistry

from dlq.alerts import alert_deliver, alerts_redeliver_stale
from dlq.entries import deadletter_discard, deadletter_redrive, deadletter_resolve
from dlq.models import Alert, AlertDelivery, DeadLetter, EntryStatus
from ledger.models import InvalidTransition, StepStatus, Task
from tests.conftest import free_port
from tests.factories import (another_transaction, api_client, audit_events, dead_letter, make_agent, open_entry, sandbox,
                             sandbox_without_idempotency, settled)

E = EntryStatus


@pytest.fixture
def agent(stack):
    agent, token = make_agent("billing", grants=("refund", "send_message"))
    agent.token = token
    return agent


def test_a_dead_lettered_task_has_an_open_entry_with_its_checkpoint_and_an_alert(stack, agent):
    entry = dead_letter(agent, "refund-dl")
    assert entry.status == E.OPEN and entry.attempts == 1
    assert entry.task.state == "dead_lettered"
    assert entry.snapshot["task_id"] == "refund-dl" and entry.snapshot["state"] == "dead_lettered"
    assert entry.last_error["code"] == "crash"
    assert entry.alerts.count() == 1
    [opened] = audit_events(entry, "dead_letter_opened")
    assert opened.actor == "system:tests" and opened.reason == "the worker gave up"


def test_redriving_resumes_from_the_checkpoint_and_does_not_redo_done_steps(stack, agent, operator):
    client = api_client(stack.url, agent.token)
    sandbox_without_idempotency(client)
    # Neither order exists at the provider any more: a lookup_order run now would fail the
    # task at once (unknown order). Only the first checkpoint already holds the lookup.
    looked_up = {"order_id": "ORD-GONE", "customer": "CUST-1", "amount": "100.00"}
    entry = dead_letter(agent, "refund-redrive", order="ORD-GONE", customer="CUST-1", done={"lookup_order": looked_up})
    control = dead_letter(agent, "refund-control", order="ORD-GONE-2", customer="CUST-2")
    assert sandbox(client, "GET", "orders/ORD-GONE").status_code == 404

    redriven = deadletter_redrive(entry, actor=operator, reason="provider fixed")
    deadletter_redrive(control, actor=operator, reason="provider fixed")
    assert redriven.status == E.REDRIVEN and redriven.decided_by == "user:olga" and redriven.note == "provider fixed"
    task = Task.objects.get(task_id="refund-redrive")
    assert task.state == "queued" and task.attempts == 0
    stack.start_worker()

    task = settled(task)
    assert task.state == "succeeded", task.last_error
    assert task.attempts == 1
    steps = {s.name: s for s in task.steps.all()}
    assert all(s.status == StepStatus.DONE for s in steps.values())
    assert steps["lookup_order"].result == looked_up
    assert [e.after["step"] for e in audit_events(task, "step_done")] == [
        "call_refund_api", "write_confirmation", "notify_customer"]
    refunds = sandbox(client, "GET", "refunds", params={"order_id": "ORD-GONE"}).json()["data"]
    assert [r["operation_key"] for r in refunds] == ["refund-redrive:call_refund_api:v1"]

    # The control, without the lookup in its checkpoint, did look the order up, and failed.
    control_task = settled(Task.objects.get(task_id="refund-control"))
    assert control_task.state == "failed" and control_task.last_error["code"] == "unknown_order"

    [event] = audit_events(entry, "redriven")
    assert event.actor == "user:olga" and event.reason == "provider fixed"
    assert event.before == {"status": "open"} and event.after == {"status": "redriven"}
    [task_event] = audit_events(task, "redriven")
    assert task_event.actor == "user:olga" and task_event.reason == "provider fixed"
    assert task_event.before["state"] == "dead_lettered" and task_event.after == {
        "state": "queued", "attempts": 0, "next_attempt_at": task_event.after["next_attempt_at"]}


def test_resolving_by_hand_is_audited_and_refuses_a_second_decision(stack, agent, operator):
    entry = dead_letter(agent, "refund-resolve")
    with pytest.raises(ValueError):
        deadletter_resolve(entry, actor=operator, note="   ")
    assert DeadLetter.objects.get(pk=entry.pk).status == E.OPEN

    resolved = deadletter_resolve(entry, actor=operator, note="refunded by hand in the provider's console")
    assert resolved.status == E.RESOLVED and resolved.decided_by == "user:olga"
    assert resolved.decided_at is not None
    [event] = audit_events(entry, "resolved")
    assert event.actor == "user:olga" and event.reason == "refunded by hand in the provider's console"
    assert Task.objects.get(pk=entry.task_id).state == "dead_lettered"  # the task stays as it was

    for second in (
        lambda: deadletter_resolve(entry, actor=operator, note="again"),
        lambda: deadletter_redrive(entry, actor=operator, reason="again"),
        lambda: deadletter_discard(entry, actor=operator, reason="again"),
    ):
        with pytest.raises(InvalidTransition, match="already resolved by user:olga"):
            second()
    assert DeadLetter.objects.get(pk=entry.pk).status == E.RESOLVED
    assert Task.objects.get(pk=entry.task_id).state == "dead_lettered"
    assert len(audit_events(entry, "resolved")) == 1
    assert not audit_events(entry, "redriven") and not audit_events(entry, "discarded")


def test_discarding_needs_a_reason_cancels_the_task_and_is_audited_once(stack, agent, operator):
    entry = dead_letter(agent, "refund-discard")
    for blank in ("", "  \n"):
        with pytest.raises(ValueError, match="reason"):
            deadletter_discard(entry, actor=operator, reason=blank)
    assert DeadLetter.objects.get(pk=entry.pk).status == E.OPEN
    assert Task.objects.get(pk=entry.task_id).state == "dead_lettered"

    discarded = deadletter_discard(entry, actor=operator, reason="customer cancelled the order")
    assert discarded.status == E.DISCARDED and discarded.note == "customer cancelled the order"
    task = Task.objects.get(pk=entry.task_id)
    assert task.state == "cancelled"
    [event] = audit_events(entry, "discarded")
    assert event.actor == "user:olga" and event.reason == "customer cancelled the order"
    [cancelled] = audit_events(task, "cancelled")
    assert cancelled.actor == "user:olga" and cancelled.reason == "customer cancelled the order"

    with pytest.raises(InvalidTransition):
        deadletter_discard(entry, actor=operator, reason="again")
    with pytest.raises(InvalidTransition):
        deadletter_redrive(entry, actor=operator, reason="changed my mind")
    assert Task.objects.get(pk=entry.task_id).state == "cancelled"
    assert len(audit_events(entry, "discarded")) == 1


def test_a_redriven_task_that_fails_again_gets_a_new_entry_of_its_own(stack, agent, operator):
    first = dead_letter(agent, "refund-twice")
    deadletter_redrive(first, actor=operator, reason="try again")
    task = Task.objects.get(task_id="refund-twice")
    task.claim(owner="tests:2")
    second = open_entry(task.mark_dead_lettered(actor="system:tests",
                                                error={"code": "crash", "message": "again", "retryable": True}))
    assert second.pk != first.pk and second.status == E.OPEN
    assert list(DeadLetter.objects.filter(task=task).order_by("id").values_list("status", flat=True)) == [
        E.REDRIVEN, E.OPEN]
    assert second.alerts.count() == 1


# --- The database's own rule: no entry without an alert ----------------------------------------


def plain_task(task_id):
    agent, _ = make_agent(f"agent-{task_id}")
    return Task.objects.create(task_id=task_id, fingerprint="x", workflow="refund", input={}, agent=agent,
                               max_attempts=3, state="dead_lettered", attempts=3)


@pytest.mark.django_db(transaction=True)
def test_an_entry_without_an_alert_cannot_be_committed(jobs_to_test_redis):
    task = plain_task("refund-no-alert")
    with pytest.raises(IntegrityError, match="has no alert"):
        with transaction.atomic():
            DeadLetter.objects.create(task=task, snapshot={}, last_error={}, attempts=3)
    assert not DeadLetter.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_an_entry_saved_on_its_own_in_autocommit_is_refused_too(jobs_to_test_redis):
    task = plain_task("refund-autocommit")
    with pytest.raises(IntegrityError, match="has no alert"):
        DeadLetter.objects.create(task=task, snapshot={}, last_error={}, attempts=3)
    assert not DeadLetter.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_an_entry_with_its_alert_in_the_same_transaction_commits(jobs_to_test_redis):
    task = plain_task("refund-with-alert")
    with transaction.atomic():
        entry = DeadLetter.objects.create(task=task, snapshot={}, last_error={}, attempts=3)
        Alert.objects.create(kind=Alert.Kind.DEAD_LETTER, dead_letter=entry, subject="s", link=entry.get_absolute_url())
    assert DeadLetter.objects.get().alerts.count() == 1


# --- Alert delivery ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_stale_alert_is_queued_again_once_however_many_passes_find_it(jobs_to_test_redis):
    """The workers down, every sweeper pass found the same undelivered alert and queued a job for
    it: one a second, for as long as the outage lasted, in the one queue drains wait in."""
    task = plain_task("refund-stale-alert")
    with transaction.atomic():
        entry = DeadLetter.objects.create(task=task, snapshot={}, last_error={}, attempts=3)
        alert = Alert.objects.create(kind=Alert.Kind.DEAD_LETTER, dead_letter=entry, subject="s",
                                     link=entry.get_absolute_url(), created_at=timezone.now() - timedelta(minutes=10))
    queue = django_rq.get_queue("default")

    def queued():
        return [job for job in queue.get_jobs() if job.func_name == "dlq.alerts.alert_deliver" and job.args == (alert.pk,)]

    before = len(queued())
    assert [alerts_redeliver_stale() for _ in range(5)] == [1, 0, 0, 0, 0]
    assert len(queued()) - before == 1


@pytest.mark.django_db(transaction=True)
def test_an_alert_being_delivered_is_left_to_the_job_delivering_it(jobs_to_test_redis):
    task = plain_task("refund-locked-alert")
    with transaction.atomic():
        entry = DeadLetter.objects.create(task=task, snapshot={}, last_error={}, attempts=3)
        alert = Alert.objects.create(kind=Alert.Kind.DEAD_LETTER, dead_letter=entry, subject="s",
                                     link=entry.get_absolute_url())

    def first_job():  # holds the alert as a job in the middle of sending it would
        Alert.objects.select_for_update().get(pk=alert.pk)

    with another_transaction(first_job):
        alert_deliver(alert.pk)  # the second job, e.g. the sweeper's redelivery
        assert not AlertDelivery.objects.exists() and mail.outbox == []
    alert_deliver(alert.pk)
    assert list(AlertDelivery.objects.values_list("channel", "attempt", "ok")) == [("email", 1, True)]
    assert len(mail.outbox) == 1


class Receiver:
    """A tiny webhook receiver on 127.0.0.1 that records each POST."""

    def __init__(self, port=0, status=200):
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append({"path": self.path, "headers": dict(self.headers), "body": body})
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/surety"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    receiver = Receiver()
    yield receiver
    receiver.close()


def verify_signature(delivery, secret):
    header = delivery["headers"]["Surety-Signature"]
    parts = dict(part.split("=", 1) for part in header.split(","))
    expected = hmac.new(secret.encode(), f"{parts['t']}.".encode() + delivery["body"], hashlib.sha256).hexdigest()
    return hmac.compare_digest(parts["v1"], expected) and abs(int(parts["t"]) - timezone.now().timestamp()) < 60


def test_an_alert_is_mailed_and_posted_with_an_hmac_signature(stack, agent, receiver, settings):
    settings.ALERT_WEBHOOK_URL = receiver.url
    settings.ALERT_WEBHOOK_SECRET = "s3cret-for-tests"
    settings.ALERT_EMAILS = ["ops@surety.example"]
    entry = dead_letter(agent, "refund-alert")
    alert = entry.alerts.get()

    alert_deliver(alert.pk)

    [post] = receiver.received
    assert post["path"] == "/hooks/surety"
    assert post["headers"]["Content-Type"] == "application/json"
    assert verify_signature(post, "s3cret-for-tests")
    assert not verify_signature(post, "another-secret")
    payload = json.loads(post["body"])
    assert payload["id"] == alert.pk and payload["kind"] == "dead_letter"
    assert "refund-alert" in payload["subject"]
    assert payload["link"] == settings.SITE_URL.rstrip("/") + f"/dlq/{entry.pk}/"
    [message] = mail.outbox
    assert message.to == ["ops@surety.example"] and "refund-alert" in message.subject
    deliveries = {d.channel: d for d in alert.deliveries.all()}
    assert set(deliveries) == {"email", "webhook"}
    assert all(d.ok and d.attempt == 1 for d in deliveries.values())
    alert.refresh_from_db()
    assert alert.delivered_at is not None

    alert_deliver(alert.pk)  # delivered: nothing is sent twice
    assert len(receiver.received) == 1 and len(mail.outbox) == 1
    assert alert.deliveries.count() == 2


def test_a_failed_webhook_delivery_is_recorded_and_retried_without_repeating_the_email(stack, agent, settings):
    port = free_port()  # nobody listens here yet
    settings.ALERT_WEBHOOK_URL = f"http://127.0.0.1:{port}/hooks/surety"
    entry = dead_letter(agent, "refund-alert-down")
    alert = entry.alerts.get()
    queue = django_rq.get_queue("default")
    registry = ScheduledJobRegistry(queue=queue)

    def scheduled_retries():
        jobs = [queue.fetch_job(job_id) for job_id in registry.get_job_ids()]
        return [job for job in jobs if job and job.func_name == "dlq.alerts.alert_deliver" and job.args == (alert.pk,)]

    assert scheduled_retries() == []
    before = timezone.now()
    alert_deliver(alert.pk)

    webhook = alert.deliveries.get(channel="webhook")
    assert webhook.ok is False and webhook.attempt == 1
    assert "NotSent" in webhook.detail
    assert alert.deliveries.get(channel="email").ok is True
    alert.refresh_from_db()
    assert alert.delivered_at is None
    [retry] = scheduled_retries()
    due = registry.get_scheduled_time(retry)
    assert before + timedelta(seconds=1) <= due <= timezone.now() + timedelta(seconds=3)

    receiver = Receiver(port=port)
    try:
        alert_deliver(alert.pk)  # what the scheduled job does when it comes due
    finally:
        receiver.close()
    assert len(receiver.received) == 1 and verify_signature(receiver.received[0], settings.ALERT_WEBHOOK_SECRET)
    assert list(alert.deliveries.filter(channel="webhook").order_by("attempt").values_list("attempt", "ok")) == [
        (1, False), (2, True)]
    assert alert.deliveries.filter(channel="email").count() == 1
    assert len(mail.outbox) == 1
    alert.refresh_from_db()
    assert alert.delivered_at is not None
