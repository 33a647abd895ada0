"""An approver edits an over-limit refund down instead of rejecting it: a new, linked version
with its own key and audit trail, approved by the editor (the first of two if it still needs
two); the original ends superseded. Every edit that is not allowed is refused, in words, and
changes nothing."""

import re
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from approvals.decisions import AlreadyDecided, DecisionRefused, review_decide, review_edit
from approvals.intake import customer_total_today
from approvals.models import Limit, ReviewItem, ReviewKind
from console.approval_forms import EditForm
from console.evidence import evidence_export
from dlq.entries import deadletter_redrive
from dlq.models import DeadLetter
from ledger.actions import action_request
from ledger.evidence import evidence_actions
from ledger.models import Action, ActionStatus, AuditEvent
from tests.factories import audit_events, make_agent, person

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]
KEY = "refund:ORD-E1:full:dec-1"


@pytest.fixture
def people():
    users = {name: person(name, "approvers") for name in ("olga", "alice", "bob")}
    agent, _ = make_agent("billing-bot", owner=users["olga"])
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), dual_approval_above=Decimal("1000.00"))
    return users, agent


def over_limit(agent, amount="750.00", key=KEY, **params):
    action, _ = action_request(agent=agent, operation_key=key, action_type="refund", target="ORD-E1",
                               customer="CUST-E1", params={"amount": amount, "currency": "EUR", **params})
    return action, ReviewItem.objects.get(action=action, status="open")


def unchanged(action, item):
    """Nothing moved: the action still waits, its item is open, and no version exists."""
    action.refresh_from_db()
    item.refresh_from_db()
    return (action.status == ActionStatus.AWAITING_APPROVAL and item.status == "open"
            and not Action.objects.filter(supersedes=action).exists())


def test_an_edit_down_makes_an_approved_version_and_supersedes_the_original(people):
    users, agent = people
    action, item = over_limit(agent, reason="damaged parcel")
    seen = action.params_fingerprint()

    item, version = review_edit(item, user=users["alice"], changes={"amount": "400.00", "reason": "damaged parcel"},
                                reason="only the broken item is refunded", fingerprint=seen)

    action.refresh_from_db()
    assert action.status == ActionStatus.SUPERSEDED and action.superseded_by == version
    assert item.status == "edited" and item.decided_by_label == "user:alice" and item.decided_fingerprint == seen
    assert version.operation_key == KEY + "~v2" and version.supersedes == action
    assert version.params == {"amount": "400.00", "currency": "EUR", "reason": "damaged parcel"}
    assert version.amount == Decimal("400.00") and version.customer == "CUST-E1" and version.agent == agent
    # Approved by the editor as it was made, bound to the params the editor gave it.
    assert version.status == ActionStatus.QUEUED
    assert version.approved_fingerprint == version.params_fingerprint() == version.fingerprint
    version_item = ReviewItem.objects.get(action=version)
    assert version_item.status == "approved" and version_item.decided_by_label == "user:alice"
    # Its own audit trail: asked for by the editor, approved by the editor.
    assert [(e.actor, e.verb) for e in audit_events(version)] == [("user:alice", "requested"),
                                                                   ("user:alice", "approved")]
    [superseded] = audit_events(action, "superseded")
    assert superseded.actor == "user:alice" and superseded.reason == "only the broken item is refunded"
    # The original's params never change: a replay of its key still asks what it asked.
    assert action.params == {"amount": "750.00", "currency": "EUR", "reason": "damaged parcel"}


def test_an_edited_amount_still_above_the_second_threshold_waits_for_a_second_approver(people):
    users, agent = people
    action, item = over_limit(agent, amount="3000.00")
    assert item.approvals_needed == 2

    _, version = review_edit(item, user=users["alice"], changes={"amount": "1500.00"}, reason="half",
                             fingerprint=action.params_fingerprint())

    assert version.status == ActionStatus.AWAITING_APPROVAL
    version_item = ReviewItem.objects.get(action=version, status="open")
    assert version_item.approvals_needed == 2
    second_approval_by_someone_else(version_item, version, users)


