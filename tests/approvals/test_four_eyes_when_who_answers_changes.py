"""Four eyes when who answers for an agent changes while its request waits (decision 17): an
approval counts only while its approver answers for the agent no more than they did (its owner
now, or who was shown its token now, gave one that counts no longer), and nobody who answers for
an agent names its next owner, which would let them decide its requests alone."""

import html
import re
from decimal import Decimal

import pytest
from django.urls import reverse

from approvals.decisions import DecisionRefused, review_decide
from approvals.models import Limit, ReviewItem, ReviewStatus
from ledger.actions import action_request
from ledger.agents import agent_name_owner, agent_rotate_token
from ledger.models import Action, ActionStatus, Agent, AuditEvent
from tests.factories import make_agent, person

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]


@pytest.fixture
def agent():
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), dual_approval_above=Decimal("1000.00"))
    return make_agent("billing")[0]


def big_refund(agent):
    return action_request(agent=agent, operation_key="big", action_type="refund", target="ORD-1", customer="C-1",
                          decision_id="dec-1", params={"amount": "1500.00", "currency": "EUR"})[0]


def approve(action, user, reason="checked"):
    return review_decide(ReviewItem.objects.get(action=action, status=ReviewStatus.OPEN), user=user,
                         decision="approve", reason=reason)


@pytest.mark.parametrize("since", ["named-owner", "shown-the-token"])
def test_an_approval_given_before_its_approver_answered_for_the_agent_does_not_count(client, agent, since):
    """alice approves first; then an admin names her the agent's owner (or she rotates its token,
    and is shown it): bob's approval is the first of two that count, and the refund waits for a
    third person's, rather than going ahead approved by its owner and one other."""
    alice, bob, carol = person("alice", "admins"), person("bob", "admins"), person("carol", "admins")
    action = big_refund(agent)
    approve(action, alice)
    if since == "named-owner":
        client.force_login(person("ada", "admins"))
        client.post(reverse("agent-change", args=[agent.pk, "owner"]), {"owner": "alice", "reason": "alice runs it"})
        assert Agent.objects.get(pk=agent.pk).owner == alice
    else:
        agent_rotate_token(agent, actor=alice, reason="lost")
    item = approve(action, bob, "checked too")
    assert item.status == ReviewStatus.OPEN
    assert Action.objects.get(pk=action.pk).status == ActionStatus.AWAITING_APPROVAL
    recorded = AuditEvent.objects.filter(verb="approval_recorded", actor="user:bob").get()
    assert (recorded.after["approvals"], recorded.after["not_counted"]) == (1, ["alice"])
    approve(action, carol, "a second that counts")
    assert Action.objects.get(pk=action.pk).status == ActionStatus.QUEUED


@pytest.mark.parametrize("answers", ["owner", "token-holder"])
def test_who_answers_for_an_agent_cannot_hand_it_away_and_approve_its_request(client, agent, answers):
    olga = person("olga", "admins")
    Agent.objects.filter(pk=agent.pk).update(**{"owner" if answers == "owner" else "token_issued_by": olga})
    person("bea", "admins")
    action = big_refund(agent)
    client.force_login(olga)
    page = client.post(reverse("agent-change", args=[agent.pk, "owner"]), {"owner": "bea", "reason": "bea runs it"},
                       follow=True)
    assert "Not done: four eyes: you answer for billing" in page.content.decode()
    assert Agent.objects.get(pk=agent.pk).owner.get_username() == ("olga" if answers == "owner" else "agents-owner")
    assert not AuditEvent.objects.filter(verb="owner_named").exists()
    with pytest.raises(DecisionRefused, match="four eyes"):
        approve(action, olga, "fine")


def test_someone_else_names_the_next_owner_and_the_one_before_decides_again(agent):
    olga, ada = person("olga", "admins"), person("ada", "admins")
    Agent.objects.filter(pk=agent.pk).update(owner=olga)
    agent_name_owner(agent, person("bea", "admins"), actor=ada, reason="olga moved on")
    action = big_refund(agent)
    approve(action, olga)
    approve(action, ada, "checked too")
    assert Action.objects.get(pk=action.pk).status == ActionStatus.QUEUED


def test_the_items_page_counts_only_the_approvals_that_count(client, agent):
    """alice approved, then was named the agent's owner: the page says 0 of 2 and marks hers, rather
    than "1 of 2" beside a second approval that would not let the refund go ahead."""
    alice = person("alice", "admins")
    action = big_refund(agent)
    approve(action, alice)
    agent_name_owner(agent, alice, actor=person("ada", "admins"), reason="alice runs it")
    client.force_login(person("carol", "admins"))
    page = client.get(ReviewItem.objects.get(action=action, status=ReviewStatus.OPEN).get_absolute_url())
    text = page.content.decode()
    assert "<strong>0 of 2</strong> approvals" in text
    assert "does not count: answers for the agent now" in text


def approve_asks(client, user, action):
    """The question the item's Approve button asks `user` first (above the two-approver threshold)."""
    client.force_login(user)
    item = ReviewItem.objects.get(action=action, status=ReviewStatus.OPEN)
    page = client.get(reverse("review-detail", args=[item.pk])).content.decode()
    [asked] = re.findall(r'id="approve-button"\s+data-confirm="([^"]*)"', page)
    return html.unescape(asked)


def test_the_approve_buttons_question_names_no_approval_that_does_not_count(client, agent):
    """alice approved, then was named the agent's owner: her approval counts no more, and bob's is
    the first of two that count. His Approve asked as if it were the second, naming alice."""
    alice, bob = person("alice", "admins"), person("bob", "admins")
    action = big_refund(agent)
    approve(action, alice)
    Agent.objects.filter(pk=agent.pk).update(owner=alice)

    asked = approve_asks(client, bob, action)
    assert "alice" not in asked
    assert asked == "Approve 1500.00 EUR? It is above the two-approver threshold; a second, different person must " \
                    "approve too."
