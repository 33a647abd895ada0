"""`archive_expired` takes finished tasks with their steps, confirmations, actions and dead
letters, and an edit-down's version with the original it superseded, once nothing of theirs must
stay; a task id or key it archived answers 410 and is never recorded again."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from dlq.archive import archive_expired
from dlq.models import BulkRedrive, BulkRedriveItem, DeadLetter
from dlq.redrive_runs import Plan
from ledger.models import Action, ArchivedKey, ArchivedTask, Confirmation, Task, TaskStep
from ledger.retention import KeyExpired
from ledger.tasks import task_request
from ledger.versions import action_version_create
from tests.factories import (failed_task_entry, make_action, make_agent, post_action_in_process, refund_body,
                             refund_task_body)

pytestmark = pytest.mark.django_db

LATER = timedelta(days=401)  # past the default 400-day lifetime and retentions


@pytest.fixture
def billing():
    return make_agent("billing")


@pytest.fixture
def agent(billing):
    return billing[0]


def run_archive(tmp_path):
    return archive_expired(tmp_path, now=timezone.now() + LATER)


def immediate():
    """As at each commit in production: the deferred checks run now, not at the end of the
    test's one transaction, after the archive (once every row of a test's setup is written)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")


def finished_task(agent, task_id, *, action_status="succeeded", **action_fields):
    """A task that failed for good, its dead letter resolved, with one action of its own."""
    entry = failed_task_entry(agent, task_id)
    entry.resolve(actor="user:ops", note="refunded by hand")
    task = entry.task
    make_action(agent, action_status, key=f"{task_id}:call_refund_api:v1", target=f"ORD-{task_id}", task=task,
                **action_fields)
    Confirmation.objects.create(key=f"{task_id}:confirmation", task=task, order_id=f"ORD-{task_id}",
                                external_ref="re_1", amount=Decimal("25.00"), currency="EUR")
    return task


def edited_down(agent, key, *, version_status):
    """An original awaiting approval, edited down into a version that is then `version_status`."""
    original = make_action(agent, "awaiting_approval", key=key, target=f"ORD-{key}", amount="900.00")
    with transaction.atomic():
        version = action_version_create(original, actor="user:ops", reason="too much",
                                        params={"amount": "500.00", "currency": "EUR"})
    if version_status == "rejected":
        version.reject(actor="user:ops", reason="no")
    return original, version


def test_a_finished_task_goes_with_its_steps_confirmations_actions_and_dead_letters(tmp_path, agent):
    task = finished_task(agent, "t-old")
    immediate()
    steps = TaskStep.objects.filter(task=task).count()
    archive, counts = run_archive(tmp_path)
    assert archive is not None
    assert counts["ledger.task"] == 1 and counts["ledger.taskstep"] == steps > 0
    assert counts["ledger.action"] == counts["ledger.confirmation"] == counts["dlq.deadletter"] == 1
    assert not Task.objects.exists() and not TaskStep.objects.exists() and not Action.objects.exists()
    assert not DeadLetter.objects.exists() and not Confirmation.objects.exists()
    assert ArchivedTask.objects.get().task_id == "t-old"
    assert ArchivedKey.objects.get().operation_key == "t-old:call_refund_api:v1"
    written = (tmp_path / archive.file).read_text()
    assert '"model":"ledger.task"' in written and '"model":"ledger.taskstep"' in written


def test_a_task_stays_while_one_of_its_actions_must(tmp_path, agent):
    finished_task(agent, "t-waiting", action_status="awaiting_approval")
    finished_task(agent, "t-recent", created_at=timezone.now() + LATER - timedelta(days=1))
    open_task = failed_task_entry(agent, "t-open").task  # its dead letter is still open
    immediate()
    _, counts = run_archive(tmp_path)
    assert "ledger.task" not in counts
    assert set(Task.objects.values_list("task_id", flat=True)) == {"t-waiting", "t-recent", open_task.task_id}
    assert Action.objects.count() == 2 and TaskStep.objects.filter(task__task_id="t-recent").exists()


def test_a_finished_tasks_failure_that_could_be_retried_does_not_keep_it(tmp_path, agent):
    """Its runner retries a task's actions, and a finished task runs no more."""
    finished_task(agent, "t-retryable", action_status="failed", retryable=True)
    immediate()
    _, counts = run_archive(tmp_path)
    assert counts["ledger.task"] == counts["ledger.action"] == 1
    assert not Task.objects.exists()


def test_a_shadow_action_past_its_lifetime_is_archived(tmp_path, agent):
    """Recorded under a shadow grant and never executed: final, and every new grant starts so."""
    make_action(agent, "shadow", key="old-shadow", target="ORD-S1")
    immediate()
    _, counts = run_archive(tmp_path)
    assert counts.get("ledger.action") == 1, counts
    assert ArchivedKey.objects.get().operation_key == "old-shadow"


