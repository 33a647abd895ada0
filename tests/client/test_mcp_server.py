"""The MCP server over stdio, driven by the MCP SDK's own client, against the live server."""

import json
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from decimal import Decimal
from functools import partial

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from mcp.shared.memory import create_client_server_memory_streams

from approvals.decisions import review_decide
from approvals.models import Limit, ReviewItem
from approvals.reviews import approval_expire_due
from dlq.entries import deadletter_discard, deadletter_redrive, deadletter_resolve
from dlq.models import DeadLetter
from ledger.models import Action, Booking, Task
from surety_client import SuretyClient, mcp_server
from surety_client import client as client_module
from tests.conftest import free_port, wait_until
from tests.factories import api_client, make_agent, person, sandbox, sandbox_list, sandbox_order, settled

pytestmark = pytest.mark.django_db(transaction=True)


@asynccontextmanager
async def served(client, **session_options):
    """A host's MCP session (`ClientSession`, initialized) with the server serving `client`, over
    memory streams, in this event loop."""
    async with create_client_server_memory_streams() as (client_streams, server_streams), \
            anyio.create_task_group() as server_running:
        server = mcp_server.build_server(client)
        server_running.start_soon(partial(server.run, *server_streams, server.create_initialization_options()))
        async with ClientSession(*client_streams, **session_options) as mcp:
            await mcp.initialize()
            yield mcp
        server_running.cancel_scope.cancel()


@pytest.fixture
def token(stack):
    return make_agent("mcp-bot")[1]


def over_mcp(url, token, *calls):
    """Start the MCP server as an agent's host would, make `calls` ((tool, arguments) or
    "list"), return their results in order."""
    async def session():
        server = StdioServerParameters(command=sys.executable, args=["-m", "surety_client.mcp_server"],
                                       env={"SURETY_URL": url, "SURETY_TOKEN": token})
        async with stdio_client(server) as (read, write), ClientSession(read, write) as mcp:
            await mcp.initialize()
            return [await mcp.list_tools() if call == "list" else await mcp.call_tool(*call) for call in calls]

    # On a thread of its own: a browser test before this one in the same worker leaves
    # Playwright's asyncio loop running on the main thread, and anyio will not nest in it.
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(anyio.run, session).result()


def guidance_of(result):
    """The answer's guidance, after checking the answer has the specification's shape: its one
    text block is the structured content serialized, so a host passing either passes the guidance."""
    assert [block.type for block in result.content] == ["text"]
    assert json.loads(result.content[0].text) == result.structured_content
    return result.structured_content["guidance"]


def test_it_lists_a_tool_per_action_type_and_workflow_with_the_apis_input_rules(stack, token):
    (listed,) = over_mcp(stack.url, token, "list")
    tools = {tool.name: tool for tool in listed.tools}
    assert set(tools) == {"refund", "send_message", "create_booking", "start_refund_task", "get_action",
                          "wait_for_action", "get_task", "wait_for_task"}
    refund = tools["refund"].input_schema
    assert refund["required"] == ["order", "amount", "currency", "decision_id"]
    assert refund["properties"]["amount"]["type"] == "string" and refund["additionalProperties"] is False


def test_a_refund_call_becomes_one_keyed_action_and_answers_its_outcome(stack, token):
    stack.start_worker()
    arguments = {"order": "ORD-M1", "amount": "25.00", "currency": "EUR", "decision_id": "dec-m1", "wait": 20}
    first, again = over_mcp(stack.url, token, ("refund", arguments), ("refund", arguments))
    assert not first.is_error and first.structured_content["status"] == "succeeded", guidance_of(first)
    assert first.structured_content["operation_key"] == "refund:ORD-M1:dec-m1"
    assert guidance_of(first).startswith("Done: refund succeeded")
    assert (first.structured_content["retry"], first.structured_content["next_tool"]) == (False, None)
    assert again.structured_content["replayed"] is True and "nothing was done again" in guidance_of(again)
    assert Action.objects.filter(target="ORD-M1").count() == 1


