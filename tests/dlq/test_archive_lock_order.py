"""An archive run and a person working a dead letter never wait for each other: a person works an
open entry, and the run takes no task or action with one (it locks tasks, their actions, then
their closed entries; a person locks the entry, then its task, then the actions). A resolve still
uncommitted keeps its task out of the run, which takes it once the resolve has committed
(PostgreSQL: the locks)."""

import time

import pytest
from django.db import connection
from django.utils import timezone

from dlq.archive import archive_expired
from dlq.entries import deadletter_resolve
from dlq.models import DeadLetter
from ledger.models import ArchivedTask, Task
from tests.dlq.test_archive_tasks_and_versions import LATER
from tests.factories import another_transaction, failed_task_entry, make_action, make_agent

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's row locks")]


def test_a_run_during_a_resolve_neither_waits_nor_takes_the_task(tmp_path):
    agent = make_agent("billing")[0]
    entry = failed_task_entry(agent, "t-1")
    make_action(agent, "failed", key="t-1:call_refund_api:v1", target="ORD-t-1", task=entry.task, retryable=False)

    with another_transaction(lambda: deadletter_resolve(entry, actor="user:ops", note="refunded by hand")):
        started = time.monotonic()
        archive_expired(tmp_path, now=timezone.now() + LATER)
        assert time.monotonic() - started < 5, "the run waited for the resolve's locks"
    assert Task.objects.filter(task_id="t-1").exists()
    assert DeadLetter.objects.get(pk=entry.pk).status == "resolved"

    archive_expired(tmp_path, now=timezone.now() + LATER)
    assert ArchivedTask.objects.filter(task_id="t-1").exists()
    assert not DeadLetter.objects.filter(pk=entry.pk).exists()