def test_a_version_can_be_edited_down_again_under_the_next_suffix(people):
    users, agent = people
    action, item = over_limit(agent, amount="3000.00")
    _, v2 = review_edit(item, user=users["alice"], changes={"amount": "1500.00"}, reason="half",
                        fingerprint=action.params_fingerprint())
    _, v3 = review_edit(ReviewItem.objects.get(action=v2, status="open"), user=users["bob"],
                        changes={"amount": "900.00"}, reason="less again", fingerprint=v2.params_fingerprint())
    assert v3.operation_key == KEY + "~v3" and v3.supersedes == v2 and v3.status == ActionStatus.QUEUED


@pytest.mark.parametrize(("changes", "why"), [
    ({"amount": "800.00"}, "the amount may not go up: 800.00 is above 750.00"),
    ({"amount": "750.00"}, "nothing was changed"),
    ({"amount": "750"}, "nothing was changed"),
    ({"amount": "0"}, "amount: Must be greater than zero"),
    ({"amount": "-5.00"}, "amount: Must be greater than zero"),
    ({"amount": "12.345"}, "amount: At most 2 decimal places in EUR"),
    ({"amount": "lots"}, "amount: Not a decimal number"),
    ({"amount": "400.00", "currency": "USD"}, "currency may not be edited (for a refund: amount, reason)"),
    ({"target": "ORD-OTHER"}, "target may not be edited"),
])
def test_an_edit_that_is_not_allowed_is_refused_and_changes_nothing(people, changes, why):
    users, agent = people
    action, item = over_limit(agent)
    with pytest.raises(DecisionRefused, match=why.replace("(", r"\(").replace(")", r"\)")):
        review_edit(item, user=users["alice"], changes=changes, reason="trying",
                    fingerprint=action.params_fingerprint())
    assert unchanged(action, item)
    assert not audit_events(item, "edit").exists()


def test_a_refunds_reason_alone_can_be_edited_at_the_same_amount(people):
    users, agent = people
    action, item = over_limit(agent, reason="wrong size")
    _, version = review_edit(item, user=users["alice"], changes={"amount": "750", "reason": "damaged parcel"},
                             reason="the customer's words", fingerprint=action.params_fingerprint())
    assert version.params == {"amount": "750.00", "currency": "EUR", "reason": "damaged parcel"}
    assert version.amount == Decimal("750.00") and version.status == ActionStatus.QUEUED


@pytest.mark.parametrize(("editor", "reason", "why"), [
    ("alice", "  ", "a reason is required to edit"),
    ("olga", "mine", "four eyes: you are responsible for the agent"),  # the agent's owner
])
def test_an_edit_without_a_reason_or_by_the_agents_owner_is_refused(people, editor, reason, why):
    users, agent = people
    action, item = over_limit(agent)
    with pytest.raises(DecisionRefused, match=why):
        review_edit(item, user=users[editor], changes={"amount": "400.00"}, reason=reason,
                    fingerprint=action.params_fingerprint())
    assert unchanged(action, item)


def test_an_edit_of_params_that_changed_since_the_page_opened_is_refused(people):
    users, agent = people
    action, item = over_limit(agent)
    seen = action.params_fingerprint()
    Action.objects.filter(pk=action.pk).update(params={"amount": "700.00", "currency": "EUR"})
    with pytest.raises(DecisionRefused, match="the parameters changed since you opened this page"):
        review_edit(item, user=users["alice"], changes={"amount": "400.00"}, reason="half", fingerprint=seen)
    assert unchanged(action, item)


def test_an_item_decided_meanwhile_cannot_be_edited(people):
    users, agent = people
    action, item = over_limit(agent)
    review_decide(item, user=users["bob"], decision="reject", reason="fraud")
    with pytest.raises(AlreadyDecided, match="already rejected by user:bob"):
        review_edit(item, user=users["alice"], changes={"amount": "400.00"}, reason="half",
                    fingerprint=action.params_fingerprint())
    assert not Action.objects.filter(supersedes=action).exists()


