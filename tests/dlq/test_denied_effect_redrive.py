"""A failed action whose effect reconciliation found at the provider (a `denied_effect` incident
under its key) is not redriven, alone or in bulk: the provider has done it, and a retry against a
provider that has forgotten the key would do it again. Its entry says why and is resolved by hand."""

import pytest
from django.test import Client

from dlq.bulk import bulk_plan
from dlq.entries import deadletter_redrive
from dlq.incidents import Incident, IncidentKind
from dlq.models import DeadLetter
from dlq.reconcile import Finding
from dlq.redrive_runs import Plan
from ledger.models import ActionStatus, InvalidTransition
from tests.factories import make_action, person

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]


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


def test_an_entry_whose_effect_the_provider_holds_is_not_redriven(failed_entry):
    denied(failed_entry.action)
    olga = person("olga", "operators")
    assert "the provider holds an effect under its key" in failed_entry.redrive_refusal
    with pytest.raises(InvalidTransition, match="the provider holds an effect under its key"):
        deadletter_redrive(failed_entry, actor=olga, reason="the card works again")
    failed_entry.action.refresh_from_db()
    assert failed_entry.action.status == ActionStatus.FAILED
    [item] = bulk_plan({}, user=olga).items.all()
    assert item.plan == Plan.SKIP and "the provider holds an effect under its key" in item.plan_detail

    client = Client()
    client.force_login(olga)
    page = client.get(f"/dlq/{failed_entry.pk}/").content.decode()
    assert 'id="no-redrive"' in page and "the provider holds an effect under its key" in page


def test_another_finding_under_its_key_does_not_stop_a_redrive(failed_entry):
    denied(failed_entry.action, kind=IncidentKind.AMOUNT_MISMATCH)
    assert failed_entry.redrive_refusal == ""
    deadletter_redrive(failed_entry, actor=person("olga", "operators"), reason="the card works again")
    failed_entry.action.refresh_from_db()
    assert failed_entry.action.status == ActionStatus.QUEUED
