"""An incident from reconciliation, worked in the browser: an operator finds it in the list,
reads the evidence, takes it, adds a note and resolves it with a reason."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from dlq.incidents import Incident, IncidentStatus
from dlq.reconcile import Window, reconcile
from sandbox.models import SandboxRefund
from tests.browser.conftest import login, status_message

pytestmark = pytest.mark.browser


def test_an_operator_resolves_an_orphan_effect_from_its_page(stack, page, people, shot):
    ghost = SandboxRefund.objects.create(order_id="ORD-GHOST", amount=Decimal("80.00"), currency="EUR",
                                         operation_key="refund:ORD-GHOST:full:dec-1")
    now = timezone.now()
    assert reconcile(Window(now - timedelta(hours=1), now + timedelta(minutes=1)))["sandbox"]["opened"] == 1
    incident = Incident.objects.get()

    login(page, "olga")
    page.locator(".site-nav").get_by_role("link", name="Incidents").click()
    page.wait_for_url("**/incidents/")
    with page.expect_navigation():
        page.locator(".queue-row", has_text="ORD-GHOST").locator("a.row-link").click()
    assert page.url.endswith(f"/incidents/{incident.pk}/")
    assert ghost.refund_id in page.locator("#incident-effects").inner_text()
    assert page.locator("#no-ledger-entry").is_visible()
    shot(page, "incident-detail")

    with page.expect_navigation():
        page.locator("#take-form").get_by_role("button", name="Take it").click()
    assert page.locator("#incident-owner").inner_text().strip() == "olga"
    page.locator("#note-text").fill("not ours: a refund made by hand at the provider")
    with page.expect_navigation():
        page.locator("#note-form").get_by_role("button", name="Add note").click()
    assert "note added" in status_message(page)
    page.locator("#resolve-reason").fill("made by hand by support, ticket 8812; nothing to undo")
    with page.expect_navigation():
        page.locator("#resolve-form").get_by_role("button", name="Resolve").click()
    assert "resolved" in status_message(page)
    assert page.locator("#incident-status").inner_text().strip() == "resolved"
    assert "not ours: a refund made by hand" in page.locator("#history-title + *").inner_text()
    shot(page, "incident-resolved")
    assert not page.console_errors

    incident.refresh_from_db()
    assert incident.status == IncidentStatus.RESOLVED and incident.resolved_by == "user:olga"