def test_an_over_limit_refund_answers_awaiting_approval_with_a_link_and_then_the_rejection_reason(stack, token):
    Limit.limit_set(actor="system:tests", reason="the tests' policy",
                    action_type="refund", currency="EUR", max_amount=Decimal("500.00"))
    arguments = {"order": "ORD-M2", "amount": "900.00", "currency": "EUR", "decision_id": "dec-m2"}
    (waiting,) = over_mcp(stack.url, token, ("refund", arguments))
    action = Action.objects.get(target="ORD-M2")
    assert not waiting.is_error and waiting.structured_content["status"] == "awaiting_approval"
    assert guidance_of(waiting).startswith("Awaiting approval")
    assert f"Dashboard: {stack.url}/actions/{action.pk}/" in guidance_of(waiting)
    assert f"wait_for_action with operation_key='{action.operation_key}'" in guidance_of(waiting)
    assert waiting.structured_content["next_tool"] == {"name": "wait_for_action",
                                                       "arguments": {"operation_key": action.operation_key}}

    reviewer = person("rita", "approvers")
    review_decide(ReviewItem.objects.get(action=action), user=reviewer, decision="reject", reason="refunded by phone")
    (decided,) = over_mcp(stack.url, token, ("wait_for_action", {"operation_key": action.operation_key}))
    assert decided.structured_content["status"] == "rejected"
    assert guidance_of(decided) == "Rejected by user:rita: refunded by phone. Do not retry this decision."
    assert decided.structured_content["next_tool"] is None


def test_arguments_outside_the_schema_answer_the_apis_problem_code(stack, token):
    outside, past_the_schema = over_mcp(
        stack.url, token,
        ("refund", {"order": "ORD-M3", "amount": 25.0, "currency": "EUR", "surprise": 1}),
        ("refund", {"order": "ORD-M3", "amount": "25.00", "currency": "ZZZ", "decision_id": "dec-m3"}),
    )
    assert outside.is_error and outside.structured_content["code"] == "invalid"
    assert set(outside.structured_content["errors"]) == {"amount", "decision_id", "surprise"}
    assert guidance_of(outside).startswith("Refused (invalid): The arguments did not pass validation. Correct")
    assert outside.structured_content["retry"] is False
    # Well-formed for the schema, refused by the API: its problem, named by the tool's arguments.
    assert past_the_schema.is_error and past_the_schema.structured_content["code"] == "invalid"
    assert set(past_the_schema.structured_content["errors"]) == {"currency"}
    assert guidance_of(past_the_schema).startswith("Refused (invalid):")
    assert not Action.objects.filter(target="ORD-M3").exists()


def test_a_refund_task_tool_starts_the_workflow_and_answers_its_checkpoint(stack, token):
    with api_client(stack.url, token) as provider:
        sandbox_order(provider, "ORD-M4", "CUST-M4")
    stack.start_worker()
    arguments = {"order": "ORD-M4", "amount": "25.00", "currency": "EUR", "customer": "CUST-M4",
                 "decision_id": "dec-m4", "wait": 0}
    (started,) = over_mcp(stack.url, token, ("start_refund_task", arguments))
    task_id = "task:refund:ORD-M4:dec-m4"
    assert not started.is_error and started.structured_content["task_id"] == task_id, guidance_of(started)
    assert guidance_of(started).startswith(f"Task {task_id} (refund): queued")
    assert started.structured_content["next_tool"] == {"name": "wait_for_task", "arguments": {"task_id": task_id}}
    settled(Task.objects.get(task_id=task_id), seconds=60)  # sweeping, as the sweeper would
    (done,) = over_mcp(stack.url, token, ("wait_for_task", {"task_id": task_id}))
    assert done.structured_content["state"] == "succeeded", guidance_of(done)
    assert done.structured_content["steps"]["notify_customer"]["status"] == "done"


def test_the_apis_other_problem_codes_come_through_and_an_unknown_tool_is_not_found(stack, token):
    booking = {"resource": "ROOM-1", "service": "massage", "start": "2026-12-01T10:00:00Z",
               "end": "2026-12-01T11:00:00Z", "wait": 0}
    booked, clash, unknown = over_mcp(
        stack.url, token,
        ("create_booking", {**booking, "customer": "CUST-M5", "decision_id": "dec-m5"}),
        ("create_booking", {**booking, "customer": "CUST-M6", "decision_id": "dec-m6"}),
        ("cancel_everything", {}),
    )
    assert not booked.is_error and booked.structured_content["status"] == "queued", guidance_of(booked)
    assert clash.is_error and (clash.structured_content["status"], clash.structured_content["code"]) == (
        409, "booking_conflict")
    assert "Nothing was booked" in guidance_of(clash) and clash.structured_content["retry"] is False
    assert unknown.is_error and unknown.structured_content["code"] == "not_found"
    assert Action.objects.filter(target="ROOM-1").count() == 1


def test_a_refund_the_limits_refuse_tells_the_model_nothing_was_recorded_and_not_to_retry(live_server, settings):
    """The in-process live server, so that this test's setting holds there: no limit covers
    JPY where refunds have limits, and the deployment refuses such requests."""
    settings.LIMITS_UNCOVERED_CURRENCY = "refuse"
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"))
    (refused,) = over_mcp(live_server.url, make_agent("mcp-bot")[1], ("refund", {
        "order": "ORD-M7", "amount": "900000", "currency": "JPY", "customer": "CUST-M7", "decision_id": "dec-m7",
        "wait": 0}))
    assert refused.is_error and (refused.structured_content["status"], refused.structured_content["code"]) == (
        422, "currency_not_covered")
    assert "no refund limit covers JPY" in guidance_of(refused)
    assert "Do not retry; a person must set a limit for the currency first." in guidance_of(refused)
    assert refused.structured_content["retry"] is False and not Action.objects.exists()


