"""A failed action whose effect reconciliation found at the provider (a `denied_effect` incident
under its key) is not redriven, alone or in bulk: the provider has done it, and a retry against a
provider that has forgotten the key would do it again. Its entry says why and is resolved by hand."""

import pytest
from django.db import connection
from django.test import Client

from dlq.bulk import bulk_plan
from dlq.entries import deadletter_redrive
from dlq.incidents import Incident, IncidentKind
from dlq.models import DeadLetter
from dlq.reconcile import Finding
from dlq.redrive_runs import Plan
from ledger.models import Action, ActionStatus, InvalidTransition, Task
from tests.factories import another_transaction, make_action, person

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]

HOLDS = "the provider holds an effect under refund:ORD-1:full:dec-1"


@pytest.fixture
def failed_entry(agent):
    action = make_action(agent, ActionStatus.FAILED, retryable=True)
    return DeadLetter.objects.open_for_action(action, actor="system:executor")


def denied(action, kind=IncidentKind.DENIED_EFFECT):
    """The incident reconciliation opens for `action`'s key (dlq.reconcile)."""
    Incident.objects.open_for(Finding(
        kind, "sandbox", "refund", action.operation_key, action.operation_key,
        effects=[{"external_ref": "re_1", "amount": "26.00", "currency": "EUR"}],
        ledger={"action_id": action.pk, "status": action.status, "external_ref": "", "amount": "25.00",
                "currency": "EUR"}), actor="system:reconcile")


def dead_lettered_task_with_a_failed_refund(agent):
    """A task out of attempts, its refund failed (retryable: its runner tries it again when the task
    is redriven), and the task's open entry."""
    task = Task.objects.create(task_id="t-1", fingerprint="x", workflow="refund", input={}, agent=agent,
                               max_attempts=3, state="dead_lettered", attempts=3)
    action = make_action(agent, ActionStatus.FAILED, retryable=True, task=task)
    return action, DeadLetter.objects.open_for(task, actor="system:runner")


def test_an_entry_whose_effect_the_provider_holds_is_not_redriven(failed_entry):
    denied(failed_entry.action)
    olga = person("olga", "operators")
    assert HOLDS in failed_entry.redrive_refusal
    with pytest.raises(InvalidTransition, match=HOLDS.replace(".", r"\.")):
        deadletter_redrive(failed_entry, actor=olga, reason="the card works again")
    failed_entry.action.refresh_from_db()
    assert failed_entry.action.status == ActionStatus.FAILED
    [item] = bulk_plan({}, user=olga).items.all()
    assert item.plan == Plan.SKIP and HOLDS in item.plan_detail

    client = Client()
    client.force_login(olga)
    page = client.get(f"/dlq/{failed_entry.pk}/").content.decode()
    assert 'id="no-redrive"' in page and HOLDS in page


@pytest.mark.parametrize("kind", [IncidentKind.DOUBLE_EFFECT, IncidentKind.AMOUNT_MISMATCH])
def test_a_double_or_a_mismatch_found_while_it_was_in_flight_stops_a_redrive_too(failed_entry, kind):
    """Found while the action was still in flight (unknown, or in review) and marked failed since:
    each says the provider holds an effect under its key, as a denied effect does."""
    denied(failed_entry.action, kind=kind)
    assert HOLDS in failed_entry.redrive_refusal
    with pytest.raises(InvalidTransition, match=HOLDS.replace(".", r"\.")):
        deadletter_redrive(failed_entry, actor=person("olga", "operators"), reason="the card works again")
    failed_entry.action.refresh_from_db()
    assert failed_entry.action.status == ActionStatus.FAILED


def test_a_dead_lettered_task_whose_actions_effect_the_provider_holds_is_not_redriven(agent):
    """Redriven, a task's runner retries its failed action under the same key: refused alike."""
    action, entry = dead_lettered_task_with_a_failed_refund(agent)
    denied(action)
    with pytest.raises(InvalidTransition, match=HOLDS.replace(".", r"\.")):
        deadletter_redrive(entry, actor=person("olga", "operators"), reason="the provider is back")
    assert Task.objects.get(pk=entry.task_id).state == "dead_lettered"


@pytest.mark.parametrize("kind", [IncidentKind.DOUBLE_EFFECT, IncidentKind.AMOUNT_MISMATCH])
def test_a_double_or_a_mismatch_on_a_tasks_step_that_succeeded_does_not_stop_its_redrive(agent, kind):
    """The refund succeeded, reconciliation found a mismatch (or a double) on it, and a later step
    failed: redriven, the task resumes after its done steps, so nothing makes the refund again."""
    task = Task.objects.create(task_id="t-2", fingerprint="x", workflow="refund", input={}, agent=agent,
                               max_attempts=3, state="dead_lettered", attempts=3)
    action = make_action(agent, ActionStatus.SUCCEEDED, task=task, external_ref="re_1")
    entry = DeadLetter.objects.open_for(task, actor="system:runner")
    denied(action, kind=kind)
    assert entry.redrive_refusal == ""


def test_a_version_whose_original_the_provider_holds_is_not_redriven(agent):
    """A person edited the refund down into a version; the provider holds an effect under the
    original's key (its row says superseded): the version's failure, redriven, would refund the
    decision a second time. Asked of the version's key alone, nothing refused it."""
    original = make_action(agent, ActionStatus.SUPERSEDED)
    version = make_action(agent, ActionStatus.FAILED, key=f"{original.operation_key}~v2", retryable=True,
                          supersedes=original)
    entry = DeadLetter.objects.open_for_action(version, actor="system:executor")
    denied(original)
    assert HOLDS in entry.redrive_refusal


ON_POSTGRESQL = pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's row locks")


@ON_POSTGRESQL
@pytest.mark.django_db(transaction=True)
def test_an_effect_found_while_the_redrive_waits_for_the_actions_lock_refuses_it(failed_entry):
    """Reconciliation opens its incident under the action's lock (Incident.objects.open_for). The
    redrive asked whether the provider holds an effect before it took that lock, waited for it,
    and once the incident committed requeued the action all the same. It asks with the action
    locked now, so it reads the incident that committed meanwhile."""
    with another_transaction(lambda: denied(failed_entry.action), commit_when_waited_on=True) as reconciliation:
        with pytest.raises(InvalidTransition, match=HOLDS.replace(".", r"\.")):
            deadletter_redrive(failed_entry, actor=person("olga", "operators"), reason="the provider is back")
    assert reconciliation.waited
    assert Action.objects.get(pk=failed_entry.action_id).status == ActionStatus.FAILED
    assert DeadLetter.objects.get(pk=failed_entry.pk).status == "open"


@ON_POSTGRESQL
@pytest.mark.django_db(transaction=True)
def test_an_effect_found_while_a_tasks_redrive_waits_for_its_actions_refuses_it(agent):
    """The same for a task's entry: its actions are locked (after the task, as every decision on an
    entry locks them) before the redrive asks, so it waits for the incident under its refund's key."""
    action, entry = dead_lettered_task_with_a_failed_refund(agent)
    with another_transaction(lambda: denied(action), commit_when_waited_on=True) as reconciliation:
        with pytest.raises(InvalidTransition, match=HOLDS.replace(".", r"\.")):
            deadletter_redrive(entry, actor=person("olga", "operators"), reason="the provider is back")
    assert reconciliation.waited
    assert Task.objects.get(pk=entry.task_id).state == "dead_lettered"
    assert Action.objects.get(pk=action.pk).status == ActionStatus.FAILED
