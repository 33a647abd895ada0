"""An archive run chooses what it takes, locks it, and chooses again among what it locked: an
incident (or anything else that keeps a row) committed while the run waited for a lock keeps its
action, and an incident opened while the run holds the action waits for it (PostgreSQL: the
locks; SQLite serialises every writer)."""

import pytest
from django.db import connection
from django.utils import timezone

from dlq.archive import archive_expired, collect
from dlq.incidents import Incident, IncidentKind
from dlq.reconcile import Finding, incident_open_for_failed_effect
from ledger.models import Action, ActionStatus, ArchivedKey
from tests.dlq.test_archive_tasks_and_versions import LATER, finished_task
from tests.factories import another_transaction, make_action, make_agent, sessions_waiting_for_a_lock

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's row locks")]


def archive(tmp_path):
    return archive_expired(tmp_path, now=timezone.now() + LATER)


@pytest.fixture
def agent():
    return make_agent("billing")[0]


def failed_effect(action):
    """What a webhook does for a refund the provider failed after it succeeded: the action
    locked (ledger.webhooks), then the incident opened."""
    def hold():
        row = Action.objects.select_for_update().get(pk=action.pk)
        incident_open_for_failed_effect(row, connector="sandbox", external_ref="re_1",
                                        evidence={"webhook": "refund.failed"}, actor="system:webhook:sandbox")
    return hold


def test_an_incident_committed_while_the_run_waited_for_its_action_keeps_it(agent, tmp_path):
    action = make_action(agent, ActionStatus.SUCCEEDED, key="old-refund", target="ORD-9", external_ref="re_1")
    with another_transaction(failed_effect(action), commit_when_waited_on=True) as webhook:
        archive(tmp_path)
    assert webhook.waited, "the run did not wait for the action's lock"
    assert Incident.objects.filter(operation_key="old-refund", status="open").exists()
    assert Action.objects.filter(pk=action.pk).exists()
    assert not ArchivedKey.objects.filter(operation_key="old-refund").exists()


def test_a_task_whose_action_gets_an_incident_while_the_run_waits_stays_whole(agent, tmp_path):
    finished_task(agent, "t-9", external_ref="re_1")
    action = Action.objects.get(operation_key="t-9:call_refund_api:v1")
    with another_transaction(failed_effect(action), commit_when_waited_on=True) as webhook:
        archive(tmp_path)
    assert webhook.waited
    assert Action.objects.filter(pk=action.pk, task__task_id="t-9").exists()


def test_an_incident_opened_while_a_run_holds_the_action_waits_for_it(agent, tmp_path):
    """Reconciliation locks no action of its own: opening the incident does, so it waits for a run
    that locked the action first, and then names a key the archive took."""
    make_action(agent, ActionStatus.SUCCEEDED, key="old-refund", target="ORD-9", external_ref="re_1")
    finding = Finding(IncidentKind.DENIED_EFFECT, "sandbox", "refund", "old-refund", "old-refund",
                      effects=[{"external_ref": "re_2", "amount": None, "currency": "", "created_at": None}],
                      ledger={"status": "succeeded"})

    def run_holding_its_locks():
        collect(timezone.now() + LATER, 100)

    with another_transaction(run_holding_its_locks, commit_when_waited_on=True) as run:
        Incident.objects.open_for(finding, actor="system:reconcile")
    assert run.waited and sessions_waiting_for_a_lock() == 0