@pytest.mark.parametrize("rate", ["0/s", "0/d"])
def test_a_throttled_call_says_whether_it_waited_and_tried_again_as_it_did(live_server, settings, rate):
    """A throttled call waits a Retry-After of up to 30 s out itself and tries once more; one over 30 s
    it answers at once. Its guidance said in both cases that the call waits up to 30 s and tries once
    more: told so after a refusal that asked for hours, a model took the limit for one that 30 s clear.
    The in-process live server, so that this test's rate holds there: none allowed, so every request is
    refused, and Surety's Retry-After is the rest of the second (1 s), or of the day (hours)."""
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"agent": rate}}
    started = time.monotonic()
    (refused,) = over_mcp(live_server.url, make_agent("mcp-bot")[1], ("refund", {
        "order": "ORD-M20", "amount": "25.00", "currency": "EUR", "decision_id": "dec-m20", "wait": 0}))
    took = time.monotonic() - started
    said = guidance_of(refused)
    assert (refused.is_error, refused.structured_content["code"], refused.structured_content["retry"]) == (
        False, "throttled", True), said
    assert "waits out a limit of up to" not in said and not Action.objects.exists()
    if rate == "0/s":
        assert "This call waited 1 s, tried once more and was refused again" in said
        assert "refused alike. Surety asked for 1 s before the next call (Retry-After)." in said
        assert took >= 1
    else:
        asked = float(re.search(r"Surety asked for (\d+) s before the next call \(Retry-After\), longer than "
                                r"the 2\d s this call could still wait out itself, so it did not wait or try again: "
                                r"do not make the same call again before then\.", said)[1])
        assert asked > mcp_server.THROTTLED_WAIT_MAX and "tried once more" not in said
        assert took < mcp_server.THROTTLED_WAIT_MAX  # it answered at once
    assert "Tell the user Surety is busy, and make the same call again later" in said


def test_a_failed_refund_says_not_to_ask_again_and_wait_for_action_sees_the_operators_retry(stack, token):
    """Its dead-letter entry is the way to retry it, under its own key: a model that asked again under
    a new decision_id made a second refund once the operator retried the first."""
    unreachable = stack.start_worker(SANDBOX_BASE_URL=f"http://127.0.0.1:{free_port()}/sandbox/v1")
    arguments = {"order": "ORD-M8", "amount": "25.00", "currency": "EUR", "decision_id": "dec-m8", "wait": 0}
    over_mcp(stack.url, token, ("refund", arguments))
    key = "refund:ORD-M8:dec-m8"
    wait_until(lambda: Action.objects.filter(operation_key=key, status="failed").exists(), seconds=30,
               message="the refund to run out of attempts")
    stack.kill_worker(unreachable)
    (failed,) = over_mcp(stack.url, token, ("refund", arguments))
    assert failed.structured_content["status"] == "failed" and failed.structured_content["replayed"] is True
    assert "Failed: nothing was done (connect_failed: " in guidance_of(failed)
    assert "Do not ask for it again under a new decision_id" in guidance_of(failed)
    assert failed.structured_content["next_tool"] == {"name": "wait_for_action", "arguments": {"operation_key": key}}

    stack.start_worker()
    waits = ("wait_for_action", {"operation_key": key, "seconds": mcp_server.CALL_WAIT_MAX})
    with ThreadPoolExecutor(1) as model:
        # Two calls, as a model makes them when the first answers that it is still failed: each waits
        # at most CALL_WAIT_MAX, the second answers at once once the first saw the outcome.
        waiting = model.submit(over_mcp, stack.url, token, waits, waits)
        time.sleep(2)  # the model waits, as it was told, while the operator retries it
        deadletter_redrive(DeadLetter.objects.get(action__operation_key=key, status="open"),
                           actor=person("olga", "operators"), reason="provider reachable again")
        *_, retried = waiting.result()
    assert retried.structured_content["status"] == "succeeded", guidance_of(retried)
    assert guidance_of(retried).startswith("Done: refund succeeded")
    with api_client(stack.url, token) as provider:
        assert len(sandbox_list(provider, "refunds", order_id="ORD-M8")) == 1


