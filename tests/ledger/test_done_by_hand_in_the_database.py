"""Done by hand, and given up, are final, held by the database (migrations 0051, 0052 and 0054; `make
test` runs this module on PostgreSQL and SQLite): a failed action a person did by hand
(ledger.actions.action_done_by_hand, its dead letter resolved), or gave up (action_give_up, its dead
letter discarded), keeps its status, its mark (`done_by_hand`, `given_up`) and `retryable` false
whatever writes it. A raw UPDATE or a queryset's `.update()` that sent it back to the queue, or took
the mark off so that a retry is let through, would make the refund or the booking the person already
made a second time, or one its agent, told nobody retries it, has asked for again under a new
decision; one that made it retryable would tell its agent (the client, the MCP server) that it may
retry. Neither mark becomes the other: the row says the one decision a person made of it. A task a
person finished by hand (its dead letter resolved) keeps its state and its last error's marks the
same way: queued again, its runner would go on from its checkpoint and record the actions of the
steps the work never reached, making what the person made by hand again. The rest of either row may
still be written, and the archive deletes it. The refusals Python makes first (Action._refuse,
action_retry_by_person, a resolved entry's redrive) are tested in tests/dlq/test_done_by_hand.py and
tests/dlq/test_discard_marks_given_up.py."""

from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from dlq.archive import archive_expired
from dlq.entries import deadletter_resolve
from ledger.actions import action_done_by_hand, action_give_up
from ledger.models import Action, ActionStatus, Task, TaskState
from tests.factories import dead_letter, failed_task_entry, make_action, make_agent, person, required_in

S = ActionStatus
T = TaskState
pytestmark = pytest.mark.django_db

# Updates of an error (an action's, a task's last one) that take its `mark` off or let a retry in.
TAKES_THE_MARK_OFF = pytest.mark.parametrize("error", [
    lambda error, mark: {**error, mark: False},
    lambda error, mark: {key: value for key, value in error.items() if key != mark},
    lambda error, mark: {**error, mark: "true"},  # not the mark, which is JSON's true
    lambda error, mark: {**error, "retryable": True, mark: None},
    lambda error, mark: {**error, "retryable": True},  # the mark kept: its agent would read that it may retry
    lambda error, mark: {key: value for key, value in error.items() if key != "retryable"},
    lambda error, mark: {**error, "retryable": "false"},  # not JSON's false
    lambda error, mark: None,
], ids=["falsified", "removed", "a_string", "made_retryable", "retryable_the_mark_kept", "retryable_removed",
        "retryable_a_string", "error_cleared"])

# What a person made of a failed action, as its error says it, by the function that writes it.
MARKED_BY = {"done_by_hand": action_done_by_hand, "given_up": action_give_up}
OTHER = {"done_by_hand": "given_up", "given_up": "done_by_hand"}


@pytest.fixture(params=list(MARKED_BY))
def mark(request):
    return request.param


@pytest.fixture
def marked(mark):
    """A refund that failed (it may be retried) and that a person then paid by bank transfer (done
    by hand) or gave up (the customer withdrew the claim)."""
    agent, _ = make_agent("billing")
    action = MARKED_BY[mark](make_action(agent, S.FAILED), actor=person("olga"), reason="settled outside Surety")
    assert (action.error[mark], action.error["retryable"]) == (True, False) and OTHER[mark] not in action.error
    return action


def refused(write):
    with pytest.raises(IntegrityError, match="done by hand"), transaction.atomic():
        write()


def still_marked(action):
    row = Action.objects.get(pk=action.pk)
    assert (row.status, row.error) == (S.FAILED, action.error)
    return row


def rows(action):
    return Action.objects.filter(pk=action.pk)


@pytest.mark.parametrize("status", sorted(set(S.values) - {S.FAILED}))
def test_a_queryset_update_to_any_other_status_is_refused(marked, status):
    refused(lambda: rows(marked).update(status=status, **required_in(status)))

    still_marked(marked)


def test_a_raw_update_that_queues_it_again_is_refused(marked):
    with connection.cursor() as cursor:
        refused(lambda: cursor.execute("UPDATE ledger_action SET status = %s, next_attempt_at = %s WHERE id = %s",
                                       [S.QUEUED, timezone.now(), marked.pk]))

    still_marked(marked)


@TAKES_THE_MARK_OFF
def test_an_update_that_takes_the_mark_off_or_lets_a_retry_in_is_refused(marked, mark, error):
    refused(lambda: rows(marked).update(error=error(marked.error, mark)))

    still_marked(marked)


def test_a_raw_update_that_takes_the_mark_off_is_refused(marked):
    with connection.cursor() as cursor:
        refused(lambda: cursor.execute("UPDATE ledger_action SET error = %s WHERE id = %s",
                                       ['{"code": "declined", "message": "no", "retryable": true}', marked.pk]))

    still_marked(marked)


@pytest.mark.parametrize("both", [True, False], ids=["the_mark_kept", "in_its_place"])
def test_neither_mark_becomes_the_other(marked, mark, both):
    """Given up, nothing was done and its agent was told so; done by hand, the effect was made: a
    row says the one a person decided, and no code writes the other after it."""
    error = {**marked.error, OTHER[mark]: True} if both else {
        **{key: value for key, value in marked.error.items() if key != mark}, OTHER[mark]: True}

    refused(lambda: rows(marked).update(error=error))

    still_marked(marked)


