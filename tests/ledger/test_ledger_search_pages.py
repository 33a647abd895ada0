"""The ledger search, read by content: which actions each filter finds, in which order (newest
first, equal times by id), and the keyset pages: page 2 is reached from page 1's own "Next
page" link, carries the filters, repeats nothing and leaves nothing out."""

import html
import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from console.dashboard import PAGE_SIZE
from tests.factories import make_action, make_agent

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]

START = timezone.now().replace(microsecond=0) - timedelta(days=1)


@pytest.fixture
def searcher(client):
    client.force_login(get_user_model().objects.create_superuser("root", password=None))
    return client


@pytest.fixture
def ledger():
    """PAGE_SIZE + 10 refunds of billing's, a minute apart except the last three (one moment)
    and the two either side of page one's end (another moment, so the page break falls inside a
    tie), and five of another agent's, interleaved in time; returns billing's rows newest first."""
    billing, other = make_agent("billing")[0], make_agent("other")[0]
    rows = []
    for n in range(PAGE_SIZE + 10):
        at = START + timedelta(minutes=10 if n == 9 else min(n, PAGE_SIZE + 7))
        status = "failed" if n % 7 == 0 else "succeeded"
        rows.append(make_action(billing, status, key=f"refund:ORD-{n}:dec", target=f"ORD-{n}", customer=f"CUST-{n % 3}",
                                created_at=at))
    for n in range(5):
        make_action(other, "succeeded", key=f"refund:OTHER-{n}:dec", target=f"OTHER-{n}", customer="CUST-0",
                    created_at=START + timedelta(minutes=10 * n, seconds=30))
    return sorted(rows, key=lambda a: (a.created_at, a.pk), reverse=True)


def shown(response):
    """The action ids of the result rows, in the page's order, and the page's "Next page" href."""
    assert response.status_code == 200
    page = response.content.decode()
    results = page[page.index('id="results"'):]
    ids = [int(pk) for pk in re.findall(r'<td><a class="mono" href="/actions/(\d+)/">', results)]
    following = re.search(r'href="([^"]+)" rel="next"', results)
    return ids, html.unescape(following.group(1)) if following else None


def test_an_agents_actions_come_newest_first_and_page_two_follows_from_page_ones_link(searcher, ledger):
    first, following = shown(searcher.get("/ledger/", {"agent": "billing"}))
    assert first == [a.pk for a in ledger[:PAGE_SIZE]]
    assert following.startswith("?") and "agent=billing" in following and "after=" in following

    second, beyond = shown(searcher.get("/ledger/" + following))
    assert second == [a.pk for a in ledger[PAGE_SIZE:]]
    assert beyond is None


def test_actions_created_at_one_moment_are_ordered_by_id_across_the_page_break(searcher, ledger):
    tied = [a.pk for a in ledger if a.created_at == ledger[0].created_at]
    assert len(tied) == 3 and tied == sorted(tied, reverse=True)
    first, _ = shown(searcher.get("/ledger/", {"agent": "billing"}))
    assert first[:3] == tied


@pytest.mark.parametrize("filters, wanted", [
    ({"status": "failed"}, lambda a: a.status == "failed"),
    ({"key": "refund:ORD-1"}, lambda a: a.operation_key.startswith("refund:ORD-1")),
    ({"target": "ORD-12"}, lambda a: a.target == "ORD-12"),
    ({"customer": "CUST-2"}, lambda a: a.customer == "CUST-2"),
    ({"since": (START + timedelta(minutes=20)).isoformat(), "until": (START + timedelta(minutes=30)).isoformat()},
     lambda a: START + timedelta(minutes=20) <= a.created_at < START + timedelta(minutes=30)),
])
def test_each_filter_finds_exactly_its_actions_in_order(searcher, ledger, filters, wanted):
    ids, following = shown(searcher.get("/ledger/", {"agent": "billing", **filters}))
    expected = [a.pk for a in ledger if wanted(a)]
    assert expected and ids == expected[:PAGE_SIZE] and following is None


def test_without_an_agent_every_agents_actions_are_found(searcher, ledger):
    ids, following = shown(searcher.get("/ledger/", {"customer": "CUST-0", "since": START.isoformat()}))
    assert len(ids) == len([a for a in ledger if a.customer == "CUST-0"]) + 5 and following is None


def test_an_unknown_agent_finds_nothing(searcher, ledger):
    assert shown(searcher.get("/ledger/", {"agent": "nobody"})) == ([], None)
