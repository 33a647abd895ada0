"""The client and the MCP server's answers without a server: a fake API (httpx.MockTransport), a
fake clock, or a socket that never answers. No database."""

import email.utils
import os
import re
import socket
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone

import httpx
import pytest

import surety_client
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
        if self.now > 3600:  # no wait here is that long: a wait that never ends
            raise AssertionError(f"still waiting after {self.now} s")


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


@pytest.mark.parametrize("seconds", [float("nan"), float("inf")])
def test_wait_for_action_refuses_seconds_that_are_no_finite_number(clock, seconds):
    """A JSON-RPC peer may send NaN, which the schema's minimum and maximum let through: the wait's
    deadline was never reached, and it read every few seconds until a person decided."""
    client, requests = fake_api("awaiting_approval")
    answer = mcp_server.call(client, "wait_for_action", {"operation_key": KEY, "seconds": seconds})
    assert answer.is_error and answer.structured_content["code"] == "invalid"
    assert "Must be a finite number." in answer.structured_content["errors"]["seconds"]
    assert requests == [] and clock.now == 0
    with pytest.raises(ValueError, match="finite"):
        client.wait_for_outcome(KEY, timeout=seconds)


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
    finally:
        never_answers.close()
    assert clock.pauses == []  # no backoff: nothing was tried twice


SECRET = "sk_live_4f9c2e7a1b"


@pytest.mark.parametrize("token", [SECRET + "\n", SECRET + "\r\n", SECRET + " ", " " + SECRET, "sk_live\x014f9c"])
def test_a_token_http_cannot_carry_is_unsendable_and_never_repeated(clock, token):
    """A secret mounted from a file keeps its newline: httpx refused the header, and its error, which
    repeats the header's value, went into the client's message and the MCP tool's answer, the token
    with it (to a log, and into the model's context). A socket that never answers: the request is
    refused before anything is sent."""
    never_answers = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{never_answers.getsockname()[1]}"
    try:
        with SuretyClient(url, token, retries=4) as client:
            with pytest.raises(Unsendable) as raised:
                client.get_action(KEY)
            answer = mcp_server.call(client, "get_action", {"operation_key": KEY})
    finally:
        never_answers.close()
    said = "the token has whitespace at either end or a control character"
    assert said in str(raised.value) and "sk_live" not in str(raised.value)
    assert "Bearer" not in str(raised.value) and raised.value.__cause__ is None
    # Through the MCP server: a tool error, not "call again", and the token in none of its text.
    assert answer.is_error and answer.structured_content["code"] == "unsendable"
    assert answer.structured_content["retry"] is False and said in answer.structured_content["guidance"]
    assert "Do not retry it unchanged" in answer.structured_content["guidance"]
    assert "sk_live" not in answer.content[0].text and "Bearer" not in answer.content[0].text
    assert clock.pauses == []


