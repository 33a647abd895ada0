"""Escalation tiers: a limit names who is alerted when a review item passes its deadline and who
next; an item still open at the second deadline alerts the next tier once and is marked
escalated, on the queue and on the overview. The policies page takes the tiers, validated, and
the database refuses a next tier without its deadline. `review_alert_overdue` is called
directly with the time it is to see (the sweeper calls it with the present)."""

import threading
from datetime import timedelta
from decimal import Decimal
from types import SimpleNamespace

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import mail
from django.db import IntegrityError, connection, transaction

from approvals.models import Limit, ReviewItem
from console.overview import review_cards
from dlq import overdue
from dlq.alerts import alert_deliver
from dlq.models import Alert
from dlq.overdue import review_alert_overdue
from ledger.actions import action_request
from tests.factories import audit_events, make_agent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]

FIRST = "desk@surety.example, lead@surety.example"
NEXT = "head-of-ops@surety.example"


def limit(**tiers):
    return Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                           max_amount=Decimal("500.00"), **tiers)


def over_limit_item(key="r1", order="ORD-1"):
    agent = make_agent(f"bot-{key}")[0]
    action, _ = action_request(agent=agent, operation_key=key, action_type="refund", target=order,
                               customer=f"CUST-{order}", params={"amount": "750.00", "currency": "EUR"})
    return ReviewItem.objects.get(action=action)


def alerts_of(item):
    return list(Alert.objects.filter(review_item=item).order_by("id"))


def delivered_to(alert):
    mail.outbox.clear()
    alert_deliver(alert.pk)
    return [message.to for message in mail.outbox]


@pytest.fixture
def tiered():
    limit(first_tier=FIRST, next_tier=NEXT, escalate_after_hours=2)
    return over_limit_item()


def test_an_overdue_item_alerts_the_first_tier_once(tiered):
    assert review_alert_overdue(now=tiered.deadline - timedelta(minutes=1)) == 0
    assert review_alert_overdue(now=tiered.deadline + timedelta(minutes=1)) == 1
    assert review_alert_overdue(now=tiered.deadline + timedelta(minutes=2)) == 0

    [alert] = alerts_of(tiered)
    assert alert.kind == Alert.Kind.OVERDUE_REVIEW and alert.subject.startswith("Overdue: ")
    assert alert.recipients == ["desk@surety.example", "lead@surety.example"]
    assert delivered_to(alert) == [["desk@surety.example", "lead@surety.example"]]


def test_without_a_first_tier_the_alert_goes_to_the_operations_group():
    limit()
    item = over_limit_item()
    review_alert_overdue(now=item.deadline + timedelta(minutes=1))

    [alert] = alerts_of(item)
    assert alert.recipients is None
    assert delivered_to(alert) == [list(settings.ALERT_EMAILS)]
    assert ReviewItem.objects.get(pk=item.pk).escalate_at is None


def test_still_open_at_the_second_deadline_it_alerts_the_next_tier_once_and_is_marked_escalated(tiered):
    review_alert_overdue(now=tiered.deadline + timedelta(minutes=1))
    item = ReviewItem.objects.get(pk=tiered.pk)
    assert item.escalate_at == tiered.deadline + timedelta(hours=2) and item.escalated_at is None

    assert review_alert_overdue(now=tiered.deadline + timedelta(hours=1, minutes=59)) == 0
    second = tiered.deadline + timedelta(hours=2, minutes=1)
    assert review_alert_overdue(now=second) == 1
    assert review_alert_overdue(now=second + timedelta(hours=5)) == 0

    item = ReviewItem.objects.get(pk=tiered.pk)
    assert item.escalated_at == second and item.is_escalated
    first, escalation = alerts_of(item)
    assert escalation.subject.startswith("Escalated: ") and escalation.recipients == [NEXT]
    assert delivered_to(escalation) == [[NEXT]]
    [event] = audit_events(item, "review_escalated")
    assert event.after["next_tier"] == [NEXT]


