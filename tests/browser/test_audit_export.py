"""The audit log's CSV export carries the filters on the page, and its before/after are JSON."""

import csv
import io
import json

import pytest

from ledger.models import AuditEvent
from tests.browser.conftest import login, request_refund

pytestmark = pytest.mark.browser


def test_the_export_after_an_htmx_filter_change_holds_only_the_filtered_events_as_json(page, api):
    for n in range(3):
        request_refund(api, f"refund:ORD-AX{n}:full:dec-ax{n}", f"ORD-AX{n}", "10.00", f"CUST-AX{n}")
    AuditEvent.objects.seal()  # as the sweeper would: every row then has its seq to compare by
    mine = AuditEvent.objects.filter(actor="agent:billing-bot")
    assert 0 < mine.count() < AuditEvent.objects.count()

    login(page, "aldo")
    page.goto("/audit/")
    with page.expect_response(lambda r: "/audit/?" in r.url and r.request.headers.get("hx-request")):
        page.fill("#f-actor", "agent:billing-bot")  # htmx swaps the results, no page load
    page.wait_for_function("() => document.querySelector('#csv-export').href.includes('actor=')")

    download = page.request.get(page.locator("#csv-export").get_attribute("href"))
    assert download.status == 200
    rows = list(csv.DictReader(io.StringIO(download.text())))
    assert len(rows) == mine.count()
    assert {row["actor"] for row in rows} == {"agent:billing-bot"}
    for row in rows:
        after = json.loads(row["after"]) if row["after"] else None
        before = json.loads(row["before"]) if row["before"] else None
        event = AuditEvent.objects.get(seq=row["seq"])
        assert (before, after) == (event.before, event.after)
    assert any(row["after"] for row in rows)