def test_a_held_item_is_not_edited(people):
    users, agent = people
    first, _ = over_limit(agent)
    held, _ = action_request(agent=agent, operation_key="refund:ORD-E1:part:dec-2", action_type="refund",
                             target="ORD-E1", params={"amount": "20.00", "currency": "EUR"})
    item = ReviewItem.objects.get(action=held, status="open")
    assert item.kind == ReviewKind.HELD
    with pytest.raises(DecisionRefused, match="only an action awaiting approval can be edited"):
        review_edit(item, user=users["alice"], changes={"amount": "10.00"}, reason="less",
                    fingerprint=held.params_fingerprint())


def test_the_customers_total_today_counts_the_version_not_the_superseded_original(people):
    users, agent = people
    action, item = over_limit(agent)
    review_edit(item, user=users["alice"], changes={"amount": "400.00"}, reason="less",
                fingerprint=action.params_fingerprint())
    assert customer_total_today("refund", "EUR", "CUST-E1") == Decimal("400.00")


def test_each_edit_is_audited_on_the_item_with_what_the_editor_saw(people):
    users, agent = people
    action, item = over_limit(agent)
    seen = action.params_fingerprint()
    review_edit(item, user=users["alice"], changes={"amount": "400.00"}, reason="less", fingerprint=seen)
    [event] = AuditEvent.objects.history(item).filter(verb="edit")
    assert event.actor == "user:alice" and event.reason == "less"
    assert event.after["status"] == "edited" and event.after["decided_fingerprint"] == seen


def test_the_database_refuses_to_commit_a_superseded_action_without_its_version(people):
    _, agent = people
    action, _ = over_limit(agent)
    with pytest.raises(IntegrityError, match="superseded by no version"), transaction.atomic():
        Action.objects.filter(pk=action.pk).update(status=ActionStatus.SUPERSEDED)
    assert Action.objects.get(pk=action.pk).status == ActionStatus.AWAITING_APPROVAL


def on_the_edit_page(people, client):
    """An over-limit refund, and alice (an approver on the dashboard) logged in to decide it."""
    users, agent = people
    users["alice"].is_staff = users["alice"].is_superuser = True
    users["alice"].save(update_fields=["is_staff", "is_superuser"])
    client.force_login(users["alice"])
    return over_limit(agent)


def test_the_edit_page_refuses_a_field_not_declared_editable_by_name(people, client):
    action, item = on_the_edit_page(people, client)
    page = client.post(f"/review/{item.pk}/edit", {"param_amount": "400.00", "param_currency": "USD",
                                                   "reason": "cheaper", "fingerprint": action.params_fingerprint()},
                       follow=True)
    assert "Not done: currency may not be edited (for a refund: amount, reason)." in page.content.decode()
    assert unchanged(action, item)
    page = client.post(f"/review/{item.pk}/edit", {"param_amount": "abc", "reason": "cheaper",
                                                   "fingerprint": action.params_fingerprint()}, follow=True)
    # The message ends in its own full stop: one, not two.
    assert "Not done: amount: Not a decimal number.<" in page.content.decode().replace("\n", "").replace(" <", "<")
    assert unchanged(action, item)
    page = client.post(f"/review/{item.pk}/edit", {"param_amount": "400.00", "reason": "cheaper",
                                                   "fingerprint": action.params_fingerprint()}, follow=True)
    assert f"Edited into {KEY}~v2: approved by you." in page.content.decode()


@pytest.mark.parametrize("fingerprint, said", [("", "the page did not say which parameters you saw"),
                                               ("z" * 64, "print of the parameters you saw is not one: reload it")])
def test_the_edit_page_refuses_an_edit_without_the_print_of_the_params_seen(people, client, fingerprint, said):
    action, item = on_the_edit_page(people, client)
    page = client.post(f"/review/{item.pk}/edit", {"param_amount": "400.00", "reason": "cheaper",
                                                   "fingerprint": fingerprint}, follow=True)
    assert "Not done: " in page.content.decode() and said in page.content.decode()
    assert unchanged(action, item)