def test_a_sweep_that_finds_both_deadlines_past_alerts_both_tiers_in_order(tiered):
    assert review_alert_overdue(now=tiered.deadline + timedelta(hours=3)) == 2
    assert [alert.recipients for alert in alerts_of(tiered)] == [FIRST.split(", "), [NEXT]]


def test_an_item_decided_before_the_second_deadline_is_not_escalated(tiered):
    review_alert_overdue(now=tiered.deadline + timedelta(minutes=1))
    ReviewItem.objects.get(pk=tiered.pk).close(reason="settled elsewhere")

    assert review_alert_overdue(now=tiered.deadline + timedelta(hours=3)) == 0
    assert len(alerts_of(tiered)) == 1 and ReviewItem.objects.get(pk=tiered.pk).escalated_at is None


def test_an_item_decided_before_its_deadline_raises_no_alert(tiered):
    ReviewItem.objects.get(pk=tiered.pk).close(reason="settled elsewhere")
    assert review_alert_overdue(now=tiered.deadline + timedelta(hours=3)) == 0
    assert alerts_of(tiered) == []


def test_without_a_next_tier_an_item_is_never_escalated():
    limit(first_tier=FIRST)
    item = over_limit_item()
    assert review_alert_overdue(now=item.deadline + timedelta(days=300)) == 1
    assert ReviewItem.objects.get(pk=item.pk).escalated_at is None and len(alerts_of(item)) == 1


def test_a_tier_set_later_applies_to_items_opened_later():
    limit()
    before = over_limit_item("r1", "ORD-1")
    limit(next_tier=NEXT, escalate_after_hours=1)
    after = over_limit_item("r2", "ORD-2")
    review_alert_overdue(now=after.deadline + timedelta(hours=2))
    assert ReviewItem.objects.get(pk=before.pk).escalated_at is None
    assert ReviewItem.objects.get(pk=after.pk).escalated_at is not None


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="two sweepers at once need a server database")
def test_two_sweepers_at_once_raise_one_alert_per_tier(tiered):
    barrier, counts = threading.Barrier(2), []

    def sweep():
        try:
            barrier.wait()
            counts.append(review_alert_overdue(now=tiered.deadline + timedelta(hours=3)))
        finally:
            connection.close()

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(counts) == 2 and len(alerts_of(tiered)) == 2


def reopened_between_scan_and_claim(monkeypatch, item, deadline):
    """The item is reopened with a new deadline (`ReviewItem.reopen`) after the sweeper's scan
    found it, just before the sweeper claims it."""
    atomic = transaction.atomic

    def reopen_then_claim(*args, **kwargs):
        ReviewItem.objects.filter(pk=item.pk).update(deadline=deadline, overdue_alerted_at=None, escalate_at=None,
                                                     escalated_at=None)
        monkeypatch.setattr(overdue, "transaction", transaction)
        return atomic(*args, **kwargs)

    monkeypatch.setattr(overdue, "transaction", SimpleNamespace(atomic=reopen_then_claim))


def test_an_item_reopened_between_the_scan_and_the_claim_is_not_alerted_overdue(tiered, monkeypatch):
    now = tiered.deadline + timedelta(minutes=1)
    reopened_between_scan_and_claim(monkeypatch, tiered, now + timedelta(hours=4))
    assert review_alert_overdue(now=now) == 0

    item = ReviewItem.objects.get(pk=tiered.pk)
    assert alerts_of(item) == [] and item.overdue_alerted_at is None and item.escalate_at is None
    assert review_alert_overdue(now=item.deadline + timedelta(minutes=1)) == 1  # its own deadline still alerts
    assert ReviewItem.objects.get(pk=item.pk).escalate_at == item.deadline + timedelta(hours=2)


def test_an_item_reopened_between_the_scan_and_the_claim_is_not_escalated(tiered, monkeypatch):
    review_alert_overdue(now=tiered.deadline + timedelta(minutes=1))
    second = tiered.deadline + timedelta(hours=2, minutes=1)
    reopened_between_scan_and_claim(monkeypatch, tiered, second + timedelta(hours=4))
    assert review_alert_overdue(now=second) == 0

    item = ReviewItem.objects.get(pk=tiered.pk)
    assert len(alerts_of(item)) == 1 and item.escalated_at is None
    assert not audit_events(item, "review_escalated").exists()


