"""The client and the MCP server's answers without a server: a fake API (httpx.MockTransport), a
fake clock, or a socket that never answers. No database."""

import socket

import httpx
import pytest

from surety_client import SuretyClient, Unsendable
from surety_client import client as client_module
from surety_client import mcp_server

KEY = "refund:ORD-1:dec-1"


class Clock:
    """The client's clock: sleeping moves it on at once, and is recorded."""

    def __init__(self):
        self.now = 0.0
        self.pauses = []

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.pauses.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(client_module, "time", clock)
    return clock


def _action(status):
    return {"operation_key": KEY, "action_type": "refund", "target": "ORD-1", "customer": "", "decision_id": "dec-1",
            "task_id": None, "params": {"amount": "900.00", "currency": "EUR"}, "status": status, "attempts": 0,
            "external_ref": "re_1" if status == "succeeded" else None, "result": None, "error": None,
            "created_at": "2026-12-01T00:00:00Z", "updated_at": "2026-12-01T00:00:00Z", "url": f"/api/v1/actions/{KEY}",
            "review": {"url": "https://s/actions/1/", "by": None, "reason": None}
            if status == "awaiting_approval" else None, "supersedes": None, "superseded_by": None}


def fake_api(*statuses):
    """A client whose API answers the action with each status in turn (the last from then on),
    and the requests it got."""
    requests = []

    def handler(request):
        requests.append(request)
        status = statuses[min(len(requests), len(statuses)) - 1]
        return httpx.Response(201 if request.method == "POST" else 200, json=_action(status))

    client = SuretyClient("http://surety.test", "tok")
    client._http = httpx.Client(base_url="http://surety.test/api/v1/", transport=httpx.MockTransport(handler))
    return client, requests


def test_wait_for_action_waits_through_a_persons_decision_reading_every_few_seconds(clock):
    client, requests = fake_api("awaiting_approval", "awaiting_approval", "awaiting_approval", "succeeded")
    answer = mcp_server.call(client, "wait_for_action", {"operation_key": KEY, "seconds": 30}).structured_content
    assert answer["status"] == "succeeded" and answer["guidance"].startswith("Done: refund succeeded")
    assert answer["next_tool"] is None
    assert len(requests) == 4 and clock.pauses == [client_module.PERSON_INTERVAL] * 3


def test_wait_for_action_that_ran_out_of_time_says_a_person_has_still_not_decided(clock):
    client, requests = fake_api("awaiting_approval")
    answer = mcp_server.call(client, "wait_for_action", {"operation_key": KEY, "seconds": 12}).structured_content
    assert clock.now == 12 and clock.pauses == [5, 5, 2]  # bounded by the seconds asked
    assert len(requests) == 4 and all(request.method == "GET" for request in requests)
    assert answer["status"] == "awaiting_approval"
    assert "Still waiting for a person: nobody decided in the 12 s this call waited." in answer["guidance"]
    assert answer["guidance"].endswith("Dashboard: https://s/actions/1/")
    assert answer["next_tool"] == {"name": "wait_for_action", "arguments": {"operation_key": KEY}}


def test_a_shadow_action_is_recorded_not_executed_and_nothing_is_waited_for(clock):
    client, requests = fake_api("shadow")
    posted = mcp_server.call(client, "refund", {"order": "ORD-1", "amount": "900.00", "currency": "EUR",
                                                "decision_id": "dec-1"}).structured_content
    waited = mcp_server.call(client, "wait_for_action", {"operation_key": KEY}).structured_content
    for answer in (posted, waited):
        assert answer["guidance"].startswith("Shadow: recorded, not executed.")
        assert "do not retry it or wait for it" in answer["guidance"]
        assert (answer["retry"], answer["next_tool"]) == (False, None)
    assert len(requests) == 2 and clock.pauses == []


def test_a_request_that_cannot_be_sent_as_written_is_not_retried(clock):
    never_answers = socket.create_server(("127.0.0.1", 0))  # connects, then nothing: the request never goes out
    url = f"http://127.0.0.1:{never_answers.getsockname()[1]}"
    try:
        with SuretyClient(url, "tok", retries=4) as client, pytest.raises(Unsendable) as raised:
            client.post_action("refund:ORD-1:dec-7 ", action_type="refund", target="ORD-1", params={})
        assert raised.value.operation_key == "refund:ORD-1:dec-7 " and "Illegal header value" in str(raised.value)
        # Through the MCP server (a token pasted with a trailing space): a tool error, not "call again".
        with SuretyClient(url, "tok ", retries=4) as client:
            answer = mcp_server.call(client, "get_action", {"operation_key": KEY})
    finally:
        never_answers.close()
    assert answer.is_error and answer.structured_content["code"] == "unsendable"
    assert answer.structured_content["retry"] is False and "Do not retry it unchanged" in answer.structured_content[
        "guidance"]
    assert clock.pauses == []  # no backoff: nothing was tried twice
