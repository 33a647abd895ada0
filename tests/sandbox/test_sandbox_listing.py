"""The sandbox lists its effects by creation time, a page at a time, for reconciliation:
`since` (inclusive), `until` (exclusive), `limit`, `starting_after`, `has_more`. Bad paging
input is a 400; a listing without paging input answers as before."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from sandbox.models import SandboxMessage, SandboxRefund

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 9, 10, 3, 0, tzinfo=UTC)


def at(minutes):
    return (T0 + timedelta(minutes=minutes)).isoformat().replace("+00:00", "Z")


@pytest.fixture
def refunds(db):
    """Five refunds a minute apart from T0, two of them at the same instant (T0 + 2 min)."""
    minutes = [0, 1, 2, 2, 3]
    made = [SandboxRefund.objects.create(order_id=f"ORD-{n}", amount=Decimal("10.00"), currency="EUR",
                                         operation_key=f"k{n}", created_at=T0 + timedelta(minutes=m))
            for n, m in enumerate(minutes)]
    return [refund.refund_id for refund in made]


def ids(answer):
    return [item["id"] for item in answer.json()["data"]]


def test_it_pages_through_a_window_oldest_first_without_skipping_equal_times(sandbox, refunds):
    # Three a page: the page break falls between the two refunds made at one moment.
    seen, params = [], {"since": at(0), "until": at(60), "limit": 3}
    while True:
        answer = sandbox.get("refunds", **params)
        assert answer.status_code == 200
        seen += ids(answer)
        if not answer.json()["has_more"]:
            break
        params["starting_after"] = seen[-1]
    assert seen == refunds


def test_since_is_inclusive_and_until_exclusive(sandbox, refunds):
    assert ids(sandbox.get("refunds", since=at(1), until=at(3))) == refunds[1:4]
    assert ids(sandbox.get("refunds", since=at(3))) == refunds[4:]
    assert ids(sandbox.get("refunds", until="2026-09-10T05:02:00+02:00")) == refunds[:2]


def test_the_other_filters_still_apply_and_messages_page_alike(sandbox, refunds):
    assert ids(sandbox.get("refunds", since=at(0), operation_key="k3")) == [refunds[3]]
    message = SandboxMessage.objects.create(recipient="a@example.com", channel="email", message_type="t", body="b")
    answer = sandbox.get("messages", limit=10).json()
    assert [item["id"] for item in answer["data"]] == [message.message_id] and answer["has_more"] is False


def test_a_listing_without_paging_input_lists_everything_as_before(sandbox, refunds):
    everything = sandbox.get("refunds", limit=1000).json()["data"]
    assert sandbox.get("refunds", order_id="ORD-4").json() == {"data": [everything[4]]}


@pytest.mark.parametrize("params", [
    {"since": "yesterday"}, {"since": "2026-09-10T03:00:00"}, {"until": "2026-13-45T99:99Z"},
    {"until": "0001-01-01T00:00:00+01:00"}, {"since": "\x00"}, {"limit": "0"}, {"limit": "1001"}, {"limit": "x"},
    {"limit": "٣"}, {"starting_after": "re_nope"}, {"starting_after": "re\x00"},
])
def test_bad_paging_input_is_a_400(sandbox, refunds, params):
    answer = sandbox.get("refunds", **params)
    assert answer.status_code == 400, answer.content
    assert set(answer.json()["error"]["fields"]) == set(params)