def test_a_refund_asked_again_written_otherwise_is_refused_with_the_refund_that_stands(stack, token):
    """A restarted model rewords the reason or drops the customer (both part of the request): the
    refusal answers the refund its first call recorded, under its key or, recorded for the decision
    under another key, under the key the API's detail names."""
    arguments = {"order": "ORD-M9", "amount": "25.00", "currency": "EUR", "decision_id": "dec-m9",
                 "customer": "CUST-M9", "reason": "charged twice", "wait": 0}
    with SuretyClient(stack.url, token) as client:
        client.refund(order="ORD-M10", amount="25.00", currency="EUR", decision_id="dec-m10", scope="full")
    first, reworded, dropped, elsewhere = over_mcp(
        stack.url, token, ("refund", arguments), ("refund", {**arguments, "reason": "a double charge"}),
        ("refund", {name: value for name, value in arguments.items() if name != "customer"}),
        ("refund", {**arguments, "order": "ORD-M10", "decision_id": "dec-m10"}))
    assert not first.is_error, guidance_of(first)
    for refused, key in [(reworded, "refund:ORD-M9:dec-m9"), (dropped, "refund:ORD-M9:dec-m9"),
                         (elsewhere, "refund:ORD-M10:full:dec-m10")]:
        assert refused.is_error and refused.structured_content["code"] == "idempotency_key_reused"
        assert refused.structured_content["recorded"]["operation_key"] == key
        assert f"What stands for this decision, under {key!r}: Still working (status queued)" in guidance_of(refused)
        assert refused.structured_content["next_tool"] == {"name": "wait_for_action",
                                                           "arguments": {"operation_key": key}}
    assert Action.objects.filter(target__in=["ORD-M9", "ORD-M10"]).count() == 2


def test_a_refund_task_for_an_order_written_with_a_trailing_space_is_the_same_task(stack, token):
    arguments = {"amount": "25.00", "currency": "EUR", "customer": "CUST-M11", "decision_id": "dec-m11", "wait": 0}
    first, again = over_mcp(stack.url, token, ("start_refund_task", {**arguments, "order": "ORD-M11"}),
                            ("start_refund_task", {**arguments, "order": "ORD-M11 "}))
    assert not first.is_error and again.structured_content["replayed"] is True, guidance_of(again)
    assert list(Task.objects.values_list("task_id", flat=True)) == ["task:refund:ORD-M11:dec-m11"]


def test_a_long_wait_tells_a_host_that_asked_for_progress_that_it_is_still_waiting(stack, token, monkeypatch):
    """wait_for_action waits for a person, and sent nothing meanwhile: a host may show progress, or
    reset a timeout on it. The server in this process, over memory streams (JSON-RPC as over stdio), so
    that its interval can be a fraction of a second."""
    monkeypatch.setattr(mcp_server, "PROGRESS_INTERVAL", 0.2)
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"))
    progress, notifications = [], []

    async def told(value, total, message):
        progress.append((value, message))

    async def notified(message):
        notifications.append(message)

    async def session(client, arguments):
        async with served(client, message_handler=notified) as mcp:
            silent = await mcp.call_tool("wait_for_action", arguments)
            unasked = list(notifications)
            heard = await mcp.call_tool("wait_for_action", arguments, progress_callback=told)
        return silent, unasked, heard

    with SuretyClient(stack.url, token) as client, ThreadPoolExecutor(1) as thread:
        key = client.refund(order="ORD-M12", amount="900.00", currency="EUR", decision_id="dec-m12").operation_key
        silent, unasked, heard = thread.submit(anyio.run, session, client, {"operation_key": key, "seconds": 2}
                                               ).result()
    for answer in (silent, heard):
        assert "nobody decided in the 2 s this call waited" in guidance_of(answer)
    # A caller that sent no progressToken is sent no progress (the handler sees the other call's).
    assert unasked == [] and len(notifications) >= len(progress)
    assert len(progress) >= 5, progress  # every 0.2 s of the 2 s
    values = [value for value, _ in progress]
    assert values == sorted(values) and len(set(values)) == len(values)  # progress only increases
    assert progress[0][1].startswith("Still waiting on Surety after ")


# What a host on the MCP TypeScript SDK allows a request by default (DEFAULT_REQUEST_TIMEOUT_MSEC).
HOST_TIMEOUT = 60


