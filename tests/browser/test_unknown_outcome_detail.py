"""An unknown outcome settled by a person: the action takes the reference, its task goes on."""

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import ReviewItem, ReviewKind, ReviewStatus
from ledger.actions import action_request
from ledger.models import Action, ActionStatus, Task, TaskState
from ledger.tasks import task_request
from tests.browser.conftest import login
from tests.conftest import wait_until
from tests.factories import audit_events, sandbox_list, sandbox_order

pytestmark = pytest.mark.browser

ORDER, CUSTOMER = "ORD-UNK1", "CUST-UNK1"


def task_waiting_on_an_unknown_refund(agent):
    """A refund task whose call_refund_api action could not be proven either way: the action
    is needs_review (with its evidence), the task waits for a person. Made in this process."""
    task, _ = task_request(agent=agent, task_id="refund-unk1", workflow="refund",
                           input={"order_id": ORDER, "amount": "25.00", "currency": "EUR", "customer": CUSTOMER})
    task.claim(owner="tests:runner")
    step = task.steps.get(name="call_refund_api")
    action, _ = action_request(agent=agent, operation_key=step.idempotency_key, action_type="refund", target=ORDER,
                               customer=CUSTOMER, params={"amount": "25.00", "currency": "EUR"},
                               task=task, decision_id=task.task_id)
    action.claim(owner="tests:executor")
    action.mark_unknown(actor="system:executor", claim=action.fence, verify_at=timezone.now() + timedelta(hours=1),
                        evidence={"call": "timeout", "at": timezone.now().isoformat()})
    action.mark_needs_review(actor="system:verifier",
                             evidence={"lookup": "by operation key", "error": "the provider did not answer"})
    task.wait_for_person(claim=task.fence, reason=f"{action.operation_key} is needs_review")
    return task, action


def test_an_unknown_outcome_marked_succeeded_with_a_reference_settles_the_action_and_its_task(
        stack, page, people, agent, api, shot):
    sandbox_order(api, ORDER, CUSTOMER)
    task, action = task_waiting_on_an_unknown_refund(agent)
    item = ReviewItem.objects.get(action=action, status=ReviewStatus.OPEN)
    assert item.kind == ReviewKind.UNKNOWN_OUTCOME
    stack.start_worker()

    login(page, "alice")
    page.goto("/unknown/")
    row = page.locator(".queue-row", has_text=action.operation_key)
    shot(page, "unknown-outcomes")
    with page.expect_navigation():
        row.locator("a.row-link").click()
    assert page.url.endswith(f"/review/{item.pk}/")
    shot(page, "review-detail-unknown")
    form = page.locator("#decision-form")
    form.locator("input[name=external_ref]").fill("re_manual_1")
    form.locator("textarea[name=reason]").fill("found in the provider's dashboard")
    with page.expect_navigation():
        form.locator("button[name=decision][value=mark_succeeded]").click()

    action.refresh_from_db()
    assert (action.status, action.external_ref) == (ActionStatus.SUCCEEDED, "re_manual_1")
    item.refresh_from_db()
    assert item.status == ReviewStatus.RESOLVED and item.decided_by_label == "user:alice"
    assert page.locator("#action-status").inner_text().strip() == "succeeded"
    assert audit_events(task, "woken").exists()

    # The woken task goes on from its checkpoint with the worker; the refund is not made again.
    wait_until(lambda: Task.objects.get(pk=task.pk).state == TaskState.SUCCEEDED, seconds=20, interval=0.2,
               message="the woken task to finish")
    assert Action.objects.get(pk=action.pk).external_ref == "re_manual_1"
    assert sandbox_list(api, "refunds", order_id=ORDER) == []
    assert task.steps.get(name="write_confirmation").result["external_ref"] == "re_manual_1"
