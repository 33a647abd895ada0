"""The limits refuse only what is not recorded yet (LIMITS_UNCOVERED_CURRENCY=refuse, a currency no
limit covers): a request whose key, or whose decision's effect, the ledger holds already is answered
as the contract's rows for it say, whatever the limits say now. Refused as "nothing was recorded",
an agent retrying a refund it made before the limits changed would believe it never happened."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from approvals.models import Limit
from ledger.models import Action, ArchivedKey
from tests.factories import make_action, make_agent, make_agent_on, post_action_in_process, refund_body

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]

KEY = "refund:ORD-1:dec-1"
JPY = refund_body("ORD-1", amount="900000", currency="JPY", customer="CUST-1", decision="dec-1")


@pytest.fixture
def jpy_now_refused(settings):
    """Called once the first request is in: from then on only EUR is covered, and others refused."""
    def refuse():
        Limit.limit_set(actor="system:tests", reason="EUR only", action_type="refund", currency="EUR",
                        max_amount=Decimal("500.00"))
        settings.LIMITS_UNCOVERED_CURRENCY = "refuse"
    return refuse


def test_a_new_request_in_a_currency_no_limit_covers_is_refused(client, jpy_now_refused):
    make_agent_on(client)
    jpy_now_refused()
    answer = post_action_in_process(client, KEY, JPY)
    assert (answer.status_code, answer.json()["code"]) == (422, "currency_not_covered")
    assert not Action.objects.exists()


def test_the_same_request_recorded_before_is_replayed(client, jpy_now_refused):
    make_agent_on(client)
    assert post_action_in_process(client, KEY, JPY).status_code == 201
    jpy_now_refused()
    # Spelt otherwise, so that the API's own look-up of the body as sent does not answer it first.
    again = post_action_in_process(client, KEY, {**JPY, "params": {"amount": "900000.00", "currency": "JPY"}})
    assert (again.status_code, again["Idempotent-Replayed"]) == (200, "true"), again.json()
    assert Action.objects.count() == 1


def test_the_same_decisions_refund_under_another_key_is_the_first_one(client, jpy_now_refused):
    make_agent_on(client)
    first = post_action_in_process(client, KEY, JPY).json()
    jpy_now_refused()
    again = post_action_in_process(client, "refund:ORD-1:dec-1:again", JPY)
    assert (again.status_code, again.json()["operation_key"]) == (200, first["operation_key"]), again.json()


def test_another_agents_key_is_reused_not_refused(client, jpy_now_refused):
    other, _ = make_agent("other")
    make_action(other, "queued", key=KEY, target="ORD-1")
    make_agent_on(client)
    jpy_now_refused()
    answer = post_action_in_process(client, KEY, JPY)
    assert (answer.status_code, answer.json()["code"]) == (422, "idempotency_key_reused")


def test_a_key_archived_past_its_lifetime_is_expired_not_refused(client, jpy_now_refused, settings):
    agent = make_agent_on(client)
    jpy_now_refused()
    ArchivedKey.objects.create(operation_key=KEY, agent=agent, archive_sha256="0" * 64,
                               created_at=timezone.now() - timedelta(days=settings.OPERATION_KEY_LIFETIME_DAYS + 3))
    answer = post_action_in_process(client, KEY, JPY)
    assert (answer.status_code, answer.json()["code"]) == (410, "operation_key_expired")
