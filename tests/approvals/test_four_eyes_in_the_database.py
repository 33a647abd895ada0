"""Four eyes, held by the database (approvals.dbrules; `make test` runs this on PostgreSQL and
SQLite): whatever code writes it, the owner of the agent that asked neither approves nor
decides its request, and an item needing two approvals is approved only with two people's."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals.decisions import DecisionRefused, review_decide
from approvals.models import Approval, ReviewItem, ReviewStatus
from approvals.access import may_decide
from ledger.agents import agent_create, agent_rotate_token
from ledger.audit import actor_label
from ledger.models import Agent, AuditEvent
from tests.factories import make_action, make_agent

pytestmark = pytest.mark.django_db


@pytest.fixture
def people():
    users = get_user_model().objects
    return users.create_user("olga"), users.create_user("alice"), users.create_user("bob")


def item_for(owner, approvals_needed=1):
    agent, _ = make_agent("billing", owner=owner)
    action = make_action(agent, "awaiting_approval")
    return ReviewItem.objects.create(kind="approval", action=action, approvals_needed=approvals_needed,
                                     deadline=timezone.now() + timedelta(hours=4))


def refused(write):
    with pytest.raises(IntegrityError, match="four eyes"), transaction.atomic():
        write()


def test_the_owner_may_not_record_an_approval(people):
    olga, alice, _ = people
    item = item_for(owner=olga, approvals_needed=2)
    refused(lambda: Approval.objects.create(item=item, user=olga))
    Approval.objects.create(item=item, user=alice)
    assert list(item.approvals.values_list("user__username", flat=True)) == ["alice"]


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_the_owner_may_not_decide(people, decision):
    olga, alice, _ = people
    item = item_for(owner=olga)
    refused(lambda: getattr(item, decision)(user=olga, reason="mine"))
    assert ReviewItem.objects.get(pk=item.pk).status == ReviewStatus.OPEN
    getattr(item, decision)(user=alice, reason="four eyes")
    assert ReviewItem.objects.get(pk=item.pk).decided_by == alice


@pytest.mark.parametrize("how", ["created", "rotated"])
def test_who_was_shown_the_agents_token_may_neither_approve_nor_decide_its_requests(people, how):
    """They can act as the agent: approving its over-limit refund would be approving their own."""
    olga, alice, bob = people
    if how == "created":
        agent, _ = agent_create("made-by-alice", actor=alice, owner=olga, grants=("refund",))
        item = ReviewItem.objects.create(kind="approval", action=make_action(agent, "awaiting_approval"),
                                         approvals_needed=2, deadline=timezone.now() + timedelta(hours=4))
    else:
        item = item_for(owner=olga, approvals_needed=2)
        agent = item.action.agent
        agent_rotate_token(agent, actor=alice, reason="lost")
    assert Agent.objects.get(pk=agent.pk).token_issued_by == alice
    assert Agent.objects.filter(Agent.answering_for(alice)).get() == agent
    refused(lambda: Approval.objects.create(item=item, user=alice))
    refused(lambda: item.reject(user=alice, reason="mine"))
    alice.is_superuser = True  # the authority to decide refunds: four eyes alone refuse her
    alice.save()
    assert not may_decide(alice, item)  # the page offers her no decision
    with pytest.raises(DecisionRefused, match="four eyes"):
        review_decide(item, user=alice, decision="reject", reason="mine")
    agent_rotate_token(agent, actor=bob, reason="alice left")  # shown to bob now: alice decides again
    assert may_decide(alice, ReviewItem.objects.get(pk=item.pk))
    review_decide(item, user=alice, decision="reject", reason="not needed")
    assert ReviewItem.objects.get(pk=item.pk).decided_by == alice


def test_two_approvals_come_from_two_people(people):
    olga, alice, bob = people
    item = item_for(owner=olga, approvals_needed=2)
    Approval.objects.create(item=item, user=alice)
    refused(lambda: item.approve(user=alice, reason="again"))
    with pytest.raises(IntegrityError), transaction.atomic():
        Approval.objects.create(item=item, user=alice)  # the same person twice: unique per item and person
    Approval.objects.create(item=item, user=bob)
    item.approve(user=bob, reason="second")
    assert ReviewItem.objects.get(pk=item.pk).status == ReviewStatus.APPROVED


def test_a_system_close_names_no_person_and_is_left_alone(people):
    item = item_for(owner=people[0])
    item.close(reason="the action moved on")
    assert ReviewItem.objects.get(pk=item.pk).status == ReviewStatus.CLOSED


def test_a_delegate_may_not_decide_for_the_owner(people):
    olga, alice, _ = people
    item = item_for(owner=olga)
    refused(lambda: item.approve(user=alice, reason="for olga", on_behalf_of=olga))
    assert ReviewItem.objects.get(pk=item.pk).status == ReviewStatus.OPEN
    refused(lambda: Approval.objects.create(item=item, user=alice, on_behalf_of=olga))
    item.approve(user=alice, reason="as herself")


@pytest.mark.parametrize("first, second", [({"user": "alice"}, {"user": "bob", "on_behalf_of": "alice"}),
                                           ({"user": "bob", "on_behalf_of": "alice"}, {"user": "alice"})])
def test_a_person_and_their_delegate_give_one_approval_between_them(people, first, second):
    olga, alice, bob = people
    by_name = {"alice": alice, "bob": bob}
    item = item_for(owner=olga, approvals_needed=2)
    Approval.objects.create(item=item, **{k: by_name[v] for k, v in first.items()})
    refused(lambda: Approval.objects.create(item=item, **{k: by_name[v] for k, v in second.items()}))
    assert item.approvals.count() == 1


def test_a_person_with_a_150_character_name_decides_under_the_label_the_audit_trail_gives_them(people):
    olga, _, _ = people
    long_named = get_user_model().objects.create_user("n" * 150)
    item = item_for(owner=olga)
    item.approve(user=long_named, reason="four eyes, however long the name")
    item = ReviewItem.objects.get(pk=item.pk)
    assert (item.decided_by, item.decided_by_label) == (long_named, actor_label(long_named))
    assert len(item.decided_by_label) == 150
    assert AuditEvent.objects.filter(actor=item.decided_by_label, verb="approve").exists()


@pytest.mark.parametrize("closed", [True, False])
def test_an_approval_after_its_window_is_refused_by_the_database(people, closed):
    """Not four eyes, but held the same way (approvals.dbrules.NOT_AFTER_EXPIRY): whatever code
    writes it, an item whose approval window closed is neither approved nor edited down, on the
    database's clock; it may still be rejected, or expired."""
    olga, alice, _ = people
    item = item_for(owner=olga)
    ReviewItem.objects.filter(pk=item.pk).update(
        expires_at=timezone.now() + (timedelta(seconds=-1) if closed else timedelta(hours=1)))
    item.refresh_from_db()
    for status in ("approved", "edited"):
        if closed:
            with pytest.raises(IntegrityError, match="after its window closed"), transaction.atomic():
                ReviewItem.objects.filter(pk=item.pk).update(status=status)
    if not closed:
        item.approve(user=alice, reason="in time")
        assert ReviewItem.objects.get(pk=item.pk).status == ReviewStatus.APPROVED
        return
    assert ReviewItem.objects.get(pk=item.pk).status == ReviewStatus.OPEN
    ReviewItem.objects.filter(pk=item.pk).update(status="expired")


