"""A provider's answer nested deeper than `ledger.json_input.storable` could walk (it recursed, two
frames a level, and `json.loads` takes about twice as deep). The refund was made and answered,
but its settle raised RecursionError: the action stayed `pending`, the task's run was counted a
crash, and every verification after the sweeper's (the provider's record as deep) failed the same
way, so the action never settled and the task was dead-lettered. `storable` keeps DEPTH_KEPT
levels, the rest marked, as near to what came as the columns allow. The provider answers over
real HTTP, as the connector reads any."""

import json
from http.server import BaseHTTPRequestHandler

import pytest

from ledger.json_input import DEEPER, DEPTH_KEPT
from ledger.models import Action, ActionStatus
from ledger.runner import drain_tasks
from ledger.tasks import task_request
from tests.conftest import thread_server
from tests.factories import refund_input

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]


def nested(depth, bottom="bottom"):
    value = bottom
    for _ in range(depth):
        value = {"a": value}
    return value


class DeepProvider(BaseHTTPRequestHandler):
    """The sandbox's wire format over HTTP: the order the workflow reads, and a refund answered with
    its effect's id and a "detail" 600 levels deep."""

    def _send(self, answer):
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 (http.server's names)
        self._send({"order_id": "ORD-D", "customer": "CUST-D", "amount": "100.00"})

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send({"id": f"eff_{self.headers['Idempotency-Key']}", "detail": nested(600)})

    def log_message(self, format, *args):  # noqa: A002
        pass


def test_a_refund_answer_nested_600_levels_deep_settles_the_refund(agent, settings):
    settings.DRAIN_LANES = 1
    with thread_server(DeepProvider) as provider:
        settings.SANDBOX_BASE_URL = f"{provider.url}/sandbox/v1"
        task_request(agent=agent, task_id="t-deep", workflow="refund", input=refund_input("ORD-D", "CUST-D"))
        drain_tasks()

    refund = Action.objects.get(operation_key="t-deep:call_refund_api:v1")
    assert (refund.status, refund.external_ref) == (ActionStatus.SUCCEEDED, "eff_t-deep:call_refund_api:v1")
    # The answer is the first level: DEPTH_KEPT levels kept, its "detail" DEPTH_KEPT - 1 of them.
    assert refund.result["detail"] == nested(DEPTH_KEPT - 1, bottom=DEEPER)