def test_the_overview_counts_escalated_items(tiered):
    limit(first_tier=FIRST, next_tier=NEXT, escalate_after_hours=2)
    late = tiered.deadline + timedelta(hours=3)
    other, waiting = over_limit_item("r2", "ORD-2"), over_limit_item("r3", "ORD-3")
    ReviewItem.objects.filter(pk=other.pk).update(deadline=late - timedelta(hours=1))  # alerted, not escalated
    ReviewItem.objects.filter(pk=waiting.pk).update(deadline=late + timedelta(hours=1))  # not yet overdue
    review_alert_overdue(now=late)
    user = get_user_model().objects.create_superuser("root", password=None)

    [approvals] = [card for card in review_cards(user, late) if card["kind"] == "approval"]
    assert (approvals["count"], approvals["overdue"], approvals["escalated"]) == (3, 2, 1)


def test_the_overview_page_shows_the_escalated_figure(tiered, client):
    limit(first_tier=FIRST, next_tier=NEXT, escalate_after_hours=2)
    review_alert_overdue(now=tiered.deadline + timedelta(hours=3))
    client.force_login(get_user_model().objects.create_superuser("root", password=None))
    assert 'data-escalated="1">1 escalated</span>' in client.get("/").content.decode()


def test_the_queue_marks_escalated_items(tiered, client):
    other = over_limit_item("r2", "ORD-2")
    ReviewItem.objects.filter(pk=other.pk).update(deadline=tiered.deadline + timedelta(days=1))
    review_alert_overdue(now=tiered.deadline + timedelta(hours=3))
    client.force_login(get_user_model().objects.create_superuser("root", password=None))

    page = client.get("/approvals/").content.decode()
    rows = {row.split('"', 1)[0]: row for row in page.split('data-id="')[1:]}
    assert "data-escalated" in rows[str(tiered.pk)] and "data-escalated" not in rows[str(other.pk)]


def policy_post(client, **fields):
    return client.post("/policies/", {"action_type": "refund", "currency": "EUR", "max_amount": "500.00",
                                      "review_deadline_hours": "4", "reason": "tiers", **fields})


def test_the_policies_page_sets_the_tiers(client):
    client.force_login(get_user_model().objects.create_superuser("root", password=None))
    response = policy_post(client, first_tier="desk@surety.example; lead@surety.example desk@surety.example",
                           next_tier=NEXT, escalate_after_hours="6")
    assert response.status_code == 302
    saved = Limit.objects.get(action_type="refund", currency="EUR")
    assert (saved.first_tier, saved.next_tier, saved.escalate_after_hours) == (FIRST, NEXT, 6)
    assert NEXT in client.get("/policies/").content.decode()


@pytest.mark.parametrize("fields, field, message", [
    ({"first_tier": "desk at surety"}, "first_tier", "is not an e-mail address"),
    ({"next_tier": NEXT}, "escalate_after_hours", "after how many hours"),
    ({"escalate_after_hours": "3"}, "next_tier", "Name who is alerted"),
    ({"next_tier": NEXT, "escalate_after_hours": "0"}, "escalate_after_hours", "Between 1 hour and a year"),
    ({"next_tier": ", ".join(f"person-{n}@surety.example" for n in range(30))}, "next_tier", "at most 500"),
])
def test_the_policies_page_refuses_bad_tiers_with_a_reason(client, fields, field, message):
    client.force_login(get_user_model().objects.create_superuser("root", password=None))
    response = policy_post(client, **fields)
    assert response.status_code == 200
    assert message in " ".join(response.context["form"].errors[field])
    assert not Limit.objects.exists()


@pytest.mark.parametrize("fields", [{"next_tier": NEXT}, {"escalate_after_hours": 3},
                                    {"next_tier": NEXT, "escalate_after_hours": 0}])
def test_the_database_refuses_a_next_tier_without_its_deadline(fields):
    with pytest.raises(IntegrityError), transaction.atomic():
        Limit.objects.create(action_type="refund", currency="EUR", max_amount=Decimal("500.00"), **fields)
