"""An approval whose window has closed waits for nobody, in the moment before the sweeper's pass
expires it: its page offers no decision (decision 25), so "waiting for me" does not count it, the
next item does not lead to it and the queue offers no Reject on its row. "Waiting for me" counted
it and the next item led to a page where nothing could be decided."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test import Client

from approvals.decisions import waiting_for
from approvals.models import Limit, ReviewItem
from ledger import clock
from ledger.actions import action_request
from tests.factories import host_clock_off_by, make_agent, person

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]


@pytest.fixture
def three():
    """Three refunds over the limit waiting for approval, in the queue's order, each with a window of
    an hour; the second one's closed a second ago, and the sweeper has not come yet."""
    Limit.limit_set(actor="system:tests", reason="policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), approval_expires_after_hours=1)
    agent = make_agent("billing-bot")[0]
    items = []
    for n in (1, 2, 3):
        action, _ = action_request(agent=agent, operation_key=f"refund:ORD-{n}:dec-{n}", action_type="refund",
                                   target=f"ORD-{n}", customer=f"C{n}", params={"amount": "750.00", "currency": "EUR"})
        items.append(ReviewItem.objects.get(action=action))
    closed(items[1], seconds_ago=1)
    return items


def closed(item, seconds_ago):
    ReviewItem.objects.filter(pk=item.pk).update(expires_at=clock.now() - timedelta(seconds=seconds_ago))
    item.refresh_from_db()


def signed_in():
    client = Client()
    client.force_login(person("alice", "approvers"))
    return client


def approval_card(client):
    return next(card for card in client.get("/").context["cards"] if card["kind"] == "approval")


def test_an_item_past_its_window_is_not_waiting_for_me_nor_the_next_item(three):
    first, past, last = three
    client = signed_in()

    page = client.get(f"/review/{past.pk}/").content.decode()
    assert 'id="window-closed"' in page and 'id="approve-button"' not in page
    card = approval_card(client)
    assert (card["count"], card["mine"]) == (3, 2)
    assert client.get(f"/review/{first.pk}/").context["next_item"] == last
    assert 'id="approve-button"' in client.get(f"/review/{last.pk}/").content.decode()  # still open: still waiting


def test_the_queue_offers_no_reject_on_the_row_of_an_item_past_its_window(three):
    first, past, last = three
    rows = signed_in().get("/approvals/").content.decode()
    assert f'data-id="{past.pk}"' in rows and f"reject-reason-{past.pk}" not in rows
    assert f"reject-reason-{first.pk}" in rows and f"reject-reason-{last.pk}" in rows


@pytest.mark.skipif(connection.vendor != "postgresql", reason="on SQLite the host's clock is the database's")
def test_the_window_is_read_on_the_database_clock_as_the_page_reads_it(three, monkeypatch):
    """On a host an hour behind the database, an item whose window closed a minute ago by the
    database's clock is open by the host's: the page offers no decision on it, so nothing counts it."""
    first, past, last = three
    closed(past, seconds_ago=60)
    host_clock_off_by(monkeypatch, -3600)
    alice = person("alice", "approvers")
    client = Client()
    client.force_login(alice)

    assert 'id="window-closed"' in client.get(f"/review/{past.pk}/").content.decode()
    assert set(ReviewItem.objects.filter(waiting_for(alice))) == {first, last}
    assert client.get(f"/review/{first.pk}/").context["next_item"] == last
