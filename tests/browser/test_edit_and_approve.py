"""Edit down instead of reject, in the browser: an approver lowers an over-limit refund's amount
on its review page, the edited version is approved and runs, the agent reads the approved
version through the API; a raise is refused with the reason on the page; a page left open
while the params changed refuses the decision. A limit's approval window shows on the policies
page and its Edit keeps it."""

from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from approvals.models import Limit, ReviewItem, ReviewStatus
from ledger.models import Action
from tests.browser.conftest import PASSWORD, login, request_refund, status_message
from tests.conftest import wait_until
from tests.factories import audit_events, sandbox_list

pytestmark = pytest.mark.browser

KEY = "refund:ORD-7301:full:dec-7301"


@pytest.fixture
def item(api, limit):
    """900.00 EUR against a limit of 500.00: one approver must decide."""
    assert request_refund(api, KEY, "ORD-7301", "900.00", "CUST-7301")["status"] == "awaiting_approval"
    return ReviewItem.objects.get(action__operation_key=KEY, status=ReviewStatus.OPEN)


def open_edit(page, item):
    page.goto(f"/review/{item.pk}/")
    page.locator("#edit-down summary").click()
    return page


def test_an_approver_edits_the_amount_down_and_the_agent_sees_the_approved_version(stack, page, item, api, shot):
    stack.start_worker()
    open_edit(login(page, "alice"), item)
    assert page.locator("#edit-param_amount").input_value() == "900.00"
    page.locator("#edit-param_amount").fill("400.00")
    page.locator("#edit-reason").fill("only the damaged item is refunded")
    shot(page, "edit-form")
    with page.expect_navigation():
        page.locator("#edit-button").click()

    version_key = KEY + "~v2"
    assert f"Edited into {version_key}: approved by you." in status_message(page)
    assert page.locator("#item-status").inner_text().strip() == "edited"
    assert page.locator("#action-status").inner_text().strip() == "superseded"
    assert version_key in page.locator("#edited-into").inner_text()
    shot(page, "edited")

    # The agent's GET of its original key: which version was approved, its params, and why.
    body = api.get(f"/api/v1/actions/{KEY}").json()
    assert body["status"] == "superseded" and body["params"]["amount"] == "900.00"
    assert body["superseded_by"]["operation_key"] == version_key
    assert body["superseded_by"]["params"] == {"amount": "400.00", "currency": "EUR"}
    assert (body["superseded_by"]["by"], body["superseded_by"]["reason"]) == (
        "user:alice", "only the damaged item is refunded")
    version = wait_until(lambda: (v := api.get(f"/api/v1/actions/{version_key}?wait=5").json())["status"]
                         == "succeeded" and v, message="the version to run")
    assert version["supersedes"] == KEY
    [refund] = sandbox_list(api, "refunds", order_id="ORD-7301")
    assert refund["amount"] == "400.00" and refund["id"] == version["external_ref"]
    assert [e.actor for e in audit_events(item, "edit")] == ["user:alice"]

    page.goto(f"/actions/{Action.objects.get(operation_key=version_key).pk}/")
    assert page.locator("#version-of").inner_text() == KEY
    assert page.locator("#approved-fingerprint").inner_text() == Action.objects.get(
        operation_key=version_key).params_fingerprint()
    shot(page, "version-action")
    with page.expect_navigation():
        page.locator("#version-of").click()
    assert page.locator("#superseded-by").inner_text().startswith(version_key)


def test_an_edit_that_raises_the_amount_is_refused_with_the_reason_on_the_page(page, item, shot):
    open_edit(login(page, "alice"), item)
    page.locator("#edit-param_amount").fill("1200.00")
    page.locator("#edit-reason").fill("more")
    with page.expect_navigation():
        page.locator("#edit-button").click()
    assert "Not done: the amount may not go up: 1200.00 is above 900.00" in status_message(page)
    shot(page, "edit-refused")
    item.refresh_from_db()
    assert item.status == ReviewStatus.OPEN and not Action.objects.filter(supersedes=item.action).exists()


def test_a_decision_on_a_page_opened_before_the_params_changed_is_refused(page, item, shot):
    login(page, "alice").goto(f"/review/{item.pk}/")
    Action.objects.filter(pk=item.action_id).update(params={"amount": "9000.00", "currency": "EUR"})
    page.locator("#reason").fill("looks fine")
    with page.expect_navigation():
        page.locator("#approve-button").click()
    assert "the parameters changed since you opened this page" in status_message(page)
    shot(page, "params-changed")
    item.refresh_from_db()
    assert item.status == ReviewStatus.OPEN
    assert Action.objects.get(pk=item.action_id).status == "awaiting_approval"


def test_a_limits_approval_window_is_shown_kept_by_edit_and_saved(page, people, shot):
    ada = get_user_model().objects.create_user("ada", password=PASSWORD)
    ada.groups.add(Group.objects.get(name="admins"))  # changing limits needs change_limit
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), approval_expires_after_hours=48)
    login(page, "ada").goto("/policies/")
    assert "48 h" in page.locator("#limits-table").inner_text()
    page.locator("#limits-table [data-fill-limit]").first.click()
    assert page.locator("#id_approval_expires_after_hours").input_value() == "48"  # Edit keeps the window
    page.locator("#id_max_amount").fill("600.00")
    page.locator("#id_reason").fill("a higher limit, the same window")
    shot(page, "policies-expiry")
    with page.expect_navigation():
        page.get_by_role("button", name="Save limit").click()
    limit = Limit.objects.get(action_type="refund", currency="EUR")
    assert (limit.max_amount, limit.approval_expires_after_hours) == (Decimal("600.00"), 48)
