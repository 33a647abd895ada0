"""POST /webhooks/sandbox/ delivered twice at the same moment, and met by a database that blinks:
providers send an event again while its first delivery is still being answered, and retry any
answer that is not a 2xx. One delivery settles, the other is a duplicate (no second audit event,
no 500); a delivery the database lost answers 503 with nothing stored, so the provider's retry
settles. Real PostgreSQL, one connection per request."""

import json
import threading

import pytest
from django.db import connection, transaction
from django.test import Client

from dlq.incidents import Incident, IncidentKind
from ledger import hooks, webhooks
from ledger.models import Action, ActionStatus, WebhookClaim, WebhookEvent
from tests.conftest import wait_until
from tests.factories import audit_events, in_threads, make_action, make_agent, sessions_waiting_for_a_lock
from tests.ledger.test_webhooks import KEY, deliver, event, webhook_secret  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]
S = ActionStatus


@pytest.fixture
def unknown_action(transactional_db):
    return make_action(make_agent("billing", grants=())[0], S.UNKNOWN, key=KEY, target="ORD-W1", attempts=1, fence=2)


def test_the_same_event_twice_at_once_settles_once_and_the_other_is_a_duplicate(unknown_action, monkeypatch):
    """The first delivery is held inside its transaction, its claim written and not committed, until
    the second waits on that claim: the second is then told `duplicate`, never a 500 or a second
    settle."""
    settle, second_waits = webhooks._settle, threading.Event()

    def settle_once_the_other_waits(*args, **kwargs):
        wait_until(lambda: sessions_waiting_for_a_lock("ledger_webhookclaim"), seconds=10,
                   message="the second delivery to wait for the first one's claim")
        second_waits.set()
        return settle(*args, **kwargs)

    monkeypatch.setattr(webhooks, "_settle", settle_once_the_other_waits)
    first, second = in_threads(lambda: deliver(Client(), event()), lambda: deliver(Client(), event()))

    assert second_waits.is_set()
    answers = sorted([first.json(), second.json()], key=lambda answer: "duplicate" in answer)
    assert [first.status_code, second.status_code] == [200, 200], (first.content, second.content)
    assert answers == [{"received": True, "outcome": f"settled {KEY} as succeeded"}, {"duplicate": True}]
    assert WebhookEvent.objects.count() == WebhookClaim.objects.count() == 1
    action = Action.objects.get(pk=unknown_action.pk)
    assert (action.status, action.external_ref) == (S.SUCCEEDED, "re_w1")
    assert audit_events(action, "succeeded").count() == 1


def held_once_succeeded(monkeypatch):
    """An event set once a move of an action to succeeded has written (its reactions run), whose
    transaction is then held open until another connection waits for an action's lock."""
    succeeded = threading.Event()

    def hold(action, previous, actor, reason):
        if action.status == S.SUCCEEDED:
            succeeded.set()
            wait_until(lambda: sessions_waiting_for_a_lock("ledger_action"), seconds=10,
                       message="the failure's delivery to wait for the action's lock")

    monkeypatch.setitem(hooks._reactions, Action, [*hooks._reactions[Action], hold])
    return succeeded


def test_a_failure_of_the_effect_stored_while_its_success_settles_is_told_once(unknown_action, monkeypatch):
    """Stripe's `refund.failed` and the stale success of that refund, at once: the success has looked
    for a failure stored before it and found none, and holds the action's lock while the failure's
    event is written, not committed, and its delivery waits for that lock; let through once the
    success commits, the failure finds the action succeeded with that refund and tells a person
    itself. One incident, in this order as in any other."""
    success_locked = held_once_succeeded(monkeypatch)

    def failure_once_the_success_holds_the_action():
        assert success_locked.wait(10)
        return deliver(Client(), event(event_id="evt_failed", event_type="refund.failed"))

    success, failure = in_threads(lambda: deliver(Client(), event()), failure_once_the_success_holds_the_action)

    assert success.json()["outcome"] == f"settled {KEY} as succeeded"
    assert failure.json()["outcome"] == f"refund.failed of re_w1, which {KEY} succeeded with: a person is told"
    [incident] = Incident.objects.all()
    assert (incident.kind, incident.external_refs) == (IncidentKind.FAILED_EFFECT, ["re_w1"])
    assert Action.objects.get(pk=unknown_action.pk).status == S.SUCCEEDED


def test_a_delivery_whose_connection_the_database_ended_is_a_503_and_the_retry_settles(unknown_action):
    """The delivery waits for the action's lock, held by another transaction; the database then ends
    its connection (a failover). Nothing of it is kept (its claim neither), it answers 503 with
    Retry-After, which a provider sends again, and that delivery settles: no `duplicate` for an
    event never stored."""
    locked, ended = threading.Event(), []

    def hold_the_action_and_end_the_waiter():
        with transaction.atomic(), connection.cursor() as cursor:
            Action.objects.select_for_update().get(pk=unknown_action.pk)
            locked.set()
            wait_until(lambda: sessions_waiting_for_a_lock("ledger_action"), seconds=10,
                       message="the delivery to wait for the action's lock")
            cursor.execute("SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity WHERE datname = "
                           "current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()")
            ended.append(cursor.fetchone()[0])

    def delivered_once_locked():
        assert locked.wait(10)
        return deliver(Client(raise_request_exception=False), event())

    _, answer = in_threads(hold_the_action_and_end_the_waiter, delivered_once_locked)

    assert ended == [1]
    assert (answer.status_code, answer["Content-Type"]) == (503, "application/problem+json"), answer.content
    assert answer.json()["code"] == "database_unavailable" and answer["Retry-After"]
    assert not WebhookClaim.objects.exists() and not WebhookEvent.objects.exists()
    assert Action.objects.get(pk=unknown_action.pk).status == S.UNKNOWN

    again = deliver(Client(), event())
    assert again.json() == {"received": True, "outcome": f"settled {KEY} as succeeded"}
    assert Action.objects.get(pk=unknown_action.pk).status == S.SUCCEEDED


def test_a_body_that_is_signed_but_not_an_object_stores_nothing_whatever_its_shape(unknown_action):
    """JSON that is no object, nesting past what the parser takes, NULs, text that is not UTF-8: a
    problem (400, `invalid`), nothing claimed, never a 500."""
    for body in (b"[]", b'"evt"', b"null", b"[" * 100_000 + b"]" * 100_000,
                 b'{"id": "evt_1", "type": "refund.succeeded", "data": {"id": "re_\x00"}}',
                 b'{"id": "evt_1", "type": "refund.succeeded", "data": {"id": "re_\\u0000"}}',
                 json.dumps(event()).encode().replace(b"re_w1", b"re_\xff")):
        answer = deliver(Client(raise_request_exception=False), body)
        assert (answer.status_code, answer["Content-Type"]) == (400, "application/problem+json"), body[:60]
        assert answer.json()["code"] == "invalid"
    assert not WebhookClaim.objects.exists() and not WebhookEvent.objects.exists()
    assert Action.objects.get(pk=unknown_action.pk).status == S.UNKNOWN
