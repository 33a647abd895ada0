"""Whoever was shown an agent's token (who made it, or rotated it) may not decide its requests,
as its owner may not (four eyes): the overview does not count such an item as waiting for them,
and the approvals queue offers them no Reject on its row. Four eyes hold for a person and their
delegate as one (approvals.delegation): the counts, the next item and the rows follow them too."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from approvals.decisions import review_decide
from approvals.delegation import delegation_name
from approvals.models import Limit, ReviewItem
from ledger.actions import action_request
from ledger.models import Agent
from tests.factories import make_agent, make_grants_live, person

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


# --- a person and their delegate ----------------------------------------------------------------

@pytest.fixture
def away():
    """alice and bob approve; olga, an operator who may approve nothing herself, stands in for
    alice while she is away. Limits: above 500.00 EUR one approver, above 5000.00 two."""
    people = {name: person(name, group) for name, group in
              (("alice", "approvers"), ("bob", "approvers"), ("olga", "operators"))}
    Limit.limit_set(actor="system:tests", reason="policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), dual_approval_above=Decimal("5000.00"))
    now = timezone.now()
    delegation_name(person=people["alice"], delegate=people["olga"], starts_at=now - timedelta(hours=1),
                    ends_at=now + timedelta(days=1), reason="on leave")
    return people


def waiting(n, amount, owner=None):
    agent = make_agent(f"bot-{n}", owner=owner)[0]
    action, _ = action_request(agent=agent, operation_key=f"refund:ORD-{n}:dec-{n}", action_type="refund",
                               target=f"ORD-{n}", customer=f"C{n}", params={"amount": amount, "currency": "EUR"})
    return ReviewItem.objects.get(action=action)


def signed_in(user):
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize(("approver", "viewer"), [("olga", "alice"), ("alice", "olga")],
                         ids=["the delegate approved, the person looks", "the person approved, the delegate looks"])
def test_one_of_two_approvals_by_a_person_or_their_delegate_is_waiting_for_neither(away, approver, viewer):
    """A person and their delegate give one approval between them (four eyes): once one of them
    gave the first of two, the item waits for someone else. "Waiting for me" counted it for the
    other, and "Next item" sent them to it, where no approval was theirs to give."""
    first, two, last = waiting(1, "600.00"), waiting(2, "6000.00"), waiting(3, "700.00")
    review_decide(two, user=away[approver], decision="approve", reason="one of two")
    client = signed_in(away[viewer])

    assert client.get(f"/review/{first.pk}/").context["next_item"] == last
    assert signed_in(away["bob"]).get(f"/review/{first.pk}/").context["next_item"] == two  # bob's to give
    card = next(c for c in client.get("/").context["cards"] if c["kind"] == "approval")
    assert (card["count"], card["mine"]) == (3, 2)


def test_the_queue_offers_no_reject_to_a_delegate_whose_person_owns_the_agent(away):
    """The item's page tells olga that alice, for whom she stands in, answers for the agent: four
    eyes refuse her decision. Its row in the queue offered her a Reject all the same."""
    owned, other = waiting(1, "600.00", owner=away["alice"]), waiting(2, "600.00")
    rows = signed_in(away["olga"]).get("/approvals/").content.decode()
    assert f'data-id="{owned.pk}"' in rows and f"reject-reason-{owned.pk}" not in rows
    assert f"reject-reason-{other.pk}" in rows


def test_waiting_for_a_delegate_leaves_out_what_their_person_owns(away):
    """olga stands in for alice, who owns an agent: four eyes keep both from its requests, so its
    item is not waiting for olga. Her card counted it all the same (decision 50)."""
    waiting(1, "600.00", owner=away["alice"]), waiting(2, "600.00")
    card = next(c for c in signed_in(away["olga"]).get("/").context["cards"] if c["kind"] == "approval")
    assert (card["count"], card["mine"]) == (2, 1)


def test_the_queue_offers_no_reject_to_the_first_of_two_approvers(away):
    """alice gave the first of two approvals: the item's page offers her no decision on it (a second
    approver must decide), and it is not waiting for her. Its row offered her a Reject all the same."""
    two, other = waiting(1, "6000.00"), waiting(2, "600.00")
    review_decide(two, user=away["alice"], decision="approve", reason="one of two")
    alice = signed_in(away["alice"])
    assert 'id="approved-by-me"' in alice.get(f"/review/{two.pk}/").content.decode()
    rows = alice.get("/approvals/").content.decode()
    assert f'data-id="{two.pk}"' in rows and f"reject-reason-{two.pk}" not in rows
    assert f"reject-reason-{other.pk}" in rows
    assert f"reject-reason-{two.pk}" in signed_in(away["bob"]).get("/approvals/").content.decode()