@pytest.mark.parametrize("closed", [True, False])
def test_no_approval_is_recorded_after_its_window_either(people, closed):
    """The first of two approvals is a row of its own (approvals_approval), not a move of the item:
    given after the window (approvals.dbrules.APPROVAL_NOT_AFTER_EXPIRY) it is refused too, and
    no stray approval stands on an item nobody may approve any more."""
    olga, alice, _ = people
    item = item_for(owner=olga, approvals_needed=2)
    ReviewItem.objects.filter(pk=item.pk).update(
        expires_at=timezone.now() + (timedelta(seconds=-1) if closed else timedelta(hours=1)))
    if closed:
        with pytest.raises(IntegrityError, match="after its window closed"), transaction.atomic():
            Approval.objects.create(item=item, user=alice)
    else:
        Approval.objects.create(item=item, user=alice)
    assert item.approvals.count() == (0 if closed else 1)


@pytest.mark.parametrize("first", [{"user": "alice"}, {"user": "dan", "on_behalf_of": "alice"}],
                         ids=["alice", "her-delegate"])
@pytest.mark.parametrize("since", ["named-owner", "shown-the-token"])
def test_an_approval_counts_only_while_its_approver_answers_for_no_agent_that_asked(people, first, since):
    """The approvals are counted at the item's move to approved, not only checked at each one's
    insert: alice approved first, then was named the agent's owner (or shown its token), so her
    approval (or her delegate's for her) counts no more: bob's makes one of two, not two."""
    olga, alice, bob = people
    by_name = {"alice": alice, "dan": get_user_model().objects.create_user("dan")}
    item = item_for(owner=olga, approvals_needed=2)
    Approval.objects.create(item=item, **{k: by_name[v] for k, v in first.items()})
    Agent.objects.filter(pk=item.action.agent_id).update(
        **{"owner" if since == "named-owner" else "token_issued_by": alice})
    Approval.objects.create(item=item, user=bob)
    refused(lambda: item.approve(user=bob, reason="second"))
    assert ReviewItem.objects.get(pk=item.pk).status == ReviewStatus.OPEN
    carol = get_user_model().objects.create_user("carol")
    Approval.objects.create(item=item, user=carol)
    item.approve(user=carol, reason="the second that counts")
    assert ReviewItem.objects.get(pk=item.pk).status == ReviewStatus.APPROVED