def test_a_finished_task_whose_step_was_recorded_shadow_is_archived(tmp_path, agent):
    finished_task(agent, "t-shadow", action_status="shadow")
    immediate()
    _, counts = run_archive(tmp_path)
    assert counts.get("ledger.task") == counts.get("ledger.action") == 1, counts
    assert not Task.objects.exists()

def test_an_archived_task_id_answers_410_and_is_never_recorded_again(tmp_path, agent, billing, client):
    finished_task(agent, "t-gone")
    immediate()
    run_archive(tmp_path)
    client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {billing[1]}"
    started = client.post("/api/v1/tasks", refund_task_body(), content_type="application/json",
                          HTTP_IDEMPOTENCY_KEY="t-gone")
    for answer in (started, client.get("/api/v1/tasks/t-gone")):
        assert (answer.status_code, answer.json()["code"]) == (410, "operation_key_expired"), answer.content
    assert not Task.objects.exists()
    with pytest.raises(KeyExpired):
        task_request(agent=agent, task_id="t-gone", workflow="refund", input=refund_task_body()["input"])
    with pytest.raises(IntegrityError, match="operation_key_archived"), transaction.atomic():  # the database's rule
        Task.objects.create(task_id="t-gone", fingerprint="f" * 64, workflow="refund", input={}, agent=agent,
                            max_attempts=3, next_attempt_at=timezone.now())


def test_an_edit_downs_version_goes_with_the_original_it_superseded(tmp_path, agent, billing, client):
    original, version = edited_down(agent, "refund:ORD-9:dec-1", version_status="rejected")
    immediate()
    archive, counts = run_archive(tmp_path)
    assert counts["ledger.action"] == 2
    assert not Action.objects.exists()
    assert set(ArchivedKey.objects.values_list("operation_key", flat=True)) == {original.operation_key,
                                                                                version.operation_key}
    client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {billing[1]}"
    for key in (original.operation_key, version.operation_key):
        answer = post_action_in_process(client, key, refund_body(order="ORD-refund:ORD-9:dec-1"))
        assert (answer.status_code, answer.json()["code"]) == (410, "operation_key_expired")


def test_an_edit_down_stays_while_its_version_waits(tmp_path, agent):
    original, version = edited_down(agent, "refund:ORD-8:dec-1", version_status="awaiting_approval")
    immediate()
    run_archive(tmp_path)
    assert set(Action.objects.values_list("pk", flat=True)) == {original.pk, version.pk}
    assert not ArchivedKey.objects.exists()


def test_a_task_whose_dead_letter_a_bulk_redrive_took_goes_in_the_run_after_the_bulk_redrives(tmp_path, agent):
    """The run's items protect the entry (and the run's counts are read from them): the archive
    takes the rest, then the bulk redrive with its items once it is past the dead letters'
    retention, then, in the next run, the task."""
    taken = finished_task(agent, "t-bulk")
    recent = finished_task(agent, "t-bulk-recent")
    for entry, planned_at in ((taken.dead_letters.get(), timezone.now()),
                              (recent.dead_letters.get(), timezone.now() + LATER - timedelta(days=1))):
        run = BulkRedrive.objects.create(filters={}, planned_by="olga", ceiling=Decimal("60"), planned_at=planned_at)
        BulkRedriveItem.objects.create(run=run, entry=entry, position=1, plan=Plan.TASK_RESUME)
    finished_task(agent, "t-plain")
    immediate()
    _, counts = run_archive(tmp_path)
    assert counts["ledger.task"] == 1  # t-plain
    assert counts["dlq.bulkredrive"] == counts["dlq.bulkredriveitem"] == 1
    _, counts = run_archive(tmp_path)
    assert counts["ledger.task"] == 1  # t-bulk, its run gone
    assert list(Task.objects.values_list("task_id", flat=True)) == ["t-bulk-recent"]  # its run is recent
    assert recent.dead_letters.get().bulk_items.exists()


def test_a_dead_letter_kept_longer_than_the_keys_keeps_its_task_and_action(tmp_path, agent, settings):
    """DEAD_LETTER_RETENTION_DAYS above the key's lifetime: the entry is kept that long, and what it
    names with it."""
    settings.DEAD_LETTER_RETENTION_DAYS = 800
    finished_task(agent, "t-kept")
    action = make_action(agent, "failed", key="refund:ORD-K:full:dec-1", target="ORD-K", retryable=False)
    DeadLetter.objects.open_for_action(action, actor="system:executor").resolve(actor="user:ops", note="by hand")
    immediate()
    _, counts = run_archive(tmp_path)
    assert "ledger.task" not in counts and "ledger.action" not in counts
    _, counts = archive_expired(tmp_path, now=timezone.now() + timedelta(days=801))
    assert counts["ledger.task"] == 1 and counts["ledger.action"] == 2
