"""What the decision tests share: review items in each state a person meets them in, made
with the product's own functions, and a page whose clicks, key presses and typing are counted
(the interactions a decision costs, from the overview)."""

from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

from approvals.models import Limit, ReviewItem, ReviewStatus
from ledger.actions import action_request
from ledger.executor import action_claim_next, action_run_claimed
from ledger.models import Action
from tests.factories import sandbox


def open_item(action):
    return ReviewItem.objects.get(action=action, status=ReviewStatus.OPEN)


def refund(agent, n, amount, *, order=None, customer=None, reason=None):
    """A refund requested by `agent` (in this process, as the API's intake records it)."""
    params = {"amount": amount, "currency": "EUR", **({"reason": reason} if reason else {})}
    action, _ = action_request(agent=agent, operation_key=f"refund:{order or f'ORD-D{n}'}:full:dec-d{n}",
                               action_type="refund", target=order or f"ORD-D{n}", customer=customer or f"CUST-D{n}",
                               params=params)
    return action


def dual_limit():
    """Refunds over 500.00 EUR need one approver, over 1000.00 two."""
    return Limit.limit_set(actor="system:tests", reason="the tests' policy",
                           action_type="refund", currency="EUR", max_amount=Decimal("500.00"),
                           dual_approval_above=Decimal("1000.00"))


def unknown(action, evidence=None):
    """A claimed action whose call's outcome was lost, due for verification now."""
    action.claim(owner="tests:executor")
    return action.mark_unknown(actor="system:executor", claim=action.fence, verify_at=timezone.now(),
                               evidence=evidence or {"call": "timeout", "at": timezone.now().isoformat()})


def verify(action):
    """One verification by the real executor, asking the sandbox provider over HTTP."""
    claimed = action_claim_next("tests:verifier", only=action.pk)
    assert claimed is not None, f"{action} is not due for verification"
    action_run_claimed(claimed)
    return Action.objects.get(pk=action.pk)


def effect_at_provider(api, action):
    """The refund committed at the sandbox under the action's operation key (as if the lost
    call had gone through); returns the provider's reference."""
    response = sandbox(api, "POST", "refunds", headers={"Idempotency-Key": action.operation_key},
                       json={"order_id": action.target, "amount": f"{action.amount:.2f}", "currency": action.currency,
                             "metadata": {"operation_key": action.operation_key}})
    assert response.status_code in (200, 201), response.text
    return response.json()["id"]


def needs_review_not_found(action):
    """An unknown outcome the provider could not settle: a person decides."""
    unknown(action)
    action.mark_needs_review(actor="system:verifier",
                             evidence={"lookup": "by operation key", "error": "the provider did not answer",
                                       "at": timezone.now().isoformat()})
    return open_item(action)


def same_deadline(*items):
    """Give the items one and the same deadline: the queue orders them by id then."""
    deadline = timezone.now() + timedelta(hours=1)
    ReviewItem.objects.filter(pk__in=[i.pk for i in items]).update(deadline=deadline)


class Counted:
    """A page whose person-made interactions are counted: a click, a key press or typing a
    field's text counts one each; navigation by the test itself (goto) does not."""

    def __init__(self, page):
        self.page = page
        self.count = 0

    def click(self, selector):
        self.count += 1
        self.page.locator(selector).first.click()

    def press(self, key):
        self.count += 1
        self.page.keyboard.press(key)

    def type(self, selector, text):
        self.count += 1
        self.page.locator(selector).first.fill(text)

    def answer(self, text):
        """Answer the next dialog (a prompt for a reason) with `text`: typed and accepted, one."""
        self.count += 1
        self.page.once("dialog", lambda dialog: dialog.accept(text))

    def check(self, selector):
        self.count += 1
        self.page.locator(selector).first.check()

    def navigating(self, interaction, *args):
        """An interaction that loads another page: waits for it."""
        with self.page.expect_navigation():
            interaction(*args)