def test_an_action_sent_to_its_provider_before_is_not_edited(people):
    """A refund approved and sent, failed for good, redriven by a person while another refund of
    the customer was in flight (held, its approval dropped: the limits are asked again) and
    released back to an approver: edited down, its version ran under a key of its own, which the look a retried
    failure makes before its call did not cover, and refunded a second time if the first had gone
    through. It may be approved or rejected, not edited; the page offers no edit."""
    users, agent = people
    action, item = over_limit(agent)
    review_decide(item, user=users["alice"], decision="approve", reason="damaged")
    action.refresh_from_db()
    action = action.claim(owner="tests:1")  # sent, and failed for good: a person's redrive asks the limits again
    action = action.mark_failed(actor="system:executor", claim=action.fence, code="declined", message="card blocked",
                                retryable=False)
    action_request(agent=agent, operation_key="refund:ORD-E9:full:dec-9", action_type="refund", target="ORD-E9",
                   customer="CUST-E1", params={"amount": "20.00", "currency": "EUR"})
    deadletter_redrive(DeadLetter.objects.get(action=action, status="open"), actor=users["olga"],
                       reason="the customer still waits")
    held = ReviewItem.objects.get(action=action, status="open", kind=ReviewKind.HELD)
    review_decide(held, user=users["alice"], decision="release", reason="the other one is small",
                  fingerprint=action.params_fingerprint())
    action.refresh_from_db()
    assert action.status == ActionStatus.AWAITING_APPROVAL
    again = ReviewItem.objects.get(action=action, status="open", kind=ReviewKind.APPROVAL)

    assert EditForm(action=action).editable == ()
    with pytest.raises(DecisionRefused, match="sent to the provider before"):
        review_edit(again, user=users["alice"], changes={"amount": "400.00"}, reason="half",
                    fingerprint=action.params_fingerprint())
    assert unchanged(action, again)


def version_page(people, client, amount, changes, reason):
    """alice edits an over-limit refund (the agent's reason "wrong size") with `changes`; bob, an
    approver on the dashboard, opens the version's item. Its page, and the version."""
    users, agent = people
    action, item = over_limit(agent, amount=amount, reason="wrong size")
    _, version = review_edit(item, user=users["alice"], changes=changes, reason=reason,
                             fingerprint=action.params_fingerprint())
    client.force_login(users["bob"])
    version_item = ReviewItem.objects.filter(action=version).get()
    return client.get(f"/review/{version_item.pk}/").content.decode(), version


def test_a_versions_page_says_who_edited_it_why_and_what_changed(people, client):
    """The second approver of a version approves an approver's edit: the page says whose and why,
    each field as the original asked and as edited, and the agent's own reason is the agent's,
    never the text the editor put in its place."""
    page, version = version_page(people, client, "3000.00", {"amount": "1500.00", "reason": "damaged parcel"},
                                 reason="only the broken item is refunded")
    [said] = re.findall(r'<div class="callout callout--info" id="version-of">(.*?)</div>', page, re.S)
    said = " ".join(re.sub(r"<[^>]+>", "", said).split())
    assert f"A version of {KEY}, edited by alice: “only the broken item is refunded”" in said
    assert "amount 3000.00 → 1500.00 EUR" in said and "reason “wrong size” → “damaged parcel”" in said
    [agents] = re.findall(r'id="rationale">(.*?)</blockquote>', page, re.S)
    assert "wrong size" in agents and "damaged parcel" not in agents


def test_a_version_whose_reason_alone_was_edited_is_not_said_to_be_edited_down(people, client):
    page, _ = version_page(people, client, "750.00", {"amount": "750.00", "reason": "damaged parcel"},
                           reason="the customer's words")
    [said] = re.findall(r'<div class="callout callout--info" id="version-of">(.*?)</div>', page, re.S)
    said = " ".join(re.sub(r"<[^>]+>", "", said).split())
    assert "edited down" not in said and "amount" not in said  # unchanged: not listed
    assert "reason “wrong size” → “damaged parcel”" in said


def test_the_edit_forms_amount_says_its_currency(people, client):
    _, item = on_the_edit_page(people, client)
    page = client.get(f"/review/{item.pk}/").content.decode()
    assert re.search(r'<label for="edit-param_amount">Refund amount \(EUR\)</label>', page)