def test_the_longest_wait_a_tool_offers_answers_within_a_hosts_60_s_and_progress_comes_meanwhile(
        stack, token, monkeypatch):
    """A host on the MCP TypeScript SDK stops a request after 60 s unless it chose to reset that on
    progress (resetTimeoutOnProgress), which the server cannot tell. wait_for_action offered up to 600 s:
    asked for that while nobody decided, the host stopped it at 60 s and the model had no answer. The
    SDK's own client here, whose timeout progress never resets: the longest wait any tool offers answers
    within it, saying nobody decided; and a call that asked for progress hears it while it waits, and
    answers the outcome of the approval given meanwhile. The server in this process, over memory streams
    (JSON-RPC as over stdio), so that its progress interval can be a second."""
    monkeypatch.setattr(mcp_server, "PROGRESS_INTERVAL", 1.0)
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"))
    stack.start_worker()
    progress, heard = [], threading.Event()

    async def told(value, total, message):
        progress.append(value)
        heard.set()

    async def session(client, key):
        async with served(client) as mcp:
            longest = max(schema["maximum"] for tool in (await mcp.list_tools()).tools
                          for name, schema in tool.input_schema["properties"].items()
                          if name in ("wait", "seconds"))
            waiting = {"operation_key": key, "seconds": longest}
            nobody = await mcp.call_tool("wait_for_action", waiting, read_timeout_seconds=HOST_TIMEOUT)
            approved = await mcp.call_tool("wait_for_action", waiting, read_timeout_seconds=HOST_TIMEOUT,
                                           progress_callback=told)
        return longest, nobody, approved

    with SuretyClient(stack.url, token) as client, ThreadPoolExecutor(1) as thread:
        key = client.refund(order="ORD-M19", amount="900.00", currency="EUR", decision_id="dec-m19").operation_key
        waited = thread.submit(anyio.run, session, client, key)
        # The person approves once the second call told the host it is still waiting.
        wait_until(lambda: heard.is_set() or waited.done(), seconds=3 * HOST_TIMEOUT, message="progress")
        if heard.is_set():
            review_decide(ReviewItem.objects.get(action__operation_key=key), user=person("rita", "approvers"),
                          decision="approve", reason="the order shows the double charge")
        longest, nobody, approved = waited.result()
    assert f"nobody decided in the {longest:g} s this call waited" in guidance_of(nobody)
    assert approved.structured_content["status"] == "succeeded", guidance_of(approved)
    assert guidance_of(approved).startswith("Done: refund succeeded")
    assert progress and progress == sorted(progress)


def test_a_tool_call_the_host_cancels_stops_waiting_at_its_next_poll(stack, token, monkeypatch):
    """wait_for_action waits for a person in a thread of its own (the client blocks). A
    host that gave up on the call (the SDK's client sends notifications/cancelled) ended the request,
    not the thread: it read the action on every few seconds until its own seconds ran out. The
    server in this process, over memory streams, its reads counted where the client sends them."""
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"))
    reads, returned = [], []
    call = mcp_server.call

    def timed(*args, **kwargs):
        try:
            return call(*args, **kwargs)
        finally:
            returned.append(time.monotonic())

    monkeypatch.setattr(mcp_server, "call", timed)

    async def session(client, key):
        async with served(client) as mcp:
            with anyio.move_on_after(1.5):  # the host gives up on the call, as the SDK does it
                await mcp.call_tool("wait_for_action", {"operation_key": key, "seconds": 20})
            cancelled = time.monotonic()
            await anyio.sleep(client_module.PERSON_INTERVAL + 2)  # past the wait's next read
        return cancelled

    with SuretyClient(stack.url, token) as client, ThreadPoolExecutor(1) as thread:
        key = client.refund(order="ORD-M18", amount="900.00", currency="EUR", decision_id="dec-m18").operation_key
        client._http.event_hooks["request"].append(lambda request: reads.append(time.monotonic()))
        cancelled = thread.submit(anyio.run, session, client, key).result()
    assert reads and reads[0] < cancelled  # it was waiting for the person, reading
    assert [at - cancelled for at in reads if at > cancelled] == []  # and read nothing once cancelled
    assert returned and returned[0] - cancelled < 1  # its thread returned at once, not at its 20 s


def test_a_tool_call_that_fails_unexpectedly_says_why_not_that_a_task_group_failed(monkeypatch):
    """The progress reporter runs beside the call in a task group, which wraps what the call raises
    in an ExceptionGroup: the host was told "unhandled errors in a TaskGroup", not what went wrong."""
    def broken(client, name, arguments, stop):
        raise ValueError("the answer had no status")

    monkeypatch.setattr(mcp_server, "call", broken)

    async def session():
        async with served(SuretyClient("http://127.0.0.1:9", "token")) as mcp:
            try:
                await mcp.call_tool("get_action", {"operation_key": "k"})
            except MCPError as error:  # the SDK answers a handler's exception as a JSON-RPC error
                told = str(error)
        return told

    with ThreadPoolExecutor(1) as thread:  # a thread of its own: a browser test may hold this one's event loop
        told = thread.submit(anyio.run, session).result()
    assert "the answer had no status" in told and "TaskGroup" not in told


