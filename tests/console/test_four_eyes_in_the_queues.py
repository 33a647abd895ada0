"""Whoever was shown an agent's token (who made it, or rotated it) may not decide its requests,
as its owner may not (four eyes): the overview does not count such an item as waiting for them,
and the approvals queue offers them no Reject on its row."""

from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model

from approvals.models import Limit, ReviewItem
from ledger.actions import action_request
from ledger.models import Agent
from tests.factories import make_grants_live, person

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]


@pytest.fixture
def made_for_olga(client):
    """root made agent `bot` for olga: olga owns it, root was shown its token. An over-limit refund
    of it waits for approval, and root is signed in."""
    root = get_user_model().objects.create_superuser("root", password=None)
    person("olga", "operators")
    client.force_login(root)
    client.post("/agents/", {"name": "bot", "owner": "olga", "grant": ["refund"], "reason": "for olga"})
    agent = Agent.objects.get(name="bot")
    assert agent.token_issued_by == root and agent.owner.get_username() == "olga"
    make_grants_live(agent)
    Limit.limit_set(actor="system:tests", reason="policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"))
    action, _ = action_request(agent=agent, operation_key="refund:ORD-1:dec-1", action_type="refund", target="ORD-1",
                               customer="C1", params={"amount": "750.00", "currency": "EUR"})
    return ReviewItem.objects.get(action=action)


def test_the_overview_does_not_count_it_as_waiting_for_the_one_shown_its_token(client, made_for_olga):
    assert 'id="four-eyes"' in client.get(f"/review/{made_for_olga.pk}/").content.decode()
    card = next(c for c in client.get("/").context["cards"] if c["kind"] == "approval")
    assert (card["count"], card["mine"]) == (1, 0)


def test_the_queue_offers_no_reject_to_the_one_shown_its_token(client, made_for_olga):
    row = client.get("/approvals/").content.decode()
    assert f'data-id="{made_for_olga.pk}"' in row and f"reject-reason-{made_for_olga.pk}" not in row