def waiting_beside_a_held_one(people, amount):
    """An over-limit refund of ORD-E1 and a part refund of the same order, held together; bob lets
    the first out of the group to wait for approval, the other still held on its order. The first's
    approval item."""
    users, agent = people
    action, _ = over_limit(agent, amount=amount)
    action_request(agent=agent, operation_key="refund:ORD-E1:part:dec-2", action_type="refund", target="ORD-E1",
                   params={"amount": "20.00", "currency": "EUR"})
    review_decide(ReviewItem.objects.get(action=action, status="open", kind=ReviewKind.HELD), user=users["bob"],
                  decision="release", reason="the part refund is another matter")
    return ReviewItem.objects.get(action=action, status="open", kind=ReviewKind.APPROVAL)


def held_as_it_is_made(people, amount, edited):
    """alice edits the refund waiting beside a held one down: the version is held as it is made."""
    item = waiting_beside_a_held_one(people, amount)
    _, version = review_edit(item, user=people[0]["alice"], changes={"amount": edited}, reason="only the broken item",
                             fingerprint=item.action.params_fingerprint())
    assert version.status == ActionStatus.HELD
    return version


def released(version, by):
    review_decide(ReviewItem.objects.get(action=version, status="open", kind=ReviewKind.HELD), user=by,
                  decision="release", reason="the part refund is another matter",
                  fingerprint=version.params_fingerprint())
    version.refresh_from_db()
    return version


def test_a_version_held_as_it_is_made_keeps_its_editors_approval_and_its_release_queues_it(people):
    """The edit is the editor's approval of the version (decision 24); held as it is made, the
    approval stands through the hold as any approval given before one does (decision 23): released,
    the version goes to the queue, bound to the params its editor gave it, not back to a person."""
    users, _ = people
    version = held_as_it_is_made(people, "750.00", "400.00")
    assert version.has_approval()

    version = released(version, users["bob"])

    assert version.status == ActionStatus.QUEUED and version.approved_fingerprint == version.params_fingerprint()
    assert not ReviewItem.objects.filter(action=version, status="open").exists()


def test_a_version_held_as_it_is_made_that_runs_on_its_editors_approval_alone_has_it_on_record(people, client):
    """Held as it is made, the version's approval item is closed by the hold before its editor's
    approval is given: released, it ran on that approval, and its evidence record showed the item
    closed with no approval at all. The approval is recorded on that item, naming its editor and
    the print of the version's params, with its audit event, and the record carries both."""
    users, _ = people
    version = held_as_it_is_made(people, "750.00", "400.00")
    version = released(version, users["bob"])
    claimed = version.claim(owner="tests:1")
    claimed.mark_succeeded(actor="system:executor", claim=claimed.fence, external_ref="re_v2")

    record = evidence_export(evidence_actions().get(pk=version.pk))
    [approval] = [item for item in record["sections"]["approvals"]["review_items"] if item["kind"] == "approval"]
    assert approval["status"] == "closed"
    assert [(a["user"], a["on_behalf_of"], a["fingerprint"], a["reason"]) for a in approval["approvals"]] == [
        ("alice", None, version.params_fingerprint(), "only the broken item")]
    recorded = [e for e in record["audit"]["events"] if e["verb"] == "approval_recorded"]
    assert [(e["actor"], e["object_id"], e["after"]["fingerprint"]) for e in recorded] == [
        ("user:alice", str(approval["id"]), version.params_fingerprint())]
    # The printable record shows it on the item.
    client.force_login(get_user_model().objects.create_superuser("aldo", password=None))
    page = client.get(f"/actions/{version.pk}/evidence").content.decode()
    [shown] = re.findall(rf'<article class="ev-item" id="ev-item-{approval["id"]}">(.*?)</article>', page, re.S)
    assert "alice" in shown and version.params_fingerprint() in shown


