"""What a decision costs a person, counted from the overview: each click, key press or field
typed is one interaction. The figures are the product's promise; a change that adds a step
fails here. A reason the person gave before is one click (or key) that decides: approve,
reject, release and redrive then take 3."""

import pytest

from approvals.decisions import review_decide
from approvals.links import link_issue
from approvals.models import ReviewStatus
from dlq.entries import deadletter_redrive
from dlq.models import EntryStatus
from ledger.models import Action, ActionStatus
from tests.browser.conftest import login
from tests.browser.decisions import (Counted, effect_at_provider, needs_review_not_found, open_item, refund, unknown,
                                     verify)
from tests.factories import dead_letter

pytestmark = pytest.mark.browser


def from_overview(page, username):
    login(page, username)
    page.goto("/")
    return Counted(page)


def open_from_card(person, kind, item_pk):
    person.navigating(person.click, f'.queue-card[data-queue="{kind}"]')
    person.navigating(person.click, f'.queue-row[data-id="{item_pk}"] a.row-link')


def test_approve_with_a_reason_takes_4(page, people, agent, limit):
    item = open_item(refund(agent, 1, "700.00"))
    person = from_overview(page, "alice")
    open_from_card(person, "approval", item.pk)
    person.answer("the order shows the damage")  # a asks for the reason
    person.navigating(person.press, "a")
    item.refresh_from_db()
    assert item.status == ReviewStatus.APPROVED and item.note == "the order shows the damage"
    assert person.count == 4


def test_reject_with_a_reason_takes_4_and_3_from_the_queue(page, people, agent, limit):
    item = open_item(refund(agent, 2, "700.00"))
    person = from_overview(page, "alice")
    person.navigating(person.click, '.queue-card[data-queue="approval"]')
    at_queue = person.count
    person.click(f'.queue-row[data-id="{item.pk}"] .row-reject > summary')
    person.type(f"#reject-reason-{item.pk}", "the customer withdrew the claim")
    person.navigating(person.press, "Enter")
    item.refresh_from_db()
    assert item.status == ReviewStatus.REJECTED and item.note == "the customer withdrew the claim"
    assert page.url.endswith("/approvals/?kind=approval")  # back in the queue as filtered, for the next one
    assert (person.count, person.count - at_queue) == (4, 3)


def test_resolve_an_unknown_outcome_as_succeeded_takes_3(page, people, agent, api, limit):
    action = refund(agent, 3, "600.00")
    action.approve(actor="system:tests")
    unknown(Action.objects.get(pk=action.pk))
    reference = effect_at_provider(api, action)
    item = open_item(verify(action))
    person = from_overview(page, "alice")
    open_from_card(person, "unknown_outcome", item.pk)
    person.navigating(person.click, "#use-reference-1")
    assert Action.objects.get(pk=action.pk).external_ref == reference
    assert person.count == 3


def test_resolve_an_unknown_outcome_as_failed_takes_6(page, people, agent):
    item = needs_review_not_found(refund(agent, 4, "40.00"))
    person = from_overview(page, "alice")
    open_from_card(person, "unknown_outcome", item.pk)
    person.type("#reason", "no such refund in the provider's dashboard")
    person.click("#mark-failed > summary")
    person.check("#confirm-absent")
    person.navigating(person.click, "#mark-failed-button")
    assert Action.objects.get(pk=item.action_id).status == ActionStatus.FAILED
    assert person.count == 6


def test_release_a_held_group_with_a_reason_takes_4(page, people, agent):
    refund(agent, 5, "20.00", order="ORD-HR", customer="CUST-HR")
    held = refund(agent, 6, "30.00", order="ORD-HR", customer="CUST-HR")
    item = open_item(held)
    person = from_overview(page, "alice")
    open_from_card(person, "held", item.pk)
    person.answer("the earlier refund settled")
    person.navigating(person.press, "a")
    item.refresh_from_db()
    assert item.status == ReviewStatus.RESOLVED
    assert Action.objects.get(pk=held.pk).status == ActionStatus.QUEUED
    assert person.count == 4


def test_redrive_with_a_reason_takes_4(page, people, agent):
    entry = dead_letter(agent, "refund-ix1")
    person = from_overview(page, "olga")
    open_from_card(person, "dead_letters", entry.pk)
    person.type("#redrive-reason", "the provider is back")
    person.navigating(person.click, "#redrive-form button[value=redrive]")
    entry.refresh_from_db()
    assert entry.status == EntryStatus.REDRIVEN and entry.note == "the provider is back"
    assert person.count == 4


def test_reject_with_a_reason_from_the_queue_by_keyboard_takes_4(page, people, agent, limit):
    item = open_item(refund(agent, 7, "700.00"))
    login(page, "alice")
    page.goto("/approvals/")
    person = Counted(page)
    person.press("j")  # selects the first row
    person.press("r")  # opens its "Reject…" with the reason field focused
    person.type(f"#reject-reason-{item.pk}", "duplicate of an earlier refund")
    person.navigating(person.press, "Enter")
    item.refresh_from_db()
    assert item.status == ReviewStatus.REJECTED and item.note == "duplicate of an earlier refund"
    assert person.count == 4


