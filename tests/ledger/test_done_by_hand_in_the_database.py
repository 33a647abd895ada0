"""Done by hand is final, held by the database (migration 0051; `make test` runs this module on
PostgreSQL and SQLite): a failed action a person did by hand (ledger.actions.action_done_by_hand,
its dead letter resolved) keeps its status and its `done_by_hand` mark whatever writes it. A raw
UPDATE or a queryset's `.update()` that sent it back to the queue, or took the mark off so that a
retry is let through, would make the refund or the booking the person already made a second time.
The rest of the row may still be written, and the archive deletes it after its key's lifetime.
The refusals Python makes first (Action._refuse, action_retry_by_person) are tested in
tests/dlq/test_done_by_hand.py."""

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from ledger.actions import action_done_by_hand
from ledger.models import Action, ActionStatus
from tests.factories import make_action, make_agent, person, required_in

S = ActionStatus
pytestmark = pytest.mark.django_db


@pytest.fixture
def done():
    """A refund that failed (it may be retried) and that a person then paid by bank transfer."""
    agent, _ = make_agent("billing")
    action = action_done_by_hand(make_action(agent, S.FAILED), actor=person("olga"), reason="refunded by bank transfer")
    assert action.is_done_by_hand and action.error["retryable"] is False
    return action


def refused(write):
    with pytest.raises(IntegrityError, match="done by hand"), transaction.atomic():
        write()


def still_done_by_hand(action):
    row = Action.objects.get(pk=action.pk)
    assert (row.status, row.error) == (S.FAILED, action.error)
    return row


def rows(action):
    return Action.objects.filter(pk=action.pk)


@pytest.mark.parametrize("status", sorted(set(S.values) - {S.FAILED}))
def test_a_queryset_update_to_any_other_status_is_refused(done, status):
    refused(lambda: rows(done).update(status=status, **required_in(status)))

    still_done_by_hand(done)


def test_a_raw_update_that_queues_it_again_is_refused(done):
    with connection.cursor() as cursor:
        refused(lambda: cursor.execute("UPDATE ledger_action SET status = %s, next_attempt_at = %s WHERE id = %s",
                                       [S.QUEUED, timezone.now(), done.pk]))

    still_done_by_hand(done)


@pytest.mark.parametrize("error", [
    lambda error: {**error, "done_by_hand": False},
    lambda error: {key: value for key, value in error.items() if key != "done_by_hand"},
    lambda error: {**error, "done_by_hand": "true"},  # not the mark, which is JSON's true
    lambda error: {**error, "retryable": True, "done_by_hand": None},
    lambda error: None,
], ids=["falsified", "removed", "a_string", "made_retryable", "error_cleared"])
def test_an_update_that_takes_the_mark_off_is_refused(done, error):
    refused(lambda: rows(done).update(error=error(done.error)))

    still_done_by_hand(done)


def test_a_raw_update_that_takes_the_mark_off_is_refused(done):
    with connection.cursor() as cursor:
        refused(lambda: cursor.execute("UPDATE ledger_action SET error = %s WHERE id = %s",
                                       ['{"code": "declined", "message": "no", "retryable": true}', done.pk]))

    still_done_by_hand(done)


def test_the_rest_of_the_row_may_still_be_written(done):
    rows(done).update(updated_at=timezone.now(), next_attempt_at=None)
    rows(done).update(error={**done.error, "note": "paid by bank transfer"})  # the mark kept
    row = Action.objects.get(pk=done.pk)
    row.save()  # every column written again, as it was

    assert row.is_done_by_hand and Action.objects.get(pk=done.pk).error["note"] == "paid by bank transfer"


def test_the_archive_still_deletes_it(done):
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM ledger_action WHERE id = %s", [done.pk])

    assert not rows(done).exists()


def test_a_failure_nobody_did_by_hand_is_still_retried_and_marked_done_by_hand():
    agent, _ = make_agent("billing")
    retried = make_action(agent, S.FAILED, key="refund:ORD-2:full:dec-2", target="ORD-2")
    marked = make_action(agent, S.FAILED, key="refund:ORD-3:full:dec-3", target="ORD-3")

    rows(retried).update(status=S.QUEUED, **required_in(S.QUEUED))
    rows(marked).update(error={**marked.error, "retryable": False, "done_by_hand": True})

    assert Action.objects.get(pk=retried.pk).status == S.QUEUED
    assert Action.objects.get(pk=marked.pk).is_done_by_hand
