"""Every page of the dashboard renders with demo-like data, without a script or CSP error, and
leaves a screenshot in artifacts/screenshots/ (light, and the overview in dark mode too)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import ReviewItem, ReviewKind, ReviewStatus
from dlq.models import DeadLetter
from ledger.actions import action_request
from ledger.tasks import task_request
from tests.browser.conftest import login
from tests.factories import open_entry

pytestmark = pytest.mark.browser


def refund(agent, n, amount, *, order=None, customer=None):
    action, _ = action_request(agent=agent, operation_key=f"refund:ORD-{order or n}:full:dec-{n}", action_type="refund",
                               target=f"ORD-{order or n}", customer=customer or f"CUST-{n}", decision_id=f"dec-{n}",
                               params={"amount": amount, "currency": "EUR"})
    return action


def demo_ledger(agent):
    """A little of everything, made through the product's own functions in this process:
    succeeded, failed, awaiting approval, held, needs review, a task done and one dead-lettered."""
    for n in range(1, 4):
        done = refund(agent, 100 + n, f"{10 * n}.00")
        done.claim(owner="demo-worker")
        done.mark_succeeded(actor="system:executor", claim=done.fence, external_ref=f"re_demo_{n}",
                            result={"id": f"re_demo_{n}", "status": "succeeded"})
    declined = refund(agent, 200, "15.00")
    declined.claim(owner="demo-worker")
    declined.mark_failed(actor="system:executor", claim=declined.fence, code="declined",
                         message="the provider declined the request", retryable=False)
    over = refund(agent, 300, "750.00", customer="CUST-300")
    held = refund(agent, 500, "20.00", customer="CUST-500")
    refund(agent, 501, "25.00", order=500, customer="CUST-500")  # same order in flight: both held
    unknown = refund(agent, 400, "45.00")
    unknown.claim(owner="demo-worker")
    unknown.mark_unknown(actor="system:executor", claim=unknown.fence, verify_at=timezone.now() + timedelta(hours=1),
                         evidence={"call": "timeout", "message": "no answer within 1s"})
    unknown.mark_needs_review(actor="system:executor", evidence={"lookup": "by operation key", "error": "HTTP 503"})

    task, _ = task_request(agent=agent, task_id="refund-500", workflow="refund",
                           input={"order_id": "ORD-500", "amount": "25.00", "currency": "EUR", "customer": "CUST-500"})
    task.claim(owner="demo-worker")
    entry = open_entry(task.mark_dead_lettered(actor="system:runner", error={
        "code": "http_500", "message": "HTTP 500 from the provider", "retryable": True, "step": "call_refund_api"}))
    return {
        "approval": ReviewItem.objects.get(action=over, status=ReviewStatus.OPEN),
        "held": ReviewItem.objects.get(action=held, kind=ReviewKind.HELD, status=ReviewStatus.OPEN),
        "unknown": ReviewItem.objects.get(action=unknown, status=ReviewStatus.OPEN),
        "entry": DeadLetter.objects.get(pk=entry.pk),
        "action": over,
        "task": task,
    }


def test_a_screenshot_of_every_page_is_saved(page, people, agent, limit, shot):
    demo = demo_ledger(agent)
    visited = []

    def visit(path, name, *, ready="main h1"):
        response = page.goto(path)
        assert response.status == 200, f"{path}: {response.status}"
        page.locator(ready).first.wait_for()
        visited.append(shot(page, name))

    visit("/accounts/login/", "login", ready="#id_login")
    login(page, "alice")
    visit("/", "overview", ready="#live-counts")
    visit("/approvals/", "approvals-queue", ready=".queue-row")
    visit(f"/review/{demo['approval'].pk}/", "review-detail", ready="#decision-form")
    visit(f"/review/{demo['held'].pk}/", "review-detail-held", ready="#decision-form")
    visit("/unknown/", "unknown-outcomes", ready=".queue-row")
    visit(f"/review/{demo['unknown'].pk}/", "review-detail-unknown", ready="#decision-form")
    visit("/dlq/", "dead-letters", ready=".queue-row")
    visit(f"/dlq/{demo['entry'].pk}/", "dead-letter-detail")
    visit("/ledger/", "ledger-search")
    visit(f"/actions/{demo['action'].pk}/", "action-detail", ready="#action-status")
    visit(f"/tasks/{demo['task'].pk}/", "task-detail", ready="#task-state")
    visit("/policies/", "policies")
    visit("/delegations/", "delegations")
    visit("/agents/", "agents")
    visit("/audit/", "audit-log")

    page.emulate_media(color_scheme="dark")
    visit("/", "overview-dark", ready="#live-counts")
    page.set_viewport_size({"width": 390, "height": 844})
    visit(f"/review/{demo['approval'].pk}/", "review-detail-narrow", ready="#decision-form")

    assert all(path.stat().st_size > 5_000 for path in visited)
    assert page.console_errors == [], page.console_errors