def decided_before(people, name, decision, item, reason):
    """`name` took `decision` on an earlier item with `reason`: offered as a choice now."""
    review_decide(item, user=people[name], decision=decision, reason=reason, fingerprint="")


def test_approve_with_a_reason_given_before_takes_3(page, people, agent, limit):
    decided_before(people, "alice", "approve", open_item(refund(agent, 20, "600.00")), "the order shows the damage")
    item = open_item(refund(agent, 21, "700.00"))
    person = from_overview(page, "alice")
    open_from_card(person, "approval", item.pk)
    person.navigating(person.click, "#reason-choices .reason-choice")
    item.refresh_from_db()
    assert item.status == ReviewStatus.APPROVED and item.note == "the order shows the damage"
    assert person.count == 3


def test_reject_with_a_reason_given_before_takes_3(page, people, agent, limit, shot):
    decided_before(people, "alice", "reject", open_item(refund(agent, 22, "600.00")), "duplicate of an earlier refund")
    item = open_item(refund(agent, 23, "700.00"))
    person = from_overview(page, "alice")
    person.navigating(person.click, '.queue-card[data-queue="approval"]')
    person.click(f'.queue-row[data-id="{item.pk}"] .row-reject > summary')
    shot(page, "reject-with-a-reason-given-before")  # the choice above the queue's rows, not under them
    person.navigating(person.click, f'.queue-row[data-id="{item.pk}"] .reason-choice')
    item.refresh_from_db()
    assert item.status == ReviewStatus.REJECTED and item.note == "duplicate of an earlier refund"
    assert person.count == 3


def test_release_with_a_reason_given_before_takes_3(page, people, agent):
    refund(agent, 24, "20.00", order="ORD-HP", customer="CUST-HP")
    decided_before(people, "alice", "release", open_item(refund(agent, 25, "30.00", order="ORD-HP", customer="CUST-HP")),
                   "the earlier refund settled")
    refund(agent, 26, "20.00", order="ORD-HQ", customer="CUST-HQ")
    held = refund(agent, 27, "30.00", order="ORD-HQ", customer="CUST-HQ")
    item = open_item(held)
    person = from_overview(page, "alice")
    open_from_card(person, "held", item.pk)
    person.navigating(person.click, "#reason-choices .reason-choice")
    item.refresh_from_db()
    assert item.status == ReviewStatus.RESOLVED and item.note == "the earlier refund settled"
    assert person.count == 3


def test_redrive_with_a_reason_given_before_takes_3(page, people, agent):
    deadletter_redrive(dead_letter(agent, "refund-ix2"), actor=people["olga"], reason="the provider is back")
    entry = dead_letter(agent, "refund-ix3")
    person = from_overview(page, "olga")
    open_from_card(person, "dead_letters", entry.pk)
    person.navigating(person.click, "#reason-choices .reason-choice")
    entry.refresh_from_db()
    assert entry.status == EntryStatus.REDRIVEN and entry.note == "the provider is back"
    assert person.count == 3


def test_by_keyboard_a_reason_given_before_rejects_in_3_and_approves_in_3(page, people, agent, limit):
    decided_before(people, "alice", "reject", open_item(refund(agent, 28, "600.00")), "duplicate of an earlier refund")
    decided_before(people, "alice", "approve", open_item(refund(agent, 29, "600.00")), "the order shows the damage")
    first, second = open_item(refund(agent, 30, "700.00")), open_item(refund(agent, 31, "700.00"))
    login(page, "alice")
    page.goto("/approvals/")
    person = Counted(page)
    person.press("j")  # the first row
    person.press("r")  # its "Reject…", the first reason given before focused
    person.navigating(person.press, "1")
    first.refresh_from_db()
    assert first.status == ReviewStatus.REJECTED and first.note == "duplicate of an earlier refund"
    assert person.count == 3

    person = Counted(page)
    person.press("j")
    person.navigating(person.press, "Enter")  # the item's page
    person.navigating(person.press, "1")
    second.refresh_from_db()
    assert second.status == ReviewStatus.APPROVED and second.note == "the order shows the damage"
    assert person.count == 3


def test_from_the_email_link_to_a_recorded_approval_takes_3(page, people, agent, limit):
    item = open_item(refund(agent, 32, "700.00"))
    token = link_issue(people["alice"], item)  # what the alert mails her (tests/console/test_decision_links.py)
    login(page, "alice")
    person = Counted(page)
    person.count += 1  # the link, clicked in the mail
    page.goto(f"/decide/{token}")
    person.type("#reason", "the order shows the damage")
    person.navigating(person.click, "#approve-button")
    item.refresh_from_db()
    assert item.status == ReviewStatus.APPROVED and item.note == "the order shows the damage"
    assert item.decision_links.get().used_at is not None
    assert person.count == 3
