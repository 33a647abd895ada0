"""One archive run's statements stay within what PostgreSQL binds (65,535 values a statement,
and production binds them server-side, config.settings) whatever its `--limit` and however many
rows hang off what it takes: a workflow's every step included. And what hangs off an alert a
run takes cannot be added behind its back."""

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from dlq import archive as archiving
from dlq.models import Alert, AlertDelivery
from ledger.models import Action, ArchivedKey, ArchivedTask, Task, TaskStep
from tests.dlq.test_archive_tasks_and_versions import LATER, finished_task, immediate, run_archive
from tests.factories import failed_task_entry, make_action, make_agent

pytestmark = pytest.mark.django_db
postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's binding and locks")


@pytest.fixture
def agent():
    return make_agent("billing")[0]


class Largest:
    """The most values one statement bound (connection.execute_wrapper)."""

    def __init__(self):
        self.params = 0

    def __call__(self, execute, sql, params, many, context):
        self.params = max(self.params, len(params or ()))
        return execute(sql, params, many, context)


@postgresql_only
def test_the_tests_bind_on_the_server_as_production_does():
    """Else PostgreSQL would take statements here that it refuses in production."""
    assert connection.settings_dict["OPTIONS"].get("server_side_binding") is True


def test_a_run_of_the_default_limit_over_finished_noop_tasks_goes_through(tmp_path, agent):
    """6,600 tasks of the bundled noop workflow (10 steps each): 66,000 steps, past 65,535."""
    now = timezone.now()
    tasks = Task.objects.bulk_create([
        Task(task_id=f"t-{i}", fingerprint="f", workflow="noop", input={}, agent=agent, state="succeeded",
             max_attempts=3, created_at=now) for i in range(6600)], batch_size=2000)
    TaskStep.objects.bulk_create([TaskStep(task=t, position=p, name=f"step_{p}", status="done", updated_at=now)
                                  for t in tasks for p in range(1, 11)], batch_size=5000)
    immediate()
    largest = Largest()
    with connection.execute_wrapper(largest):
        _, counts = run_archive(tmp_path)
    assert counts["ledger.task"] == ArchivedTask.objects.count() == 6600
    assert counts["ledger.taskstep"] == 66000
    assert not Task.objects.exists() and not TaskStep.objects.exists()
    assert largest.params <= 65535, largest.params


def test_no_statement_of_a_run_grows_with_its_limit(tmp_path, agent, monkeypatch):
    """Rows are named CHUNK at a time: a run four times as large binds no more values a statement."""
    monkeypatch.setattr(archiving, "CHUNK", 4)
    for i in range(15):
        finished_task(agent, f"t-{i}")
        make_action(agent, "succeeded", key=f"alone-{i}", target=f"ORD-{i}")
    immediate()
    largest = []
    for limit in (3, 12):
        largest.append(Largest())
        with connection.execute_wrapper(largest[-1]):
            _, counts = archiving.archive_expired(tmp_path, limit=limit, now=timezone.now() + LATER)
        assert counts["ledger.task"] == limit and counts["ledger.action"] == 2 * limit, counts
    assert largest[0].params == largest[1].params, [each.params for each in largest]


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_an_alert_a_run_takes_gets_no_delivery_behind_its_back(tmp_path, agent, monkeypatch):
    """A delivery recorded while the run writes its file would go with its alert, unwritten: the
    run holds its alerts, and the delivery waits (here, until its lock timeout)."""
    failed_task_entry(agent, "t-alerted").resolve(actor="user:ops", note="by hand")
    alert = Alert.objects.get()
    write_file, recorded = archiving.write_file, []

    def write_file_meanwhile(*args):
        with psycopg.connect(**connection.get_connection_params(), autocommit=True) as other:
            other.execute("SET lock_timeout = '200ms'")
            try:
                other.execute("INSERT INTO dlq_alertdelivery (alert_id, channel, attempt, ok, detail, reached, at) "
                              "VALUES (%s, 'email', 1, true, 'sent', '[]', now())", [alert.pk])
                recorded.append(True)
            except psycopg.errors.LockNotAvailable:
                recorded.append(False)
        return write_file(*args)

    monkeypatch.setattr(archiving, "write_file", write_file_meanwhile)
    _, counts = archiving.archive_expired(tmp_path, now=timezone.now() + LATER)
    assert counts["dlq.alert"] == 1
    assert recorded == [False]  # it waited for the run
    assert not AlertDelivery.objects.exists()


@pytest.mark.parametrize("chunk", [1, 5000])
def test_an_edited_down_tasks_actions_are_taken_once_whatever_the_chunks(tmp_path, monkeypatch, agent, chunk):
    """The original of a task's edit-down comes both as its version's and as a task's action: one
    statement folded the two away, but split across two chunks it was taken twice, and its archived
    key then broke the unique rule on every run."""
    monkeypatch.setattr(archiving, "CHUNK", chunk)
    task = finished_task(agent, "t-ed", action_status="superseded")
    original = Action.objects.get(task=task)
    make_action(agent, "succeeded", key="t-ed:call_refund_api:v1~v2", target="ORD-t-ed", task=task,
                supersedes=original)
    immediate()
    _, counts = run_archive(tmp_path)
    assert counts["ledger.action"] == 2 == ArchivedKey.objects.count(), counts
