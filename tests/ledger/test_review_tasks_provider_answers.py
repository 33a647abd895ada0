"""A provider's answer nested deeper than `ledger.json_input.storable` could walk (it recursed, two
frames a level, and `json.loads` takes about twice as deep). The refund was made and answered,
but its settle raised RecursionError: the action stayed `pending`, the task's run was counted a
crash, and every verification after the sweeper's (the provider's record as deep) failed the same
way, so the action never settled and the task was dead-lettered. `storable` walks it in a loop and
keeps DEPTH_KEPT levels, the rest marked, as near to what came as the columns allow."""

import pytest

from ledger.connectors import http
from ledger.json_input import DEEPER, DEPTH_KEPT
from ledger.models import Action, ActionStatus
from ledger.runner import drain_tasks
from ledger.tasks import task_request
from tests.factories import refund_input

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]


def nested(depth, bottom="bottom"):
    value = bottom
    for _ in range(depth):
        value = {"a": value}
    return value


def test_a_refund_answer_nested_600_levels_deep_settles_the_refund(agent, settings, monkeypatch):
    settings.DRAIN_LANES = 1

    def provider(method, url, **kwargs):
        if method == "GET":
            return {"order_id": "ORD-D", "customer": "CUST-D", "amount": "100.00"}
        return {"id": f"eff_{kwargs['headers']['Idempotency-Key']}", "detail": nested(600)}

    monkeypatch.setattr(http, "call", provider)
    task_request(agent=agent, task_id="t-deep", workflow="refund", input=refund_input("ORD-D", "CUST-D"))
    drain_tasks()

    refund = Action.objects.get(operation_key="t-deep:call_refund_api:v1")
    assert (refund.status, refund.external_ref) == (ActionStatus.SUCCEEDED, "eff_t-deep:call_refund_api:v1")
    # The answer is the first level: DEPTH_KEPT levels kept, its "detail" DEPTH_KEPT - 1 of them.
    assert refund.result["detail"] == nested(DEPTH_KEPT - 1, bottom=DEEPER)