@pytest.mark.parametrize("env, said", [
    ({"SURETY_URL": "http://surety.test", "SURETY_TOKEN": "sk_live\t4f9c2e\n"}, "SURETY_TOKEN has whitespace"),
    ({"SURETY_URL": "http://surety.test", "SURETY_TOKEN": " \n"}, "SURETY_TOKEN is not set"),
    ({"SURETY_TOKEN": SECRET}, "SURETY_URL is not set"),
    ({"SURETY_URL": " ", "SURETY_TOKEN": SECRET}, "SURETY_URL is not set"),
])
def test_the_mcp_server_does_not_start_without_its_url_or_with_a_token_http_cannot_carry(env, said):
    """Started without SURETY_URL, it called http://127.0.0.1:8000 and answered every tool call
    `unreachable`, "call again": a model looped on it. With a token HTTP cannot carry it started
    all the same, and answered each call with the token in its text. (A token's surrounding
    whitespace, a secret file's newline, is taken off: test_mcp_server.py.)"""
    others = {name: value for name, value in os.environ.items() if not name.startswith("SURETY_")}
    run = subprocess.run([sys.executable, "-m", "surety_client.mcp_server"], env={**others, **env},
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and said in run.stderr, run.stderr
    assert "sk_live" not in run.stderr + run.stdout


def scripted_api(*answers):
    """A client whose API gives each answer in turn ((status, headers, body): JSON, or a str sent as
    it is), and the requests it got."""
    requests = []

    def handler(request):
        requests.append(request)
        status, headers, body = answers[len(requests) - 1]
        return httpx.Response(status, headers=headers, **{"text" if isinstance(body, str) else "json": body})

    client = SuretyClient("http://surety.test", "tok")
    client._http = httpx.Client(base_url="http://surety.test/api/v1/", transport=httpx.MockTransport(handler))
    return client, requests


def _problem(status, code, detail="…"):
    return {"type": f"https://surety.dev/problems/{code}", "title": code, "status": status, "detail": detail,
            "code": code}


def test_a_throttled_call_waits_out_a_short_limit_itself_and_tries_once_more(clock):
    """Told "wait 3 s first", a model cannot: it called again at once, throttled again, over and over.
    The tool call waits the Retry-After out itself (at most 30 s) and tries once more."""
    throttled = (429, {"Retry-After": "3"}, _problem(429, "throttled"))
    client, requests = scripted_api(throttled, (201, {}, _action("queued")))
    answer = mcp_server.call(client, "refund", REFUND).structured_content
    assert answer["status"] == "queued" and clock.pauses == [3]
    assert [request.headers["Idempotency-Key"] for request in requests] == [KEY, KEY]
    assert requests[0].content == requests[1].content  # the same request again, its wait (0) included

    client, requests = scripted_api(throttled, throttled)
    answer = mcp_server.call(client, "get_action", {"operation_key": KEY}).structured_content
    assert (answer["code"], answer["retry"]) == ("throttled", True) and len(requests) == 2
    assert "This call waited 3 s, tried once more and was refused again" in answer["guidance"]
    assert "Tell the user Surety is busy" in answer["guidance"] and "Wait " not in answer["guidance"]
    assert clock.pauses == [3, 3]


def test_a_throttled_calls_wait_is_taken_from_its_own(clock):
    """A host stops a call after 60 s (the MCP TypeScript SDK's default), and a tool call waits up to
    30 s: a throttled call that waited its Retry-After first and then its whole wait took up to a
    minute. What it waited for the rate limit is taken from its wait. A fake API and clock: the real
    server's Retry-After is the rest of its window, not one a test can choose."""
    throttled = (429, {"Retry-After": "20"}, _problem(429, "throttled"))
    client, requests = scripted_api(throttled, *[(200, {}, _action("awaiting_approval"))] * 12)
    answer = mcp_server.call(client, "wait_for_action", {"operation_key": KEY, "seconds": 30}).structured_content
    assert answer["status"] == "awaiting_approval" and clock.now == 30 and clock.pauses == [20, 5, 5]

    clock.pauses.clear()
    client, requests = scripted_api(throttled, (200, {}, _action("queued")))
    answer = mcp_server.call(client, "refund", {**REFUND, "wait": 15}).structured_content
    assert answer["status"] == "queued" and clock.pauses == [20]  # its 15 s spent: answered as posted
    assert [request.method for request in requests] == ["POST", "POST"]


def test_a_call_throttled_partway_through_its_wait_waits_only_what_is_left_of_it(clock):
    """Refused at its fifth read, 20 s into a 30 s wait, with a Retry-After of 28 s: the call waited
    it out and then the rest of its wait, about 55 s, near a host's 60 s. It has 10 s left: it answers
    at once, and says so."""
    throttled = (429, {"Retry-After": "28"}, _problem(429, "throttled"))
    client, requests = scripted_api(*[(200, {}, _action("awaiting_approval"))] * 4, throttled)
    answer = mcp_server.call(client, "wait_for_action", {"operation_key": KEY, "seconds": 30}).structured_content
    assert answer["code"] == "throttled" and clock.now == 20 and len(requests) == 5
    assert "longer than the 10 s this call could still wait out itself, so it did not wait" in answer["guidance"]


def test_a_throttled_call_asked_to_wait_longer_or_cancelled_answers_at_once(clock):
    client, requests = scripted_api((429, {"Retry-After": "37"}, _problem(429, "throttled")))
    answer = mcp_server.call(client, "get_action", {"operation_key": KEY}).structured_content
    assert answer["code"] == "throttled" and answer["retry"] is True
    assert "Surety asked for 37 s before the next call (Retry-After)" in answer["guidance"]
    assert len(requests) == 1 and clock.pauses == []

    cancelled = threading.Event()
    cancelled.set()  # the host cancelled the call: nobody reads its answer
    client, requests = scripted_api((429, {"Retry-After": "3"}, _problem(429, "throttled")))
    answer = mcp_server.call(client, "get_action", {"operation_key": KEY}, cancelled).structured_content
    assert answer["code"] == "throttled" and len(requests) == 1

    client, requests = scripted_api((429, {}, "<html>Slow down</html>"), (200, {}, _action("queued")))
    answer = mcp_server.call(client, "get_action", {"operation_key": KEY}).structured_content
    assert answer["status"] == "queued" and clock.pauses == [mcp_server.THROTTLED_WAIT_UNSAID]


def test_a_problem_code_this_client_has_no_class_for_raises_problem_with_its_code(clock):
    """A code a later release of the API adds (what a client older than its server meets) is
    still told apart by its code, not lost in a generic error. A fake API, because this release's
    server cannot answer a code no release has yet. (The codes of the contract are raised as
    their own classes against the real server in test_client.py, currency_not_covered included;
    the 503's Retry-After is honoured against it in test_client_retries.py, a redirect refused in
    test_client.py.)"""
    client, _ = scripted_api((409, {}, _problem(409, "a_code_added_later")))
    with pytest.raises(surety_client.Problem) as raised:
        client.get_action(KEY)
    assert type(raised.value) is surety_client.Problem
    assert (raised.value.status, raised.value.code) == (409, "a_code_added_later")


def test_an_expired_key_tells_the_model_not_to_make_the_effect_again_under_a_new_decision(clock):
    """The API's detail ends "A new effect needs a new key": the model must not read that as
    "ask again under a new decision_id", which would repeat an effect that may well have happened."""
    client, _ = scripted_api((410, {}, _problem(410, "operation_key_expired", "… A new effect needs a new key.")))
    answer = mcp_server.call(client, "refund", {"order": "ORD-1", "amount": "900.00", "currency": "EUR",
                                                "decision_id": "dec-1"}).structured_content
    assert answer["code"] == "operation_key_expired" and answer["retry"] is False
    assert "Do not ask again under a new decision_id" in answer["guidance"]


@pytest.mark.parametrize("url", ["surety.example", "localhost:8000"])
def test_a_url_without_http_is_unsendable_not_unreachable(clock, url):
    """A SURETY_URL without its scheme fails the same way every time: "call again in a little
    while" would have the model retry for ever."""
    with SuretyClient(url, "tok", retries=4) as client:
        answer = mcp_server.call(client, "get_action", {"operation_key": KEY}).structured_content
    assert answer["code"] == "unsendable" and answer["retry"] is False
    assert clock.pauses == []


def test_a_task_that_stopped_because_its_decision_is_recorded_elsewhere_says_not_to_start_it_again(clock):
    """A restarted model that writes the order or decision otherwise starts a second task: its
    refund step finds the first task's refund and stops. Told only "failed", the model would take
    the refund as not done and ask again under a new decision: a second refund."""
    refund_key = "task:refund:ORD-1:dec-1:call_refund_api:v1"
    checkpoint = {"task_id": "task:refund:ORD-1 :dec-1", "workflow": "refund", "state": "failed",
                  "attempts": 1, "max_attempts": 3, "updated_at": "2026-12-01T00:00:00Z",
                  "url": "/api/v1/tasks/task%3Arefund%3AORD-1%20%3Adec-1",
                  "steps": {"lookup_order": {"status": "done"}, "call_refund_api": {"status": "failed"}},
                  "last_error": {"code": "idempotency_key_reused", "step": "call_refund_api", "retryable": False,
                                 "message": f"…: the effect is recorded outside this task, under {refund_key}"}}
    client, _ = scripted_api((201, {}, checkpoint))
    answer = mcp_server.call(client, "start_refund_task", {
        "order": "ORD-1 ", "amount": "25.00", "currency": "EUR", "customer": "CUST-1", "decision_id": "dec-1",
        "wait": 0}).structured_content
    stopped = f"It stopped at call_refund_api: idempotency_key_reused: …: the effect is recorded outside this task"
    assert f"{stopped}, under {refund_key}." in answer["guidance"]
    assert "Do not retry this decision" in answer["guidance"] and answer["next_tool"] is None


def test_a_booking_another_agent_holds_for_the_decision_is_not_to_be_made_again_at_another_time(clock):
    """booking_conflict also answers another agent's booking of the resource for this customer and
    decision: "offer another time" would have the model book the customer a second time."""
    detail = ("Another agent's booking of this resource for this customer and decision is recorded; nothing was "
              "recorded.")
    client, _ = scripted_api((409, {}, _problem(409, "booking_conflict", detail)))
    answer = mcp_server.call(client, "create_booking", {
        "resource": "ROOM-1", "customer": "CUST-1", "service": "massage", "start": "2026-12-01T10:00:00Z",
        "end": "2026-12-01T11:00:00Z", "decision_id": "dec-1"}).structured_content
    assert ("If its booking for this customer and decision is recorded by another agent, that booking stands: "
            "do not book it again") in answer["guidance"]


def keys_posted():
    """A client whose API answers 503 to everything, and the keys it was sent under."""
    posted = []

    def handler(request):
        posted.append(request.headers.get("Idempotency-Key"))
        return httpx.Response(503)

    client = SuretyClient("http://surety.test", "tok", retries=0)
    client._http = httpx.Client(base_url="http://surety.test/api/v1/", transport=httpx.MockTransport(handler))
    return client, posted


def test_a_message_type_is_an_identifier_so_a_model_calling_again_writes_the_same_key():
    """It is part of the key and of the ledger's one message per recipient, type and decision:
    "Refund confirmation" after "refund_confirmation" was a second key and a second message."""
    client, posted = keys_posted()
    base = {"recipient": "ada@example.com", "channel": "email", "body": "Your refund is on its way.",
            "decision_id": "dec-9", "wait": 0}
    mcp_server.call(client, "send_message", {**base, "message_type": "refund_confirmation"})
    refused = mcp_server.call(client, "send_message", {**base, "message_type": "Refund confirmation"})
    assert posted == ["send_message:ada@example.com:refund_confirmation:dec-9"]
    assert refused.is_error and "message_type" in refused.structured_content["errors"]


def test_a_refund_tasks_decision_is_taken_without_its_surrounding_whitespace_as_the_tool_says():
    client, posted = keys_posted()
    base = {"order": "ORD-1", "amount": "25.00", "currency": "EUR", "customer": "CUST-1", "wait": 0}
    mcp_server.call(client, "start_refund_task", {**base, "decision_id": "dec-9"})
    mcp_server.call(client, "start_refund_task", {**base, "decision_id": " dec-9 "})
    assert posted == ["task:refund:ORD-1:dec-9"] * 2


def _failed_action(retryable, code="connect_failed", **fields):
    return {**_action("failed"), "attempts": 3, "error": {"code": code, "message": "…", "retryable": retryable},
            **fields}


@pytest.mark.parametrize("retryable, when", [(True, ""), (False, " once its cause is fixed")])
def test_a_failed_action_says_nothing_was_done_and_not_to_ask_again_under_a_new_decision(clock, retryable, when):
    """Its failure opened a dead-letter entry and an alert: a person may retry it under its own key.
    Told only "Failed: connect_failed", a model asked again under a new decision_id, and the
    operator's retry of the first made a second refund."""
    client, _ = scripted_api((201, {}, _failed_action(retryable)))
    answer = mcp_server.call(client, "refund", {"order": "ORD-1", "amount": "900.00", "currency": "EUR",
                                                "decision_id": "dec-1", "wait": 0}).structured_content
    assert answer["guidance"].startswith("Failed: nothing was done (connect_failed: …). ")
    assert f"a person may retry it from the dead-letter queue{when}, under its own key" in answer["guidance"]
    assert ("Do not ask for it again under a new decision_id: once they retry it, that would be a second refund. "
            "Tell the user") in answer["guidance"]
    assert (answer["retry"], answer["next_tool"]) == (False, {"name": "wait_for_action",
                                                              "arguments": {"operation_key": KEY}})
    assert "dead-letter queue under its own key" in mcp_server.INSTRUCTIONS
    assert "Never ask for it again under a new decision_id" in mcp_server.INSTRUCTIONS


def scripted_reads(*answers):
    """A client whose API answers each read with the next body (the last from then on), and the requests."""
    requests = []

    def handler(request):
        requests.append(request)
        return httpx.Response(200, json=answers[min(len(requests), len(answers)) - 1])

    client = SuretyClient("http://surety.test", "tok")
    client._http = httpx.Client(base_url="http://surety.test/api/v1/", transport=httpx.MockTransport(handler))
    return client, requests


def test_wait_for_action_waits_through_a_failure_until_a_person_retries_it(clock):
    client, requests = scripted_reads(_failed_action(True), _failed_action(True), _action("succeeded"))
    answer = mcp_server.call(client, "wait_for_action", {"operation_key": KEY, "seconds": 30}).structured_content
    assert answer["status"] == "succeeded" and answer["guidance"].startswith("Done: refund succeeded")
    # The action alone, read three times: its error says whether a person may still retry it.
    assert [request.url.path for request in requests] == [f"/api/v1/actions/{KEY}"] * 3
    assert clock.pauses == [client_module.PERSON_INTERVAL] * 2

    client, requests = scripted_reads(_failed_action(True))
    answer = mcp_server.call(client, "wait_for_action", {"operation_key": KEY, "seconds": 12}).structured_content
    assert "It is still failed after the 12 s this call waited" in answer["guidance"]
    assert answer["next_tool"] == {"name": "wait_for_action", "arguments": {"operation_key": KEY}}
    # The client's own wait answers a failure at once, as before, unless asked to wait for a retry.
    assert client.wait_for_outcome(KEY, timeout=30).status == "failed"
    assert clock.pauses == [5, 5] + [5, 5, 2]  # the first wait's, then this one's: none after


GIVEN_UP = {"code": "declined", "message": "…", "retryable": False, "given_up": True}


@pytest.mark.parametrize("fields", [{}, {"action_type": "create_booking"}], ids=["refund", "booking"])
def test_a_failure_a_person_gave_up_is_not_waited_for_and_read_from_its_row_alone(clock, fields):
    """A declined one's error said `"retryable": false` alike while its dead-letter entry was open and
    a person could still retry it once its cause is fixed, and once a person discarded it: the
    client read the action's whole evidence record (a signed record, a request more) on every read of
    a failed action to tell them apart. The row says it now (`given_up`): one read, no evidence."""
    client, requests = scripted_reads({**_failed_action(False, **fields), "error": GIVEN_UP})
    answer = mcp_server.call(client, "wait_for_action", {"operation_key": KEY, "seconds": 30}).structured_content
    assert "Given up: a person discarded its dead-letter entry: nobody will retry it." in answer["guidance"]
    assert "asking for it again is a new decision, with a decision_id of its own" in answer["guidance"]
    assert "may retry" not in answer["guidance"] and "slot up" not in answer["guidance"]
    assert answer["next_tool"] is None and clock.pauses == []
    action = client.get_action(KEY)
    assert action.given_up and not action.redrivable and not action.done_by_hand
    assert [request.url.path for request in requests] == [f"/api/v1/actions/{KEY}"] * 2  # never its evidence
    assert "given_up" in mcp_server.INSTRUCTIONS


def test_a_failure_a_person_may_retry_is_read_without_its_evidence_record(clock):
    """Its dead-letter entry open, its error alone says a person may retry it: posted, read and
    waited for, the client asks for the action and nothing else."""
    client, requests = scripted_reads(_failed_action(False))
    posted = client.refund(order="ORD-1", amount="900.00", currency="EUR", decision_id="dec-1")
    assert posted.redrivable and client.get_action(KEY).redrivable
    assert client.wait_for_outcome(KEY, timeout=5, redrive=True).redrivable  # read, 5 s, read again
    assert [(request.method, request.url.path) for request in requests] == [
        ("POST", "/api/v1/actions"), *[("GET", f"/api/v1/actions/{KEY}")] * 3]
    assert not hasattr(surety_client, "DeadLetter")


def test_a_booking_failed_for_good_is_not_retried_and_a_tasks_step_is_its_tasks_to_retry(clock):
    booking = _failed_action(False, code="declined", action_type="create_booking")
    step = _failed_action(True, task_id="task:refund:ORD-1:dec-1")
    client, _ = scripted_api((200, {}, booking), (200, {}, step))
    given_up, of_a_task = (mcp_server.call(client, "get_action", {"operation_key": KEY}).structured_content
                           for _ in range(2))
    assert "its slot up: nobody will retry it" in given_up["guidance"] and given_up["next_tool"] is None
    assert "It is a step of task 'task:refund:ORD-1:dec-1'" in of_a_task["guidance"]
    assert of_a_task["next_tool"] == {"name": "get_task", "arguments": {"task_id": "task:refund:ORD-1:dec-1"}}


TASK_ID = "task:refund:ORD-1:dec-1"


def _stopped_task(state, code="connect_failed", retryable=True):
    return {"task_id": TASK_ID, "workflow": "refund", "state": state, "attempts": 3, "max_attempts": 3,
            "updated_at": "2026-12-01T00:00:00Z", "url": "/api/v1/tasks/…",
            "steps": {"lookup_order": {"status": "done"}, "call_refund_api": {"status": "failed"},
                      "write_confirmation": {"status": "pending"}, "notify_customer": {"status": "pending"}},
            "last_error": {"code": code, "step": "call_refund_api", "retryable": retryable, "message": "…"}}


def test_a_dead_lettered_task_says_what_its_steps_did_and_wait_for_task_waits_for_its_redrive(clock):
    client, requests = scripted_reads(_stopped_task("dead_lettered"), _stopped_task("dead_lettered"),
                                      {**_stopped_task("succeeded"), "last_error": None})
    started = mcp_server.call(client, "start_refund_task", {
        "order": "ORD-1", "amount": "25.00", "currency": "EUR", "customer": "CUST-1", "decision_id": "dec-1",
        "wait": 0}).structured_content
    assert "Its done steps (lookup_order) were carried out and stay done" in started["guidance"]
    assert "a person may redrive it from the dead-letter queue" in started["guidance"]
    assert "Do not start it again under a new decision_id" in started["guidance"]
    assert started["next_tool"] == {"name": "wait_for_task", "arguments": {"task_id": TASK_ID}}
    done = mcp_server.call(client, "wait_for_task", {"task_id": TASK_ID, "seconds": 30}).structured_content
    assert done["state"] == "succeeded" and len(requests) == 3 and clock.pauses == [client_module.PERSON_INTERVAL]


def test_a_task_failed_for_good_says_nobody_can_redrive_it_and_not_to_start_it_again(clock):
    client, requests = scripted_reads(_stopped_task("failed", code="declined", retryable=False))
    answer = mcp_server.call(client, "wait_for_task", {"task_id": TASK_ID, "seconds": 30}).structured_content
    assert "It failed for good: no retry changes it and nobody can redrive it." in answer["guidance"]
    assert "Do not start it again under a new decision_id: tell the user." in answer["guidance"]
    assert answer["next_tool"] is None and len(requests) == 1 and clock.pauses == []


@pytest.mark.parametrize("state", ["dead_lettered", "failed"])
def test_a_task_a_person_finished_by_hand_is_reported_done_and_not_waited_for(clock, state):
    """Its dead letter resolved, its state stays where its work stopped: read as waiting for a redrive,
    wait_for_task read it until its seconds ran out, and the model was told a person may redrive it."""
    done_by_hand = {**_stopped_task(state), "last_error": {**_stopped_task(state)["last_error"], "retryable": False,
                                                           "done_by_hand": True}}
    client, requests = scripted_reads(done_by_hand)
    answer = mcp_server.call(client, "wait_for_task", {"task_id": TASK_ID, "seconds": 30}).structured_content
    assert "Done by hand: a person finished this task outside Surety" in answer["guidance"]
    assert "may redrive" not in answer["guidance"] and "failed for good" not in answer["guidance"]
    assert "Do not start it again under a new decision_id or task id" in answer["guidance"]
    assert answer["next_tool"] is None and len(requests) == 1 and clock.pauses == []
    task = client.get_task(TASK_ID)
    assert task.done_by_hand and not task.redrivable


REUSED = "The key 'refund:ORD-1:dec-1' was already used for a different request; nothing was changed."
RECORDED_ELSEWHERE = ("This decision's refund is recorded under the key 'refund:ORD-1:full:dec-1' with other params; "
                      "nothing was changed. Do not retry it with other params.")


@pytest.mark.parametrize("refusal, standing", [
    (_problem(422, "idempotency_key_reused", REUSED), KEY),
    ({**_problem(422, "idempotency_key_reused", RECORDED_ELSEWHERE), "recorded_under": "refund:ORD-1:full:dec-1"},
     "refund:ORD-1:full:dec-1")])
def test_a_refused_respelling_answers_the_action_that_stands_for_the_decision(clock, refusal, standing):
    """A restarted model rewords the reason or drops the customer: refused, it was told only that,
    and nothing of the refund its first call asked for. The action stands under the key asked, or,
    recorded for the decision under another key (an older key form), under the key the answer names
    (`recorded_under`)."""
    client, requests = scripted_api((422, {}, refusal),
                                    (200, {}, {**_action("awaiting_approval"), "operation_key": standing}))
    answer = mcp_server.call(client, "refund", {"order": "ORD-1", "amount": "900.00", "currency": "EUR",
                                                "decision_id": "dec-1", "reason": "reworded"})
    assert answer.is_error and answer.structured_content["code"] == "idempotency_key_reused"
    assert [request.method for request in requests] == ["POST", "GET"]
    assert requests[1].url.raw_path.decode() == f"/api/v1/actions/{standing.replace(':', '%3A')}"
    said = answer.structured_content
    assert said["recorded"]["status"] == "awaiting_approval" and said["retry"] is False
    assert f"What stands for this decision, under {standing!r}: Awaiting approval" in said["guidance"]
    assert "nor ask for the same effect under a new decision_id" in said["guidance"]
    assert said["next_tool"] == {"name": "wait_for_action", "arguments": {"operation_key": standing}}


def test_a_refused_task_answers_the_task_that_stands_and_another_agents_key_only_the_refusal(clock):
    client, requests = scripted_api(
        (422, {}, _problem(422, "idempotency_key_reused", f"The key {TASK_ID!r} was already used for a different "
                                                          "request; nothing was changed.")),
        (200, {}, _stopped_task("dead_lettered")),
        (422, {}, _problem(422, "idempotency_key_reused", REUSED)),
        (404, {}, _problem(404, "not_found", "No such action.")))
    task = mcp_server.call(client, "start_refund_task", {
        "order": "ORD-1", "amount": "25.00", "currency": "EUR", "customer": "CUST-1", "decision_id": "dec-1",
        "wait": 0}).structured_content
    assert requests[1].url.path == f"/api/v1/tasks/{TASK_ID}" and task["recorded"]["state"] == "dead_lettered"
    assert task["next_tool"] == {"name": "wait_for_task", "arguments": {"task_id": TASK_ID}}
    others = mcp_server.call(client, "refund", {"order": "ORD-1", "amount": "900.00", "currency": "EUR",
                                                "decision_id": "dec-1"}).structured_content
    assert "recorded" not in others and others["next_tool"] is None
    assert others["guidance"].startswith(f"Refused (idempotency_key_reused): {REUSED} This decision is already")


def test_a_refusal_names_the_key_its_decisions_effect_is_recorded_under():
    named = {**_problem(422, "idempotency_key_reused", RECORDED_ELSEWHERE), "recorded_under": 'refund:say "hi":dec-1'}
    problem = surety_client.errors.problem_from(422, named, operation_key="refund:ORD-1:full:dec-1")
    assert problem.recorded_key == 'refund:say "hi":dec-1'
    problem = surety_client.errors.problem_from(422, _problem(422, "idempotency_key_reused", REUSED),
                                                operation_key="refund:ORD-1:full:dec-1")
    assert problem.recorded_key == "refund:ORD-1:full:dec-1"


def test_the_arguments_a_decision_is_fingerprinted_by_say_to_write_them_the_same_every_time():
    same = "write it the same on every call for this decision"
    for tool, argument in [("refund", "reason"), ("refund", "customer"), ("send_message", "body"),
                           ("send_message", "customer"), ("start_refund_task", "reason"),
                           ("start_refund_task", "customer"), ("start_refund_task", "notify")]:
        assert same in mcp_server.TOOLS[tool].input_schema["properties"][argument]["description"], (tool, argument)


SIGN_IN = "<html><body>Sign in to continue</body></html>"


@pytest.mark.parametrize("body", [SIGN_IN, {"status": "ok"}, ["not", "an", "object"]])
def test_a_2xx_answer_that_is_not_the_apis_is_unreadable_with_the_key_it_may_be_recorded_under(clock, body):
    """An SSO or maintenance page, or SURETY_URL pointing elsewhere, answers 200: the client raised
    JSONDecodeError or KeyError, and the MCP server gave the model no answer at all."""
    html = {"Content-Type": "text/html"} if isinstance(body, str) else {}
    client, requests = scripted_api((200, html, body), (200, html, body), (200, html, body))
    answer = mcp_server.call(client, "refund", {"order": "ORD-1", "amount": "900.00", "currency": "EUR",
                                                "decision_id": "dec-1"})
    assert not answer.is_error and answer.structured_content["code"] == "unreadable"  # "call again": no error
    assert answer.structured_content["retry"] is True and len(requests) == 1  # not retried by the client
    assert f"may have been recorded under {KEY!r}" in answer.structured_content["guidance"]
    assert "Make the same call again in a little while, with the same decision_id" in answer.structured_content[
        "guidance"]

    with pytest.raises(surety_client.Unreadable) as raised:
        client.refund(order="ORD-1", amount="900.00", currency="EUR", decision_id="dec-1")
    assert raised.value.operation_key == KEY
    assert f"may have been recorded under {KEY!r}; send it again with the same key" in str(raised.value)
    with pytest.raises(surety_client.Unreadable) as raised:
        client.get_action(KEY)
    assert raised.value.operation_key is None and "may have been recorded" not in str(raised.value)


def test_a_refund_tasks_order_is_taken_without_its_surrounding_whitespace_as_the_api_takes_it():
    """"ORD-1 " after "ORD-1" was a second task, which failed at its refund step and paged operations."""
    client, posted = keys_posted()
    base = {"amount": "25.00", "currency": "EUR", "customer": "CUST-1", "decision_id": "dec-9", "wait": 0}
    mcp_server.call(client, "start_refund_task", {**base, "order": "ORD-1"})
    mcp_server.call(client, "start_refund_task", {**base, "order": " ORD-1 "})
    assert posted == ["task:refund:ORD-1:dec-9"] * 2


REFUND = {"order": "ORD-1", "amount": "25.00", "currency": "EUR", "decision_id": "dec-1", "wait": 0}


def test_an_answer_that_says_make_the_same_call_again_is_a_result_not_a_tool_error(clock):
    """An agent framework counts each tool error against the tool's retry budget and ends the run when
    it runs out (pydantic-ai's is 1 by default): a model told `unreachable`, `throttled` or `unreadable`
    as a tool error, that did as told and called again, was stopped the second time. A refusal not to
    be repeated as it is stays a tool error. A fake API: a 503 for every request, a 429, a sign-in page."""
    away, _ = keys_posted()
    client, _ = scripted_api((429, {"Retry-After": "45"}, _problem(429, "throttled")),
                             (200, {"Content-Type": "text/html"}, SIGN_IN),
                             (404, {}, _problem(404, "not_found", "No such action.")))
    answers = [mcp_server.call(away, "refund", REFUND)] + [
        mcp_server.call(client, "get_action", {"operation_key": KEY}) for _ in range(3)]
    said = [(answer.is_error, answer.structured_content["code"], answer.structured_content["retry"])
            for answer in answers]
    assert said == [(False, "unreachable", True), (False, "throttled", True), (False, "unreadable", True),
                    (True, "not_found", False)]
    assert answers[0].structured_content["guidance"].startswith("Refused (unreachable): ")
    assert "Make the same call again, with the same decision_id" in answers[0].structured_content["guidance"]
    # It cannot wait "a little while": told so, a model called again at once, for ever.
    assert ("if it answers alike, do not keep calling: tell the user Surety cannot be reached now"
            in answers[0].structured_content["guidance"])


STEP_KEY = "task:refund:ORD-1:dec-1:call_refund_api:v1"
EXPIRED = {"error": {"code": "approval_expired", "message": "nobody decided", "retryable": False},
           "review": {"url": "https://s/actions/1/", "by": "system:approvals", "reason": "approval window passed"}}


def _step_action(status, **fields):
    return {**_action(status), "operation_key": STEP_KEY, "customer": "CUST-1", "task_id": TASK_ID, **fields}


@pytest.mark.parametrize("standing, asks_again", [(_step_action("expired", **EXPIRED), False),
                                                  ({**_action("expired"), **EXPIRED}, True)])
def test_a_refusal_and_the_expired_action_that_stands_say_the_same(clock, standing, asks_again):
    """Refused as written otherwise, with an expired action standing for the decision: the refusal said
    never to ask under a new decision_id, the expired action to ask under one, in one guidance. A
    standalone expired action did nothing and nothing will run it: its guidance says a new decision may
    ask for it, and the refusal leaves that to it; a task's step says not to. A fake API."""
    client, _ = scripted_api((422, {}, {**_problem(422, "idempotency_key_reused", REUSED),
                                        "recorded_under": standing["operation_key"]}),
                             (200, {}, standing))
    guidance = mcp_server.call(client, "refund", REFUND).structured_content["guidance"]
    refusal, what_stands = guidance.split(" What stands for this decision, under ")
    assert "nor ask for the same effect under a new decision_id" in refusal
    assert "unless what stands for it expired, doing nothing, and its guidance says to ask again" in refusal
    assert ("If the decision still stands, ask again under a new decision_id." in what_stands) is asks_again


def test_a_body_that_cannot_be_decoded_is_unreadable_with_the_key_it_may_be_recorded_under(clock):
    """A proxy's broken Content-Encoding: httpx raised DecodingError (no TransportError), out of the
    client as no SuretyError and out of the MCP tool with no guidance, though the POST may be recorded.
    A fake API answers it."""
    def handler(request):
        return httpx.Response(201, headers={"Content-Encoding": "gzip"}, content=b"not gzip at all")

    client = SuretyClient("http://surety.test", "tok")
    client._http = httpx.Client(base_url="http://surety.test/api/v1/", transport=httpx.MockTransport(handler))
    with pytest.raises(surety_client.Unreadable) as raised:
        client.refund(order="ORD-1", amount="25.00", currency="EUR", decision_id="dec-1")
    assert raised.value.operation_key == KEY
    assert f"may have been recorded under {KEY!r}; send it again with the same key" in str(raised.value)
    answer = mcp_server.call(client, "refund", REFUND)
    assert answer.structured_content["code"] == "unreadable" and answer.structured_content["retry"] is True
    assert clock.pauses == []  # not retried: a proxy that breaks it answers alike


def test_a_key_or_token_that_is_no_ascii_is_unsendable(clock):
    """HTTP headers are ASCII: a key of one's own or a token with "é" raised a bare UnicodeEncodeError
    (the token's, from the client's constructor). Nothing is sent."""
    client, posted = keys_posted()
    with pytest.raises(Unsendable) as raised:
        client.post_action("refund:ORD-1:décision", action_type="refund", target="ORD-1", params={})
    assert raised.value.operation_key == "refund:ORD-1:décision"
    with SuretyClient("http://surety.test", "tök", retries=4) as client:
        answer = mcp_server.call(client, "get_action", {"operation_key": KEY})
    assert answer.is_error and answer.structured_content["code"] == "unsendable"
    assert answer.structured_content["retry"] is False and posted == [] and clock.pauses == []


def test_the_parts_of_a_key_say_to_write_them_the_same_every_time():
    """The order, recipient, resource and a booking's customer are part of the key, and the ledger keeps
    their case: "ord-1" after "ORD-1" is another key."""
    for tool, argument in [("refund", "order"), ("start_refund_task", "order"), ("send_message", "recipient"),
                           ("create_booking", "resource"), ("create_booking", "customer")]:
        description = mcp_server.TOOLS[tool].input_schema["properties"][argument].get("description", "")
        assert "write it the same on every call" in description, (tool, argument)


def test_a_proxys_rate_limit_is_throttled_not_a_refusal(clock):
    """A gateway in front of Surety answers 429 with a page of its own, no problem: it was read as a
    refusal (code `error`, `retry: false`), and the model told not to retry what only had to wait.
    A fake API stands in for the gateway."""
    def handler(request):
        return httpx.Response(429, headers={"Retry-After": "3", "Content-Type": "text/html"},
                              content=b"<html>Too Many Requests</html>")

    client = SuretyClient("http://surety.test", "tok")
    client._http = httpx.Client(base_url="http://surety.test/api/v1/", transport=httpx.MockTransport(handler))
    with pytest.raises(surety_client.Throttled):
        client.refund(order="ORD-1", amount="25.00", currency="EUR", decision_id="dec-1")
    answer = mcp_server.call(client, "refund", REFUND).structured_content
    assert (answer["code"], answer["retry"]) == ("throttled", True)
    assert "Surety asked for 3 s before the next call" in answer["guidance"] and clock.pauses == [3]


@pytest.mark.parametrize("body", [{"code": 429, "message": "Too Many Requests"},
                                  {"code": "rate_limited", "message": "API rate limit exceeded"},
                                  {"code": ["quota"], "message": "Quota exceeded"}])
def test_a_proxys_rate_limit_with_a_code_of_its_own_is_throttled_not_a_refusal(clock, body):
    """A gateway's JSON that has a `code` of its own is no problem of the API's: its code was taken
    for the API's, and the model was told not to retry (an unknown code) or given no answer at all
    (a code that is no string). A fake API stands in for the gateway."""
    client, _ = scripted_api(*[(429, {"Retry-After": "3"}, body)] * 3)
    with pytest.raises(surety_client.Throttled) as raised:
        client.get_action(KEY)
    assert raised.value.retry_after == 3 and raised.value.code == "throttled"
    answer = mcp_server.call(client, "refund", REFUND)  # waited out, tried once more
    assert not answer.is_error
    assert (answer.structured_content["code"], answer.structured_content["retry"]) == ("throttled", True)
    assert "Surety asked for 3 s before the next call (Retry-After)" in answer.structured_content["guidance"]


def test_a_proxys_retry_after_written_as_a_date_is_the_wait_it_names(clock):
    """HTTP lets Retry-After be a date, as a gateway may write it: the model was told to wait, but
    not how long."""
    later = email.utils.format_datetime(datetime.now(timezone.utc) + timedelta(seconds=120), usegmt=True)
    client, _ = scripted_api((429, {"Retry-After": later, "Content-Type": "text/html"}, "<html>Slow down</html>"))
    answer = mcp_server.call(client, "refund", REFUND).structured_content
    assert (answer["code"], answer["retry"]) == ("throttled", True)
    # The date is to the second; longer than a call waits, it is answered at once.
    assert re.search(r"Surety asked for 1(19|20) s before the next call \(Retry-After\)", answer["guidance"])


DONE_BY_HAND = {"code": "declined", "message": "…", "retryable": False, "done_by_hand": True}


@pytest.mark.parametrize("fields, what", [({"action_type": "create_booking"}, "create_booking"),
                                          ({"task_id": TASK_ID}, "refund")])
def test_a_booking_or_a_tasks_step_done_by_hand_is_reported_done_not_given_up_or_retried(clock, fields, what):
    """A booking done by hand keeps its slot, and a task's step done by hand is its task's, finished by
    hand too: told "it gave its slot up" or "its task retries it", the model would book or refund again."""
    client, _ = scripted_api((200, {}, {**_failed_action(False, **fields), "error": DONE_BY_HAND}))
    answer = mcp_server.call(client, "get_action", {"operation_key": KEY}).structured_content
    assert answer["guidance"].startswith(f"Done by hand: a person made this {what} outside Surety")
    assert "slot up" not in answer["guidance"] and "retries it" not in answer["guidance"]
    assert "Do not ask for it again, under this decision or a new decision_id" in answer["guidance"]
    assert ("which a person finished by hand too" in answer["guidance"]) is ("task_id" in fields)
    assert answer["next_tool"] is None  # get_task would tell of a dead-lettered task to wait for
    assert "done_by_hand" in mcp_server.INSTRUCTIONS


@pytest.mark.parametrize("errors, said", [
    (["amount must be positive"], {"arguments": ["amount must be positive"]}),
    ("amount must be positive", {"arguments": ["amount must be positive"]}),
    ({"params.amount": "must be positive", "target": ["too long"]}, {"amount": ["must be positive"],
                                                                     "order": ["too long"]}),
])
def test_a_problems_errors_that_are_no_fields_lists_are_kept_as_messages(clock, errors, said):
    """A proxy or a later release answers `errors` as a list or a string: the MCP server's naming of
    fields by argument took it for a dict of lists and the tool call failed with no guidance."""
    client, _ = scripted_api(*[(400, {}, {**_problem(400, "invalid"), "errors": errors})] * 2)
    with pytest.raises(surety_client.Invalid) as raised:
        client.get_action(KEY)
    assert all(isinstance(messages, list) for messages in raised.value.errors.values())
    answer = mcp_server.call(client, "refund", REFUND).structured_content
    assert answer["code"] == "invalid" and answer["errors"] == said
    assert answer["guidance"].startswith("Refused (invalid): ")


@pytest.mark.parametrize("fields, retried_by", [({}, "a person may retry it from the dead-letter queue"),
                                                ({"task_id": TASK_ID}, "which retries it")])
def test_a_failure_a_rate_limited_provider_caused_says_how_long_before_a_retry(clock, fields, retried_by):
    """Its error's `retry_after` is the seconds the provider asked to be left alone for: a retry sooner
    fails alike, and the guidance, saying who retries it, said nothing of when."""
    failed = _failed_action(True, code="rate_limited", **fields)
    client, _ = scripted_api((200, {}, {**failed, "error": {**failed["error"], "retry_after": 30}}))
    guidance = mcp_server.call(client, "get_action", {"operation_key": KEY}).structured_content["guidance"]
    assert (f"{retried_by} (not before 30 s after it failed: the provider was rate-limited and asked to be left "
            "alone that long)") in guidance


def test_the_decision_id_is_to_be_derived_from_the_conversation_never_made_up():
    """Nothing told the model how to choose its decision_id: one made up at random, from the time or
    from a counter comes out otherwise after a restart, another decision, and a second refund."""
    for told in (mcp_server.TOOLS["refund"].input_schema["properties"]["decision_id"]["description"],
                 mcp_server.TOOLS["start_refund_task"].input_schema["properties"]["decision_id"]["description"],
                 mcp_server.INSTRUCTIONS):
        assert "Derive it from an identifier the conversation gives and what is decided" in told
        assert "never a random id, a time or a counter" in told