@pytest.mark.parametrize("ending", ["expired", "rejected"])
def test_an_expired_or_rejected_step_of_a_task_is_its_tasks_not_a_new_decision(stack, token, ending):
    """Its task fails for good with it (approval_expired, action_rejected), and a person may finish it
    by hand: told to ask again under a new decision_id, as a standalone expired action is, the model
    could make a second refund."""
    Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                    max_amount=Decimal("500.00"), approval_expires_after_hours=4)
    with api_client(stack.url, token) as provider:
        sandbox_order(provider, "ORD-M13", "CUST-M13", amount="900.00")
    stack.start_worker()
    over_mcp(stack.url, token, ("start_refund_task", {
        "order": "ORD-M13", "amount": "900.00", "currency": "EUR", "customer": "CUST-M13",
        "decision_id": "dec-m13", "wait": 0}))
    task_id = "task:refund:ORD-M13:dec-m13"
    assert settled(Task.objects.get(task_id=task_id), seconds=60).state == "waiting"
    item = ReviewItem.objects.get(action__task__task_id=task_id, status="open")
    if ending == "expired":
        assert approval_expire_due(now=item.expires_at) == 1
    else:
        review_decide(item, user=person("rita", "approvers"), decision="reject", reason="refunded by phone")
    step = item.action.operation_key
    (answer,) = over_mcp(stack.url, token, ("wait_for_action", {"operation_key": step, "seconds": 0}))
    assert answer.structured_content["status"] == ending, guidance_of(answer)
    assert "ask again under a new decision_id" not in guidance_of(answer)
    assert f"It is a step of task {task_id!r}" in guidance_of(answer)
    assert "do not ask for it again under a new decision_id" in guidance_of(answer)
    assert answer.structured_content["next_tool"] == {"name": "get_task", "arguments": {"task_id": task_id}}


def declined_over_mcp(stack, token, name):
    """A refund of ORD-<name> asked over MCP, which the provider declines: failed for good, its dead
    letter open. (key, the tool's arguments, its answer)."""
    with api_client(stack.url, token) as provider:
        sandbox(provider, "POST", "faults", json={"target": f"ORD-{name}", "fault": "decline", "times": 1})
    stack.start_worker()
    arguments = {"order": f"ORD-{name}", "amount": "25.00", "currency": "EUR", "decision_id": f"dec-{name.lower()}",
                 "wait": 20}
    (declined,) = over_mcp(stack.url, token, ("refund", arguments))
    assert declined.structured_content["status"] == "failed", guidance_of(declined)
    return f"refund:ORD-{name}:dec-{name.lower()}", arguments, declined


def asked_again_and_waited(stack, token, key, arguments):
    """The same refund asked again, then waited for: both answered at once (no retry to wait for)."""
    started = time.monotonic()
    answers = over_mcp(stack.url, token, ("refund", arguments),
                       ("wait_for_action", {"operation_key": key, "seconds": 30}))
    assert time.monotonic() - started < 20
    return answers


def test_a_refund_a_person_did_by_hand_is_reported_done_and_never_asked_again(stack, token):
    """Declined by the provider, it failed for good; the operator paid it by bank transfer and resolved
    its dead letter. Told "Failed: nothing was done, a person may retry it", the model waited for a
    retry that never comes, or asked for it again under a new decision_id: a second refund."""
    key, arguments, _ = declined_over_mcp(stack, token, "M14")
    deadletter_resolve(DeadLetter.objects.get(action__operation_key=key, status="open"),
                       actor=person("olga", "operators"), note="refunded by bank transfer")

    again, waited = asked_again_and_waited(stack, token, key, arguments)
    for answer in (again, waited):
        guidance = guidance_of(answer)
        assert answer.structured_content["error"]["done_by_hand"] is True
        assert "Done by hand: a person made this refund outside Surety" in guidance
        assert "nothing was done (" not in guidance and "may retry" not in guidance
        assert "Do not ask for it again, under this decision or a new decision_id" in guidance
        assert answer.structured_content["next_tool"] is None
    with SuretyClient(stack.url, token) as client:
        action = client.get_action(key)
    assert action.done_by_hand and not action.redrivable
    with api_client(stack.url, token) as provider:
        assert sandbox_list(provider, "refunds", order_id="ORD-M14") == []  # done outside the provider's API


