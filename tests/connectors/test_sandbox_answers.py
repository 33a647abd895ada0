"""The sandbox connector reads a write's answer as the signed-HTTP connector does: a redirect, a 408
or a 409 may come after the provider acted (a proxy in front of it, the Idempotency-Key draft's
"still being processed"), so the outcome is unknown and verified by key, not failed for good while
the effect is there. Its own 409 for a slot already booked stays a sure refusal. A stub stands in
for the sandbox: it cannot be made to answer so after committing. A task's look-up of an order
asks the sandbox itself."""

import json
from http.server import BaseHTTPRequestHandler
from types import SimpleNamespace

import pytest

from ledger.actions import action_request
from ledger.workflows import StepFailed
from ledger.workflows.refund import lookup_order
from sandbox.models import SandboxOrder
from tests.conftest import thread_server
from tests.connectors.test_signed_http import run_once
from tests.factories import make_agent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]


def provider(status, code):
    """A sandbox that makes the refund at every POST and answers it with `status`, and lists it."""
    made = []

    class Stub(BaseHTTPRequestHandler):
        def _send(self, status_line, body):
            content = json.dumps(body).encode()
            self.send_response(status_line)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(content)))
            if 300 <= status_line < 400:
                self.send_header("Location", "/sandbox/v1/refunds/re_1")
            self.end_headers()
            self.wfile.write(content)

        def do_POST(self):  # noqa: N802 (http.server's names)
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            made.append(request["metadata"]["operation_key"])
            self._send(status, {"error": {"code": code, "message": "staged"}})

        def do_GET(self):  # noqa: N802
            self._send(200, {"data": [{"id": f"re_{n}", "operation_key": key} for n, key in enumerate(made, 1)]})

        def log_message(self, format, *args):  # noqa: A002
            pass

    return Stub, made


@pytest.mark.parametrize(("status", "code"), [(409, "in_progress"), (408, "http_408"), (307, "http_307")])
def test_an_answer_that_is_no_refusal_leaves_the_outcome_unknown_and_verification_finds_the_effect(settings, status,
                                                                                                  code):
    settings.CONNECTOR_TIMEOUT = 1
    handler, made = provider(status, code)
    with thread_server(handler) as stub:
        settings.SANDBOX_BASE_URL = f"{stub.url}/sandbox/v1"
        action, _ = action_request(agent=make_agent("billing")[0], operation_key="refund:ORD-A:full:dec-1",
                                   action_type="refund", target="ORD-A", params={"amount": "25.00", "currency": "EUR"})
        action = run_once(action)
        assert (action.status, action.evidence[-1]["code"]) == ("unknown", code)
        action = run_once(action)  # verified by key: the refund is there
    assert (action.status, action.external_ref, made) == ("succeeded", "re_1", [action.operation_key])


def test_a_slot_already_booked_is_still_a_sure_refusal(settings):
    handler, made = provider(409, "slot_taken")
    with thread_server(handler) as stub:
        settings.SANDBOX_BASE_URL = f"{stub.url}/sandbox/v1"
        action, _ = action_request(agent=make_agent("booker")[0], operation_key="book:room-1:dec-1",
                                   action_type="create_booking", target="room-1", customer="CUST-1", params={
                                       "service": "repair", "start": "2027-01-04T10:00:00Z",
                                       "end": "2027-01-04T11:00:00Z"})
        action = run_once(action)
    assert (action.status, action.error["code"], action.error["retryable"]) == ("failed", "slot_taken", False)


def test_a_task_looks_up_an_order_whose_id_has_a_slash(live_server, settings):
    """The connector sends the id as one path segment ("ORD%2F1"), which the server decodes before
    routing: the order is found, and an order the sandbox does not know is still unknown."""
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox/v1"
    SandboxOrder.objects.create(order_id="ORD/1", customer="C-1", amount="10.00", currency="EUR")
    order = lookup_order(SimpleNamespace(input={"order_id": "ORD/1"}))
    assert order == {"order_id": "ORD/1", "customer": "C-1", "amount": "10.00"}
    with pytest.raises(StepFailed) as unknown:
        lookup_order(SimpleNamespace(input={"order_id": "ORD/2"}))
    assert (unknown.value.code, unknown.value.retryable) == ("unknown_order", False)
