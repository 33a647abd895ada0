"""The policy what-if in a browser: change a limit, preview it over the real actions (counts and
examples), fix a bad value, save with a reason; the audit event holds the preview shown."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils import timezone

from approvals.models import Limit
from ledger.models import AuditEvent
from tests.browser.conftest import PASSWORD, login, status_message
from tests.factories import make_action, make_agent

pytestmark = pytest.mark.browser


@pytest.fixture
def ada(people):
    """An admin: changing limits needs the change_limit permission."""
    user = get_user_model().objects.create_user("ada", password=PASSWORD, email="ada@surety.example")
    user.groups.add(Group.objects.get(name="admins"))
    return user


@pytest.fixture
def refunds(stack, limit):
    """Refunds of 100, 300 and 600 EUR today: under the 500 limit only the 600 one waits."""
    agent, _ = make_agent("refunds-bot")
    return {amount: make_action(agent, "succeeded", key=f"refund:ORD-W{n}:full", target=f"ORD-W{n}", amount=amount,
                                customer="CUST-W", created_at=timezone.now() - timedelta(minutes=n))
            for n, amount in enumerate(["100.00", "300.00", "600.00"])}


def test_a_limit_change_is_previewed_then_saved_with_its_preview(page, ada, refunds, shot):
    login(page, "ada")
    page.goto("/policies/")
    page.locator("#limits-table [data-fill-limit]").first.click()  # Edit: the form takes refund EUR's values
    assert page.locator("#id_max_amount").input_value() == "500.000"

    page.fill("#id_dual_approval_above", "50")  # below the maximum: the form's own error
    page.locator("#whatif-preview").click()
    page.locator("#whatif-errors").wait_for()
    assert "Must be at least the maximum amount." in page.locator("#whatif-errors").inner_text()

    page.fill("#id_dual_approval_above", "")
    page.fill("#id_max_amount", "200")
    page.locator("#whatif-preview").click()
    page.locator("#whatif-counts").wait_for()
    waiting = page.locator('#whatif-counts tr[data-row="waiting"] td').all_inner_texts()
    assert waiting == ["1", "2", "+1"]  # the 600 one under 500; the 300 and 600 ones under 200
    examples = page.locator("#whatif-examples tbody tr")
    assert examples.count() == 1
    assert "300.00 EUR is above the limit of 200.00" in examples.first.inner_text()
    assert examples.first.locator("a").get_attribute("href") == f"/actions/{refunds['300.00'].pk}/"
    assert Limit.objects.get().max_amount == Decimal("500")  # a preview saves nothing
    shot(page, "policies-whatif")

    page.fill("#id_reason", "large refunds are rising: look at more of them")
    with page.expect_navigation():
        page.get_by_role("button", name="Save limit").click()
    assert "Limit for refund EUR saved" in status_message(page)
    assert Limit.objects.get().max_amount == Decimal("200")
    preview = AuditEvent.objects.filter(verb="limit_set").order_by("id").last().after["preview"]
    assert preview["shown"] is True and preview["days"] == 30
    assert (preview["counts"]["current_waiting"], preview["counts"]["proposed_waiting"]) == (1, 2)
    assert not page.console_errors, page.console_errors  # the CSP refused nothing
    shot(page, "policies-saved")


def test_without_a_preview_the_form_still_saves_and_records_one(page, ada, refunds):
    login(page, "ada")
    page.goto("/policies/")
    page.locator("#limits-table [data-fill-limit]").first.click()
    page.fill("#id_max_amount", "50")
    page.fill("#id_reason", "no preview asked")
    with page.expect_navigation():
        page.get_by_role("button", name="Save limit").click()
    preview = AuditEvent.objects.filter(verb="limit_set").order_by("id").last().after["preview"]
    assert preview["shown"] is False and preview["counts"]["proposed_waiting"] == 3


def test_a_first_limit_is_previewed_with_the_currencies_it_leaves_uncovered(page, ada, stack):
    """No refund limit yet: refund GBP's would make every USD refund wait for a person, and the
    preview says how many of the window's would have, before Save limit."""
    agent, _ = make_agent("refunds-bot")
    for n in range(3):
        make_action(agent, "succeeded", key=f"refund:ORD-U{n}:full", target=f"ORD-U{n}", amount="10.00",
                    currency="USD", customer="CUST-U")
    login(page, "ada")
    page.goto("/policies/")
    page.select_option("#id_action_type", "refund")
    page.fill("#id_currency", "GBP")
    page.fill("#id_max_amount", "500")
    page.locator("#whatif-preview").click()
    warning = page.locator("#whatif-uncovered")
    warning.wait_for()
    assert "This is the first refund limit" in warning.inner_text()
    assert "3 refunds in USD would have waited for a person." in warning.inner_text()
    assert not page.console_errors, page.console_errors