def test_a_refund_task_a_person_finished_by_hand_is_reported_done_and_never_waited_for(stack, token):
    """The provider could not be asked for the order on any attempt: the task was dead-lettered, and
    the operator paid the refund by bank transfer and resolved its dead letter. Its state stays
    where its work stopped; read as a task a person may redrive, wait_for_task waited its seconds out
    for a redrive that never comes, and the model was told to wait for one, or to tell the user that
    operations may redrive it."""
    with api_client(stack.url, token) as provider:
        sandbox_order(provider, "ORD-M15", "CUST-M15")
        sandbox(provider, "POST", "faults", json={"target": "ORD-M15", "fault": "lookup_error", "times": 10})
    stack.start_worker()
    over_mcp(stack.url, token, ("start_refund_task", {
        "order": "ORD-M15", "amount": "25.00", "currency": "EUR", "customer": "CUST-M15",
        "decision_id": "dec-m15", "wait": 0}))
    task_id = "task:refund:ORD-M15:dec-m15"
    assert settled(Task.objects.get(task_id=task_id), seconds=60).state == "dead_lettered"
    deadletter_resolve(DeadLetter.objects.get(task__task_id=task_id, status="open"),
                       actor=person("olga", "operators"), note="refunded by bank transfer")

    started = time.monotonic()
    read, waited = over_mcp(stack.url, token, ("get_task", {"task_id": task_id}),
                            ("wait_for_task", {"task_id": task_id, "seconds": 30}))
    assert time.monotonic() - started < 20  # no redrive to wait for: wait_for_task answers at once
    for answer in (read, waited):
        guidance = guidance_of(answer)
        assert answer.structured_content["state"] == "dead_lettered"
        assert answer.structured_content["last_error"]["done_by_hand"] is True
        assert "Done by hand: a person finished this task outside Surety" in guidance
        assert "may redrive" not in guidance and "wait_for_task" not in guidance
        assert "Do not start it again under a new decision_id or task id" in guidance
        assert "Tell the user it was done, by hand." in guidance
        assert answer.structured_content["next_tool"] is None
    with SuretyClient(stack.url, token) as client:
        task = client.get_task(task_id)
    assert task.done_by_hand and not task.redrivable


def test_a_refund_a_person_discarded_is_reported_given_up_and_never_waited_for(stack, token):
    """Declined, it failed for good, and a person may still retry it from its open dead letter once its
    cause is fixed. Then the operator discarded the entry: nothing was done, and its row says so
    (`"given_up": true`). Before, its error read `"retryable": false` as it did while the entry was
    open: read as still redrivable, wait_for_action waited its seconds out for a retry that never
    comes, and the model was told operations may retry it (until the client read the entry from the
    action's evidence record, a request more on every read)."""
    key, arguments, declined = declined_over_mcp(stack, token, "M16")
    assert "a person may retry it from the dead-letter queue once its cause is fixed" in guidance_of(declined)
    with SuretyClient(stack.url, token) as client:
        assert client.get_action(key).redrivable  # its entry open: a retry may come
    deadletter_discard(DeadLetter.objects.get(action__operation_key=key, status="open"),
                       actor=person("olga", "operators"), reason="the customer withdrew the claim")
    assert Action.objects.get(operation_key=key).error == {**declined.structured_content["error"], "given_up": True}

    again, waited = asked_again_and_waited(stack, token, key, arguments)
    for answer in (again, waited):
        guidance = guidance_of(answer)
        assert answer.structured_content["status"] == "failed"
        assert "Given up: a person discarded its dead-letter entry: nobody will retry it" in guidance
        assert "may retry" not in guidance and "wait_for_action" not in guidance
        assert answer.structured_content["next_tool"] is None
    with SuretyClient(stack.url, token) as client:
        paths = []
        client._http.event_hooks["request"].append(lambda request: paths.append(request.url.path))
        action = client.get_action(key)
    assert action.given_up and not action.redrivable and not action.done_by_hand
    assert not [path for path in paths if path.endswith("/evidence")]  # the row says it all
    with api_client(stack.url, token) as provider:
        assert sandbox_list(provider, "refunds", order_id="ORD-M16") == []