def test_the_rest_of_the_row_may_still_be_written(marked, mark):
    rows(marked).update(updated_at=timezone.now(), next_attempt_at=None)
    rows(marked).update(error={**marked.error, "note": "settled by bank transfer"})  # the mark kept
    row = Action.objects.get(pk=marked.pk)
    row.save()  # every column written again, as it was

    assert row.error[mark] is True and Action.objects.get(pk=marked.pk).error["note"] == "settled by bank transfer"


def test_the_archive_still_deletes_it(marked):
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM ledger_action WHERE id = %s", [marked.pk])

    assert not rows(marked).exists()


def test_a_failure_nobody_marked_is_still_retried_and_marked(mark):
    agent, _ = make_agent("billing")
    retried = make_action(agent, S.FAILED, key="refund:ORD-2:full:dec-2", target="ORD-2")
    marked = make_action(agent, S.FAILED, key="refund:ORD-3:full:dec-3", target="ORD-3")

    rows(retried).update(status=S.QUEUED, **required_in(S.QUEUED))
    rows(marked).update(error={**marked.error, "retryable": False, mark: True})

    assert Action.objects.get(pk=retried.pk).status == S.QUEUED
    assert Action.objects.get(pk=marked.pk).error[mark] is True


STOPPED = [T.DEAD_LETTERED, T.FAILED]  # where a task's work may stop for a person to finish it


def task_done_by_hand(state):
    """A refund task stopped where its work stopped (out of attempts, or its refund refused for
    good: `state`), which a person then finished by hand: its dead letter resolved."""
    agent, _ = make_agent("billing")
    entry = (dead_letter if state == T.DEAD_LETTERED else failed_task_entry)(agent, "task-by-hand")
    deadletter_resolve(entry, actor=person("olga"), note="refunded by bank transfer and told the customer")
    task = Task.objects.get(pk=entry.task_id)
    assert task.state == state
    assert (task.last_error["retryable"], task.last_error["done_by_hand"]) == (False, True)
    return task


@pytest.fixture(params=STOPPED)
def task_done(request, jobs_to_test_redis):
    return task_done_by_hand(request.param)


def tasks(task):
    return Task.objects.filter(pk=task.pk)


def task_still_done_by_hand(task):
    row = Task.objects.get(pk=task.pk)
    assert (row.state, row.last_error) == (task.state, task.last_error)


def task_required_in(state):
    """What the database's check constraints ask of a task row in `state`."""
    return {T.QUEUED: {"next_attempt_at": timezone.now()},
            T.RUNNING: {"lease_expires_at": timezone.now() + timedelta(seconds=30)}}.get(state, {})


@pytest.mark.parametrize("stopped, state", [(stopped, state) for stopped in STOPPED for state in T.values
                                            if state != stopped])
def test_a_task_done_by_hand_is_moved_to_no_other_state(jobs_to_test_redis, stopped, state):
    task = task_done_by_hand(stopped)

    refused(lambda: tasks(task).update(state=state, **task_required_in(state)))

    task_still_done_by_hand(task)


def test_a_raw_update_that_queues_a_task_done_by_hand_again_is_refused(task_done):
    with connection.cursor() as cursor:
        refused(lambda: cursor.execute("UPDATE ledger_task SET state = %s, next_attempt_at = %s, attempts = 0 "
                                       "WHERE id = %s", [T.QUEUED, timezone.now(), task_done.pk]))

    task_still_done_by_hand(task_done)


@TAKES_THE_MARK_OFF
def test_an_update_that_takes_a_tasks_mark_off_or_lets_a_retry_in_is_refused(task_done, error):
    refused(lambda: tasks(task_done).update(last_error=error(task_done.last_error, "done_by_hand")))

    task_still_done_by_hand(task_done)


def test_the_rest_of_a_task_done_by_hand_may_still_be_written(task_done):
    tasks(task_done).update(updated_at=timezone.now(), attempts=0)
    tasks(task_done).update(last_error={**task_done.last_error, "note": "ticket 9"})  # the marks kept
    row = Task.objects.get(pk=task_done.pk)
    row.save()  # every column written again, as it was

    assert (row.state, Task.objects.get(pk=task_done.pk).last_error["note"]) == (task_done.state, "ticket 9")


@pytest.mark.parametrize("stopped", STOPPED)
def test_the_archive_takes_a_task_done_by_hand_wherever_its_work_stopped(tmp_path, jobs_to_test_redis, stopped):
    task = task_done_by_hand(stopped)  # final either way (dlq.archive.FINISHED)
    if connection.vendor == "postgresql":  # the deferred checks of its setup, as at its commit
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")

    archive, counts = archive_expired(tmp_path, now=timezone.now() + timedelta(days=401))  # past every retention

    assert archive is not None and counts["ledger.task"] == 1 and not tasks(task).exists()


def test_a_task_nobody_did_by_hand_is_still_redriven_and_marked_done_by_hand(jobs_to_test_redis):
    agent, _ = make_agent("billing")
    redriven, marked = (Task.objects.get(pk=dead_letter(agent, task_id).task_id) for task_id in ("task-2", "task-3"))

    tasks(redriven).update(state=T.QUEUED, next_attempt_at=timezone.now(), attempts=0)
    tasks(marked).update(last_error={**marked.last_error, "retryable": False, "done_by_hand": True})

    assert Task.objects.get(pk=redriven.pk).state == T.QUEUED
    assert Task.objects.get(pk=marked.pk).last_error["done_by_hand"] is True