def test_a_version_run_on_its_editors_approval_and_retried_after_a_failure_for_good_is_approved_again(people):
    """The editor's approval, recorded on the item its hold closed, let the version go: it is no first
    of two waiting there. Failed for good and redriven by a person, still over its limit, the version
    waits on a new item with no approval given, as any failure for good retried does (decision 23)."""
    users, _ = people
    version = held_as_it_is_made(people, "900.00", "600.00")
    closed = ReviewItem.objects.get(action=version, kind=ReviewKind.APPROVAL)
    claimed = released(version, users["bob"]).claim(owner="tests:1")
    claimed.mark_failed(actor="system:executor", claim=claimed.fence, code="declined", message="card blocked",
                        retryable=False)
    part = ReviewItem.objects.get(action__operation_key="refund:ORD-E1:part:dec-2", status="open")
    review_decide(part, user=users["bob"], decision="reject", reason="asked twice")  # nothing in flight on ORD-E1

    deadletter_redrive(DeadLetter.objects.get(action=version, status="open"), actor=users["olga"],
                       reason="the card issuer lifted its block")

    version.refresh_from_db()
    assert version.status == ActionStatus.AWAITING_APPROVAL and not version.has_approval()
    waiting = ReviewItem.objects.get(action=version, status="open")
    assert waiting.pk != closed.pk and waiting.kind == ReviewKind.APPROVAL and not waiting.approvals.exists()
    assert ReviewItem.objects.get(pk=closed.pk).status == "closed"


def test_the_first_of_two_approvals_of_a_version_held_as_it_is_made_is_its_editors(people):
    """Still above the two-approver threshold, the version needs someone else's approval too: its
    editor's, the first, is recorded as it is made, and its release waits for the second alone."""
    users, _ = people
    version = held_as_it_is_made(people, "3000.00", "1500.00")
    assert not version.has_approval()  # one of two is no approval

    version = released(version, users["bob"])

    assert version.status == ActionStatus.AWAITING_APPROVAL
    waiting = ReviewItem.objects.get(action=version, status="open")
    assert (waiting.kind, waiting.approvals_needed) == (ReviewKind.APPROVAL, 2)
    second_approval_by_someone_else(waiting, version, users)


@pytest.mark.parametrize(("amount", "said"), [
    ("750.00", "approved by you, and held: another action is in flight on its target or customer"),
    ("3000.00", "approved by you, the first of two, and held: another action is in flight on its target or "
                "customer"),
])
def test_the_edit_page_says_a_version_held_as_it_is_made_is_approved(people, client, amount, said):
    users, _ = people
    users["alice"].is_staff = users["alice"].is_superuser = True
    users["alice"].save(update_fields=["is_staff", "is_superuser"])
    client.force_login(users["alice"])
    item = waiting_beside_a_held_one(people, amount)
    page = client.post(f"/review/{item.pk}/edit", {"param_amount": "400.00" if amount == "750.00" else "1500.00",
                                                   "reason": "only the broken item",
                                                   "fingerprint": item.action.params_fingerprint()}, follow=True)
    assert f"Edited into {KEY}~v2: {said}." in page.content.decode()


@pytest.mark.parametrize(("changes", "why"), [
    ({"amount": "400.00"}, f"edited down from {KEY}: the customer's words"),
    ({"amount": "400.00", "reason": "damaged parcel"}, f"edited down from {KEY}: the customer's words"),
    ({"reason": "damaged parcel"}, f"edited from {KEY}, its reason changed: the customer's words"),
])
def test_a_versions_why_says_what_its_edit_changed(people, changes, why):
    users, agent = people
    action, item = over_limit(agent, reason="wrong size")
    _, version = review_edit(item, user=users["alice"], changes=changes, reason="the customer's words",
                             fingerprint=action.params_fingerprint())
    assert audit_events(version, "requested").get().reason == why
    assert ReviewItem.objects.get(action=version).why == why


def second_approval_by_someone_else(item, version, users):
    """alice's approval of the version is on its item and counts as the first of two: hers again is
    refused (four eyes), bob's second runs the version."""
    assert [(a.user.username, a.fingerprint) for a in item.approvals.all()] == [("alice", version.params_fingerprint())]
    with pytest.raises(DecisionRefused, match="someone else"):
        review_decide(item, user=users["alice"], decision="approve", reason="again")
    review_decide(item, user=users["bob"], decision="approve", reason="agreed", fingerprint=version.params_fingerprint())
    version.refresh_from_db()
    assert version.status == ActionStatus.QUEUED