@pytest.mark.parametrize("closed", ["resolved", "discarded"])
def test_a_declined_booking_a_person_then_resolved_is_not_booked_again_as_a_new_decision(stack, token, closed):
    """A booking declined by the provider failed for good and let its slot and its decision go. A
    person resolving its dead letter (finished by hand) left it so, its row read as before: told that
    booking it is a new decision, the model booked a second time what the person had booked by hand.
    Resolved, it is done by hand now, its slot and decision held again; discarded, it is given up,
    nothing was done, and booking it is a new decision indeed."""
    with api_client(stack.url, token) as provider:
        sandbox(provider, "POST", "faults", json={"target": "ROOM-M17", "fault": "decline", "times": 1})
    stack.start_worker()
    key = "create_booking:ROOM-M17:CUST-M17:dec-m17"
    (declined,) = over_mcp(stack.url, token, ("create_booking", {
        "resource": "ROOM-M17", "customer": "CUST-M17", "service": "massage", "start": "2026-12-01T10:00:00Z",
        "end": "2026-12-01T11:00:00Z", "decision_id": "dec-m17", "wait": 20}))
    assert declined.structured_content["status"] == "failed", guidance_of(declined)
    assert "booking it still is a new decision" in guidance_of(declined)  # its entry open: the ledger's word
    entry = DeadLetter.objects.get(action__operation_key=key, status="open")
    operator = person("olga", "operators")
    if closed == "resolved":
        deadletter_resolve(entry, actor=operator, note="booked by phone for 10:30")
    else:
        deadletter_discard(entry, actor=operator, reason="the customer cancelled")
    row = Action.objects.get(operation_key=key)
    mark = {"resolved": "done_by_hand", "discarded": "given_up"}[closed]
    assert row.error == {**declined.structured_content["error"], "retryable": False, mark: True}
    assert Booking.objects.get(action=row).status == {"resolved": "confirmed", "discarded": "released"}[closed]

    (read,) = over_mcp(stack.url, token, ("get_action", {"operation_key": key}))
    guidance = guidance_of(read)
    assert read.structured_content["next_tool"] is None and "may retry" not in guidance
    if closed == "resolved":
        assert guidance.startswith("Done by hand: a person made this create_booking outside Surety")
        assert "Do not ask for it again, under this decision or a new decision_id" in guidance
        assert "is a new decision" not in guidance
    else:
        assert "Given up: a person discarded its dead-letter entry" in guidance
        assert "asking for it again is a new decision, with a decision_id of its own" in guidance


@pytest.mark.parametrize("fault, target, stopped, state, done", [
    ("lookup_error", "ORD-M19", "dead_lettered", "cancelled", "none"),
    ("decline", "m19@example.com", "failed", "failed", "lookup_order, call_refund_api, write_confirmation")],
    ids=["dead-lettered", "failed"])
def test_a_refund_task_a_person_gave_up_says_its_done_steps_stand_and_not_to_start_it_again(
        stack, token, fault, target, stopped, state, done):
    """The order could not be looked up on any attempt (dead-lettered), or its refund made, the customer's
    address refused the confirmation (failed); the operator discarded its dead letter: cancelled, or
    failed still, its `last_error` `given_up`. A cancelled one's guidance said its state and nothing
    more, a failed one's that a person may finish it by hand: a model that took the task as not done, or
    as to be finished, and started it again under a new decision_id made a refund the person had decided
    against, or a second one."""
    with api_client(stack.url, token) as provider:
        sandbox_order(provider, "ORD-M19", "CUST-M19")
        sandbox(provider, "POST", "faults", json={"target": target, "fault": fault, "times": 10})
    stack.start_worker()
    over_mcp(stack.url, token, ("start_refund_task", {
        "order": "ORD-M19", "amount": "25.00", "currency": "EUR", "customer": "CUST-M19",
        "decision_id": "dec-m19", "notify": "m19@example.com", "wait": 0}))
    task_id = "task:refund:ORD-M19:dec-m19"
    assert settled(Task.objects.get(task_id=task_id), seconds=60).state == stopped
    deadletter_discard(DeadLetter.objects.get(task__task_id=task_id, status="open"),
                       actor=person("olga", "operators"), reason="the customer was told by phone")

    started = time.monotonic()
    read, waited = over_mcp(stack.url, token, ("get_task", {"task_id": task_id}),
                            ("wait_for_task", {"task_id": task_id, "seconds": 30}))
    assert time.monotonic() - started < 20  # nothing to wait for
    for answer in (read, waited):
        guidance = guidance_of(answer)
        assert answer.structured_content["state"] == state
        assert answer.structured_content["last_error"]["given_up"] is True
        assert "Given up: a person discarded this task's dead-letter entry" in guidance
        assert f"Its done steps ({done}) were carried out and stand" in guidance
        assert "Do not start it again, under this decision or a new decision_id" in guidance
        assert "may redrive" not in guidance and "finish it by hand" not in guidance
        assert answer.structured_content["next_tool"] is None
    with SuretyClient(stack.url, token) as client:
        task = client.get_task(task_id)
    assert task.given_up and not task.redrivable and not task.done_by_hand
    with api_client(stack.url, token) as provider:
        sandbox(provider, "DELETE", "faults")  # a lookup_error fault fails the listing too
        refunds = [refund["amount"] for refund in sandbox_list(provider, "refunds", order_id="ORD-M19")]
    assert refunds == ([] if stopped == "dead_lettered" else ["25.00"])


def test_a_token_kept_with_a_secret_files_newline_is_taken_without_it(stack, token):
    """A secret mounted from a file keeps its newline, which HTTP cannot carry in a header: every
    call was refused as unsendable, its answer repeating the token."""
    (read,) = over_mcp(stack.url, token + "\n", ("get_action", {"operation_key": "refund:ORD-M20:dec-m20"}))
    assert read.structured_content["code"] == "not_found", guidance_of(read)
    assert token not in read.content[0].text
