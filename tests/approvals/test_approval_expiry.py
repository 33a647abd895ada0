"""An approval wait can expire: its own outcome, never a person's rejection. The limit says
after how many hours (blank: never); the sweeper's step ends what is due, as the system."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from approvals.decisions import AlreadyDecided, review_decide, review_edit
from approvals.models import Limit, ReviewItem
from approvals.reviews import approval_expire_due
from console.approval_forms import LimitForm
from console.sweeper import sweep_once
from ledger.actions import action_request
from ledger.models import Action, ActionStatus
from tests.factories import audit_events, host_clock_off_by, make_agent, person

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]


@pytest.fixture
def agent():
    return make_agent("billing-bot")[0]


def limit(hours):
    return Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                           max_amount=Decimal("500.00"), approval_expires_after_hours=hours)


def refund(agent, n, amount="750.00", order=None):
    action, _ = action_request(agent=agent, operation_key=f"refund:ORD-X{n}:full:dec-{n}", action_type="refund",
                               target=order or f"ORD-X{n}", params={"amount": amount, "currency": "EUR"})
    return action


def test_an_approval_nobody_decides_expires_as_the_system_not_as_a_rejection(agent):
    limit(hours=6)
    action = refund(agent, 1)
    item = ReviewItem.objects.get(action=action)
    assert abs(item.expires_at - (item.created_at + timedelta(hours=6))) < timedelta(seconds=1)  # two clocks
    assert audit_events(item, "review_opened").get().after["expires_at"] == item.expires_at.isoformat()

    assert approval_expire_due(now=item.expires_at - timedelta(seconds=1)) == 0
    assert approval_expire_due(now=item.expires_at) == 1

    action.refresh_from_db()
    item.refresh_from_db()
    assert item.status == "expired" and item.decided_by is None and item.decided_by_label == ""
    assert action.status == ActionStatus.EXPIRED
    assert action.error == {"code": "approval_expired", "retryable": False,
                            "message": "nobody approved or rejected it within 6 h (the limit's approval window)"}
    [event] = audit_events(action, "expired")
    assert event.actor == "system:approvals" and event.before["status"] == "awaiting_approval"
    assert not audit_events(action, "rejected").exists()
    assert audit_events(item, "expired").get().actor == "system:approvals"
    assert approval_expire_due(now=item.expires_at + timedelta(days=1)) == 0  # once


def test_without_an_expiry_on_the_limit_an_approval_waits_until_someone_decides(agent):
    limit(hours=None)
    item = ReviewItem.objects.get(action=refund(agent, 2))
    assert item.expires_at is None
    assert approval_expire_due(now=item.created_at + timedelta(days=3650)) == 0


def test_a_decision_taken_before_the_sweeper_came_stands(agent):
    limit(hours=1)
    action = refund(agent, 3)
    item = ReviewItem.objects.get(action=action)
    approver = person("alice", "approvers")
    review_decide(item, user=approver, decision="approve", reason="checked", fingerprint=action.params_fingerprint())
    assert approval_expire_due(now=item.expires_at + timedelta(hours=1)) == 0
    action.refresh_from_db()
    assert action.status == ActionStatus.QUEUED


def _past_its_window(item):
    """The window closed a second ago, and the sweeper has not come yet."""
    ReviewItem.objects.filter(pk=item.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    item.refresh_from_db()
    return item


@pytest.mark.parametrize("decision", ["approve", "reject", "edit"])
def test_after_its_window_closed_nobody_decides_it_even_before_the_sweeper_came(agent, decision):
    limit(hours=1)
    action = refund(agent, 10 + len(decision))
    item = _past_its_window(ReviewItem.objects.get(action=action))
    alice = person("alice", "approvers")
    with pytest.raises(AlreadyDecided, match="its approval window closed at .* it expires undecided"):
        if decision == "edit":
            review_edit(item, user=alice, changes={"amount": "400.00"}, reason="less",
                        fingerprint=action.params_fingerprint())
        else:
            review_decide(item, user=alice, decision=decision, reason="late", fingerprint=action.params_fingerprint())
    action.refresh_from_db()
    item.refresh_from_db()
    assert action.status == ActionStatus.AWAITING_APPROVAL and item.status == "open"
    assert not item.approvals.exists()
    assert approval_expire_due() == 1  # the sweeper's pass ends it as the system's doing
    action.refresh_from_db()
    assert action.status == ActionStatus.EXPIRED


def test_the_page_of_an_item_past_its_window_offers_no_decision_and_says_why(agent):
    limit(hours=1)
    item = ReviewItem.objects.get(action=refund(agent, 30))
    client = Client()
    client.force_login(person("alice", "approvers"))
    assert b'id="approve-button"' in client.get(f"/review/{item.pk}/").content
    _past_its_window(item)
    page = client.get(f"/review/{item.pk}/").content.decode()
    assert 'id="approve-button"' not in page and 'id="edit-form"' not in page
    assert 'id="window-closed"' in page and "expires undecided" in page


def test_the_database_refuses_an_approval_after_its_window_and_the_person_is_told_as_by_the_check(agent, monkeypatch):
    """The check in Python reads the database's clock from this process's estimate; were it a moment
    behind, the database's own rule refuses the approval, and the person is told what the check
    tells (no 500, no database text)."""
    limit(hours=1)
    action = refund(agent, 20)
    item = _past_its_window(ReviewItem.objects.get(action=action))
    monkeypatch.setattr("approvals.decisions.clock.now", lambda: item.expires_at - timedelta(seconds=1))
    with pytest.raises(AlreadyDecided, match="its approval window closed at .* it expires undecided"):
        review_decide(item, user=person("alice", "approvers"), decision="approve", reason="late",
                      fingerprint=action.params_fingerprint())
    action.refresh_from_db()
    item.refresh_from_db()
    assert action.status == ActionStatus.AWAITING_APPROVAL and item.status == "open"


def test_held_items_do_not_expire_and_an_expired_action_settles_what_it_held(agent):
    limit(hours=1)
    first = refund(agent, 4, order="ORD-SAME")
    second = refund(agent, 5, amount="20.00", order="ORD-SAME")  # both held now, for a person
    assert Action.objects.get(pk=first.pk).status == second.status == ActionStatus.HELD
    assert all(item.expires_at is None for item in ReviewItem.objects.filter(status="open"))
    alice = person("alice", "approvers")
    review_decide(ReviewItem.objects.get(action=first, status="open"), user=alice, decision="release",
                  reason="this one first", fingerprint=first.params_fingerprint())
    approval = ReviewItem.objects.get(action=first, status="open")
    assert approval.kind == "approval" and approval.expires_at is not None

    assert approval_expire_due(now=approval.expires_at) == 1

    # Settled: what it held is looked at again (and, released from a group by a person, waits for one).
    [still] = audit_events(second, "still_held")
    assert still.reason.startswith(f"{first.operation_key}, released from this held group by a person, is expired")


def test_the_database_refuses_an_expired_action_without_its_code(agent):
    action = refund(agent, 6)
    with pytest.raises(IntegrityError), transaction.atomic():
        Action.objects.filter(pk=action.pk).update(status=ActionStatus.EXPIRED, error={"code": "rejected"})


def test_the_policy_form_takes_an_hour_to_a_year_or_blank():
    values = {"action_type": "refund", "currency": "EUR", "max_amount": "500.00", "review_deadline_hours": 4,
              "reason": "expiry"}
    assert LimitForm({**values, "approval_expires_after_hours": ""}).is_valid()
    assert LimitForm({**values, "approval_expires_after_hours": "48"}).is_valid()
    for bad in ("0", str(24 * 365 + 1)):
        form = LimitForm({**values, "approval_expires_after_hours": bad})
        assert not form.is_valid() and form.errors["approval_expires_after_hours"]
    with pytest.raises(IntegrityError), transaction.atomic():
        limit(hours=0)


def test_a_sweeper_pass_expires_what_is_due(agent):
    limit(hours=1)
    action = refund(agent, 1)
    ReviewItem.objects.filter(action=action).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert sweep_once()["approvals_expired"] == 1
    action.refresh_from_db()
    assert action.status == ActionStatus.EXPIRED


def test_a_hundred_items_that_would_be_skipped_do_not_keep_the_next_one_from_expiring(agent):
    limit(hours=1)
    waiting = refund(agent, 0)
    now = timezone.now()
    # Open approval items whose actions no longer wait (a refund under the limit, queued), due
    # before the one that waits: a pass that took the first hundred due would skip them all.
    for n in range(1, 102):
        ReviewItem.objects.create(kind="approval", action=refund(agent, n, amount="10.00"), why="left open",
                                  deadline=now, expires_at=now - timedelta(hours=2))
    ReviewItem.objects.filter(action=waiting).update(expires_at=now - timedelta(hours=1))
    assert approval_expire_due(now=now) == 1
    assert Action.objects.get(pk=waiting.pk).status == ActionStatus.EXPIRED


@pytest.mark.skipif(connection.vendor != "postgresql", reason="on SQLite the host's clock is the database's")
def test_the_window_is_stamped_on_the_database_clock_as_it_is_closed_by(agent, monkeypatch):
    """Decisions and the sweeper close the window on the database's clock (decision 57); an item
    opened on a host an hour ahead must not keep its window open an hour longer."""
    from ledger import clock

    limit(hours=6)
    host_clock_off_by(monkeypatch, 3600)
    item = ReviewItem.objects.get(action=refund(agent, 1))
    assert abs((item.expires_at - (clock.now() + timedelta(hours=6))).total_seconds()) < 60


def test_the_first_of_two_approvals_refused_after_its_window_is_told_as_by_the_check(agent, monkeypatch):
    """The first of two approvals is a row of its own: refused by the database's rule in the same
    moment's race, the person is told the window closed, not that they had approved it already."""
    limit(hours=1)
    action = refund(agent, 21)
    item = _past_its_window(ReviewItem.objects.get(action=action))
    ReviewItem.objects.filter(pk=item.pk).update(approvals_needed=2)
    item.refresh_from_db()
    monkeypatch.setattr("approvals.decisions.clock.now", lambda: item.expires_at - timedelta(seconds=1))
    with pytest.raises(AlreadyDecided, match="its approval window closed at .* it expires undecided"):
        review_decide(item, user=person("alice", "approvers"), decision="approve", reason="late",
                      fingerprint=action.params_fingerprint())
    assert not item.approvals.exists()
