"""An MCP server that gives an LLM agent Surety's action types and workflows as tools.

    SURETY_URL=https://surety.example SURETY_TOKEN=... python -m surety_client.mcp_server

It speaks MCP over stdio. Every action tool takes the decision id, from which with the
business object (the order, recipient, resource) the operation key derives, never from the
amount or text the model wrote (`surety_client.keys`): the agent calling again - after a
crash, a timeout, the same decision reached twice, the amount spelt or written otherwise -
finds the action already recorded, or is refused, instead of making a second effect.

Every answer is structured content - the API's resource or problem, plus `guidance` (what
happened and what to do, in words), `retry` (whether the same call made again unchanged may
answer otherwise) and `next_tool` (the call to make next, with its arguments, or null) - and,
as the specification asks, a text block that is its serialized JSON: a host that hands the
model only one of them (pydantic-ai hands it the structured content) hands it the guidance.
An action that needs a person answers at once with the dashboard link and wait_for_action,
which waits through the person's decision (reading every few seconds, as the API's wait does
not hold for a person); a shadow one that it was recorded and never executed; a rejected one
the reviewer's reason, an expired one that it expired (not rejected), an edited one the
version that runs instead; a task's step rejected or expired, that its task failed with it and
not to ask again (get_task). A failed one that nothing was done and a person may retry it from the
dead-letter queue under its own key (so not to ask again under a new decision, which would be a
second effect once they do), with wait_for_action to wait for the retry (not before a rate-limited
provider's retry_after); one a person then did by hand (`done_by_hand`), that it happened outside
Surety and nothing retries it, so never to ask for it again; one a person gave up (`given_up`:
its dead-letter entry discarded), that nothing was done and nobody retries it, and that asking for
it again is a new decision; a dead-lettered task likewise (with
wait_for_task for the redrive), and one a person finished by hand (its `last_error`'s
`done_by_hand`), that its work happened and nothing redrives it, so never to start it again, and
one a person gave up (its `given_up`), that its done steps stand, nothing runs the others, and
never to start it again, under a new decision either. A
refusal of the decision written otherwise (`idempotency_key_reused`) answers the action that
stands for it. Arguments outside a tool's schema answer the API's problem
(code `invalid`, `errors` by argument); an answer that is not the API's, `unreadable`. A problem
is a tool error, except one that asks for the same call again (`retry`: `unreachable`,
`throttled`, `unreadable`), which is a result: hosts count tool errors against a retry budget
(pydantic-ai's is 1) and stop the agent once it runs out, though calling again is what it was told.
A model cannot wait: a throttled call waits a short Retry-After out itself and is made once more.
No call waits longer than CALL_WAIT_MAX seconds (an outcome, a person's decision, a rate limit): hosts
on the MCP TypeScript SDK stop a call after 60 s unless they chose to reset that on progress (decision 69).
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from .client import Action, Checkpoint, SuretyClient, clock, pause, token_fault
from .errors import (
    NO_FIELD,
    IdempotencyKeyReused,
    Problem,
    SuretyError,
    SuretyUnreachable,
    Throttled,
    Unreadable,
    Unsendable,
)

PROBLEM_TYPE = "https://surety.dev/problems/"
# Seconds a tool call waits at most, for an outcome, a person or a rate limit. Hosts on the MCP TypeScript
# SDK stop a request after 60 s unless the host chose to reset that on progress, which the server cannot
# tell: a call offered 600 s, and such a host stopped it at 60 with no answer. 30 s, one held read of the
# API, leaves the rest of the 60 for the requests themselves. A longer wait is the model's next call.
CALL_WAIT_MAX = 30
# Seconds between progress notifications while a tool call waits (for a host that shows them, or
# resets a shorter timeout on them).
PROGRESS_INTERVAL = 10.0
# Seconds a throttled tool call waits before its one more try: its Retry-After, unless longer than the
# first (then answered at once), or the second when the answer says nothing of it (a gateway's 429). The
# wait is taken from the call's own (`wait`, `seconds`), so the call still ends within CALL_WAIT_MAX.
THROTTLED_WAIT_MAX = float(CALL_WAIT_MAX)
THROTTLED_WAIT_UNSAID = 5.0

DECISION = {
    # Something besides whitespace: the API stores a decision stripped, and a blank one names no decision.
    "type": "string", "minLength": 1, "maxLength": 255, "pattern": r"\S",
    "description": "The id of the decision this call carries out. The operation key derives from it and what "
                   "the effect is on (the order; the recipient and message type; the resource and customer), never "
                   "from the amount or text: calling again with the same decision and the same of those (after a "
                   "timeout, a restart) never doubles the effect, and other arguments for it are refused; a new "
                   "decision is a new action. Derive it from an identifier the conversation gives and what is "
                   "decided (for ticket T-4711's refund: T-4711-refund), so that you write it the same after a "
                   "restart or when the same request comes again; never a random id, a time or a counter, which "
                   "come out otherwise on the next call: another decision, and a second effect. Surrounding "
                   "whitespace is ignored, as the API ignores it.",
}
# Part of a message's key, and of the ledger's one message per recipient, type and decision, as
# written: an identifier, so that a model that calls again writes it the same ("Refund
# confirmation" and "refund_confirmation" were two keys, and two messages).
MESSAGE_TYPE = {"type": "string", "minLength": 1, "maxLength": 100, "pattern": "^[a-z0-9_]+$",
                "description": "What kind of message this is, as an identifier such as refund_confirmation "
                               "(lower case, digits, underscores): part of the message's key, so write it the same "
                               "on every call for this decision."}
AMOUNT = {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$",
          "description": 'A decimal string such as "25.00", never a number.'}
CURRENCY = {"type": "string", "pattern": "^[A-Za-z]{3}$", "description": "An ISO 4217 code such as EUR."}
TEXT = {"type": "string", "minLength": 1, "maxLength": 255}
OPTIONAL_TEXT = {"type": "string", "maxLength": 255}


def _asked(schema: dict[str, Any], what: str) -> dict[str, Any]:
    """A field of what the decision's action asks, outside its key: the ledger refuses the same
    decision with it written otherwise (a restarted model paraphrasing a reason, dropping a customer)."""
    return {**schema, "description": f"{what} Part of the request: write it the same on every call for this "
                                     "decision; written otherwise (or given on one call and not another), it is "
                                     "refused."}


def _keyed(what: str) -> dict[str, Any]:
    """A part of the operation key, which the ledger keeps as written (an order id's case, a
    customer's): written otherwise on a later call ("ord-1" for "ORD-1"), it is another key."""
    return {**TEXT, "description": f"{what} Part of the key: write it the same on every call for this decision."}


CUSTOMER = _asked(OPTIONAL_TEXT, "The customer's id, if known.")
REASON = _asked({"type": "string", "maxLength": 500}, "Why, in a few words.")
WAIT = {"type": "number", "minimum": 0, "maximum": CALL_WAIT_MAX, "default": 10,
        "description": f"Seconds to wait for the outcome before answering (0 to {CALL_WAIT_MAX})."}
SECONDS = {"type": "number", "minimum": 0, "maximum": CALL_WAIT_MAX, "default": CALL_WAIT_MAX,
           "description": f"Seconds to wait at most (0 to {CALL_WAIT_MAX}); to wait longer, call again when it "
                          "answers that it is still waiting."}
MOMENT = {"type": "string", "format": "date-time", "description": "ISO 8601, e.g. 2026-12-01T10:00:00Z."}


def _schema(required: list[str], **properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    # With the call's `stop`: set when the host cancels the call, it ends a wait at its next read.
    run: Callable[[SuretyClient, dict[str, Any], threading.Event | None], Action | Checkpoint]
    # Where the API names a field differently from the tool's argument (`target` is the order).
    renamed: dict[str, str]

    def as_mcp(self) -> types.Tool:
        return types.Tool(name=self.name, description=self.description, input_schema=self.input_schema)


def _posted(post: Callable[..., Action], client: SuretyClient, args: dict[str, Any],
            stop: threading.Event | None) -> Action:
    """Post the action, then wait up to `wait` seconds for its outcome (the API answers at once
    when a person must decide)."""
    wait = args.pop("wait", WAIT["default"])
    action = post(client, **args)
    if action.settled or not wait:
        return action
    return replace(client.wait_for(action.operation_key, timeout=wait, stop=stop), replayed=action.replayed)


def _started(client: SuretyClient, args: dict[str, Any], stop: threading.Event | None) -> Checkpoint:
    wait = args.pop("wait", WAIT["default"])
    # The task's id keeps its parts as written (keys.refund_task_id); the tool ignores a decision's
    # surrounding whitespace, as it says, and an order's, as the API does: " dec-9" and "dec-9" were
    # two tasks, and "ORD-1 " after "ORD-1" a second one that failed at its refund step.
    args["decision_id"] = args["decision_id"].strip()
    args["order"] = args["order"].strip()
    task = client.start_refund_task(**args)
    if task.settled or not wait:
        return task
    return replace(client.wait_for_task(task.task_id, timeout=wait, stop=stop), replayed=task.replayed)


TOOLS = {tool.name: tool for tool in (
    Tool("refund", "Refund an order, once per decision. Above the limit a person must approve it first: the "
         "answer then says so, with the dashboard link.",
         _schema(["order", "amount", "currency", "decision_id"], order=_keyed("The order's id."), amount=AMOUNT,
                 currency=CURRENCY, decision_id=DECISION, customer=CUSTOMER, reason=REASON, wait=WAIT),
         partial(_posted, SuretyClient.refund), {"target": "order"}),
    Tool("send_message", "Send one message to a recipient (e-mail address, or phone number in E.164 form for sms "
         "and whatsapp), once per recipient, message type and decision.",
         _schema(["recipient", "channel", "message_type", "body", "decision_id"],
                 recipient=_keyed("The e-mail address or phone number."),
                 channel={"type": "string", "enum": ["email", "sms", "whatsapp"]},
                 message_type=MESSAGE_TYPE,
                 body=_asked({"type": "string", "minLength": 1, "maxLength": 10_000}, "The message's text."),
                 decision_id=DECISION, customer=CUSTOMER, wait=WAIT),
         partial(_posted, SuretyClient.send_message), {"target": "recipient"}),
    Tool("create_booking", "Book a resource for a customer from start to end, once per decision; an "
         "overlapping booking of the same resource is refused (booking_conflict).",
         _schema(["resource", "customer", "service", "start", "end", "decision_id"],
                 resource=_keyed("The resource's id."), customer=_keyed("The customer's id."),
                 service=_asked({"type": "string", "minLength": 1, "maxLength": 200}, "What is booked."),
                 start=MOMENT, end=MOMENT, decision_id=DECISION, wait=WAIT),
         partial(_posted, SuretyClient.create_booking), {"target": "resource"}),
    Tool("start_refund_task", "Start the refund workflow for an order (look the order up, refund, write the "
         "confirmation, notify the customer), once per decision. Returns the task's checkpoint.",
         _schema(["order", "amount", "currency", "customer", "decision_id"], order=_keyed("The order's id."),
                 amount=AMOUNT, currency=CURRENCY, customer=_asked(TEXT, "The customer's id."), decision_id=DECISION,
                 reason=REASON,
                 notify=_asked({"type": "string", "maxLength": 254},
                               "E-mail address for the confirmation. Without it the confirmation goes to "
                               "<customer>@customers.surety.example, so give it when the customer is a name (with "
                               "spaces, say) rather than an id."),
                 wait=WAIT),
         _started, {"order_id": "order"}),
    Tool("get_action", "Read an action by its operation key, as it stands now.",
         _schema(["operation_key"], operation_key=TEXT),
         lambda client, args, stop: client.get_action(args["operation_key"]), {}),
    Tool("wait_for_action", "Wait until an action has an outcome, up to `seconds`: while Surety works on it, "
         "while it waits for a person to approve, release or review it, and while it failed and a person may "
         "retry it from the dead-letter queue.",
         _schema(["operation_key"], operation_key=TEXT, seconds=SECONDS),
         lambda client, args, stop: client.wait_for_outcome(args["operation_key"],
                                                            timeout=args.get("seconds", SECONDS["default"]),
                                                            redrive=True, stop=stop), {}),
    Tool("get_task", "Read a task's checkpoint by its task id.",
         _schema(["task_id"], task_id=TEXT),
         lambda client, args, stop: client.get_task(args["task_id"]), {}),
    Tool("wait_for_task", "Wait until a task leaves queued/running (done, failed, or waiting for a person), "
         "and while it is dead-lettered until a person redrives it (one a person finished by hand answers at "
         "once), up to `seconds`.",
         _schema(["task_id"], task_id=TEXT, seconds=SECONDS),
         lambda client, args, stop: client.wait_for_task(args["task_id"],
                                                         timeout=args.get("seconds", SECONDS["default"]),
                                                         redrive=True, stop=stop), {}),
)}


# --- answers ---------------------------------------------------------------------------------
def _problem_body(status: int, code: str, title: str, detail: str,
                  errors: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """The API's problem+json shape, for what is refused before reaching it."""
    body: dict[str, Any] = {"type": PROBLEM_TYPE + code, "title": title, "status": status, "detail": detail,
                            "code": code}
    if errors:
        body["errors"] = errors
    return body


def _schema_errors(tool: Tool, args: dict[str, Any]) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    for error in Draft202012Validator(tool.input_schema, format_checker=Draft202012Validator.FORMAT_CHECKER) \
            .iter_errors(args):
        if error.validator == "required":
            fields = [name for name in error.validator_value if name not in error.instance]
        elif error.validator == "additionalProperties":
            fields = [name for name in error.instance if name not in tool.input_schema["properties"]]
        else:
            fields = [str(error.path[0])] if error.path else ["arguments"]
        for name in fields:
            errors.setdefault(name, []).append(
                "This argument is required." if error.validator == "required"
                else "Unknown argument." if error.validator == "additionalProperties" else error.message)
    for name, value in args.items():
        # JSON-RPC peers may send NaN or Infinity, which no minimum or maximum refuses.
        if isinstance(value, float) and not math.isfinite(value):
            errors.setdefault(name, []).append("Must be a finite number.")
    return errors


def _as_arguments(tool: Tool, errors: dict[str, list[str]]) -> dict[str, list[str]]:
    """The API's field names (`params.amount`, `target`) as the tool's arguments (`amount`, `order`);
    what names no field under `arguments`, as the schema's own errors name it."""
    named: dict[str, list[str]] = {}
    for field, messages in errors.items():
        field = field.removeprefix("params.").removeprefix("input.")
        field = tool.renamed.get(field, {"Idempotency-Key": "decision_id", NO_FIELD: "arguments"}.get(field, field))
        named.setdefault(field, []).extend(messages)
    return named


# What a model is told for each problem code: what to do, and whether the same call made again
# unchanged may answer otherwise (it never doubles the effect either way).
ADVICE: dict[str, tuple[str, bool]] = {
    "invalid": ("Correct the arguments named in errors and call again; nothing was recorded.", False),
    # Most often the same request written otherwise (a restarted model rewords a reason or a
    # message, drops an optional customer): the action recorded is the one it asked for.
    "idempotency_key_reused": ("This decision is already recorded with other arguments (a reason, customer or "
                               "message written otherwise, an argument given on one call and not the other, another "
                               "amount), or by another agent, and that action stands; nothing was changed. Do not "
                               "retry this decision, with these arguments or others, nor ask for the same effect "
                               "under a new decision_id: that would be a second one (unless what stands for it "
                               "expired, doing nothing, and its guidance says to ask again). Only a different effect "
                               "is a new decision with a decision_id of its own.", False),
    "decision_taken": ("Another agent's action for this decision is recorded; nothing was done. Do not retry this "
                       "decision.", False),
    "refund_already_recorded": ("Another agent's refund of this order for this decision is recorded; nothing was "
                                "done. Do not retry this decision.", False),
    "message_already_sent": ("Another agent's message to this recipient for this decision is recorded; nothing "
                             "was sent. Do not retry this decision.", False),
    "currency_not_covered": ("Nothing was recorded: this deployment sets no limit for this action type in this "
                             "currency and refuses such requests. Do not retry; a person must set a limit for "
                             "the currency first.", False),
    # The API answers both cases with this code; its detail says which.
    "booking_conflict": ("Nothing was booked. If the resource is taken at an overlapping time, offer the customer "
                         "another time or resource. If its booking for this customer and decision is recorded by "
                         "another agent, that booking stands: do not book it again, under this decision or another.",
                         False),
    "forbidden": ("This agent is not allowed this action: a person must grant it. Do not retry.", False),
    "unauthenticated": ("The agent's token is refused: a person must give the MCP server a valid "
                        "SURETY_TOKEN. Do not retry.", False),
    "not_found": ("There is no such action, task or tool for this agent. Do not retry it unchanged.", False),
    # The API's detail ends "A new effect needs a new key": what the key named may well have been done.
    "operation_key_expired": ("Nothing was done now: this key is past its lifetime, and what it named (done or not) "
                              "is no longer answered here. Do not ask again under a new decision_id to repeat it: "
                              "that would be a second effect. Tell the user; a person can look it up.", False),
    # A model cannot wait: told to, it calls again at once. The call waits a short limit out itself, and
    # its guidance says first what it did (`throttled_said`). Not "nothing was recorded": a call that
    # posts may be refused on its next read, the action recorded.
    "throttled": ("Tell the user Surety is busy, and make the same call again later: it answers what this "
                  "decision's call recorded, if anything, and can never double the effect.", True),
    "unreachable": ("This call already tried several times, pausing between tries. Make the same call again, with "
                    "the same decision_id (it can never double the effect); if it answers alike, do not keep "
                    "calling: tell the user Surety cannot be reached now.", True),
    # The detail says when what was asked may have been recorded (an action or task posted).
    "unreadable": ("The answer was not Surety's API (a sign-in or maintenance page, a body a proxy broke, or "
                   "SURETY_URL not where the API answers). Make the same call again in a little while, with the "
                   "same decision_id where it has one: it can never double the effect. If it answers alike, tell "
                   "the user: a person must check the MCP server's SURETY_URL.", True),
    "unsendable": ("Nothing was sent or recorded, and the same call again would fail alike. Do not retry it "
                   "unchanged: tell the user, a person must correct it (or the MCP server's configuration).", False),
}


def _failed(body: dict[str, Any], done: str = "") -> types.CallToolResult:
    """A problem: the API's problem, what the call did about it (`done`: waited a rate limit out, say)
    and what to do. A tool error, unless it says to make the same call again (`retry`): a host counts
    each tool error against the tool's retry budget and ends the run once it is spent (pydantic-ai: 1
    by default), so a model doing as told would be stopped."""
    advice, retry = ADVICE.get(body.get("code", ""), ("Do not retry it unchanged.", False))
    said = body.get("detail") or body.get("title")
    return _result({**body, "guidance": f"Refused ({body.get('code')}): {said} {done}{advice}", "retry": retry,
                    "next_tool": None}, is_error=not retry)


def throttled_said(retry_after: float | None, waited: float | None, room: float = THROTTLED_WAIT_MAX) -> str:
    """What a throttled call did before answering, and how long Surety asked to be left alone (a model
    has no other way to know). `retry_after`: the last refusal's; `waited`: the seconds the call waited
    before its one more try, or None when it made none; `room`: the seconds it could still have waited
    (what its first try left of CALL_WAIT_MAX). Told that the call waits a limit of up to 30 s out
    itself when it had not (Surety asked for longer), a model took the limit for a short one."""
    asked = "" if retry_after is None else f"Surety asked for {retry_after:g} s before the next call (Retry-After)"
    if waited is not None:
        return (f"This call waited {waited:g} s, tried once more and was refused again, so the same call made "
                f"again at once is refused alike. {asked}{'. ' if asked else ''}")
    if retry_after is not None and retry_after > room:
        return (f"{asked}, longer than the {math.floor(room):g} s this call could still wait out itself, so it did "
                "not wait or try again: do not make the same call again before then. ")
    # Cancelled by the host during its wait: nobody reads this, but it says what happened.
    return f"{asked}{'. ' if asked else ''}This call was cancelled before it tried again. "


def _next(tool: str, **arguments: str) -> dict[str, Any]:
    return {"name": tool, "arguments": arguments}


def action_guidance(action: Action, waited: float | None = None) -> tuple[str, dict[str, Any] | None]:
    """What the model should know, in words, and the call to make next (None: nothing to wait for).
    `waited`: the seconds wait_for_action waited, which it does while a person must decide (or may
    retry a failure), so the action still needing one means nobody decided in that time."""
    key = action.operation_key
    wait_for = _next("wait_for_action", operation_key=key)
    if waited is None:
        wait_hint = f"Call wait_for_action with operation_key={key!r} to wait for the decision."
    else:
        wait_hint = (f"Still waiting for a person: nobody decided in the {waited:g} s this call waited. Call "
                     f"wait_for_action with operation_key={key!r} again to wait longer (each call waits up to its "
                     f"seconds, at most {CALL_WAIT_MAX}), or tell the user a person must decide first.")
    said = {
        "succeeded": f"Done: {action.action_type} succeeded (provider reference {action.external_ref}).",
        "awaiting_approval": f"Awaiting approval: above the limit, a person must approve this {action.action_type} "
                             f"before it runs. Nothing happens until someone decides. {wait_hint}",
        "held": "Held: another action on the same target or customer is in flight; this one goes on when that "
                f"one settles, or when a person releases or rejects it. {wait_hint}",
        "needs_review": "Needs review: the outcome could not be proven (or it is above the limit); a person "
                        f"decides. {wait_hint}",
        "shadow": f"Shadow: recorded, not executed. This agent's grant for {action.action_type} is in shadow: "
                  "Surety records its actions and never carries them out (only those asked for after a person "
                  "makes the grant live run, under a new operation_key: this one's stays shadow). Nothing was done "
                  "and nothing will be for this one: do not retry it or wait for it; tell the user it was not "
                  "carried out.",
    }
    version = action.superseded_by
    next_tool = None
    if action.status in ("rejected", "cancelled", "expired"):
        text, next_tool = ended_guidance(action)
    elif action.status == "failed":
        text, next_tool = failure_guidance(action, waited)
    elif version is not None:
        text = (f"Superseded: {version.by} edited it into a new version instead of rejecting it ({version.reason}). "
                f"The version {version.operation_key!r} with params {version.params} is {version.status} and runs "
                f"in its place. Call wait_for_action with operation_key={version.operation_key!r} for its outcome.")
        next_tool = _next("wait_for_action", operation_key=version.operation_key)
    else:
        text = said.get(action.status, f"Still working (status {action.status}). Call wait_for_action with "
                                       f"operation_key={key!r} to wait for the outcome.")
        next_tool = None if action.status in ("succeeded", "shadow") else wait_for
    if action.review and action.needs_person:
        text += f" Dashboard: {action.review.url}"
    if action.replayed:
        text = "Already recorded for this decision; nothing was done again. " + text
    return text, next_tool


def ended_guidance(action: Action) -> tuple[str, dict[str, Any] | None]:
    """An action that ended without its effect: a person said no (rejected, cancelled), or nobody
    decided in time (expired, which nothing will ever run: if the decision still stands, a new
    decision_id asks for it). A task's step is its task's: the task fails with it for good and a
    person may finish it by hand, so the same effect asked again could be made twice."""
    review = action.review
    if action.status == "expired":
        text = ("Expired: nobody approved or rejected it within its approval window; this is not a rejection and "
                "nothing was done.")
    else:
        by = f" by {review.by}: {review.reason}" if review and review.by else ""
        text = f"{action.status.capitalize()}{by}. Do not retry this decision."
    if action.task_id is not None:
        return (f"{text} It is a step of task {action.task_id!r}, which fails with it for good, and a person may "
                "finish it by hand: do not ask for it again under a new decision_id. Call get_task with "
                f"task_id={action.task_id!r} for what comes next.", _next("get_task", task_id=action.task_id))
    if action.status == "expired":
        text += " If the decision still stands, ask again under a new decision_id."
    return text, None


def failure_guidance(action: Action, waited: float | None = None) -> tuple[str, dict[str, Any] | None]:
    """A failed action did nothing, and its failure opened a dead-letter entry and an alert: a person
    may retry it there under its own key. Asked again under a new decision_id, it would be done twice
    once they do: the model must tell the user instead, and may wait for the retry. One a person did
    by hand is no failure to wait through (`by_hand_guidance`), nor one a person gave up
    (`given_up_guidance`)."""
    if action.done_by_hand:
        return by_hand_guidance(action), None
    error = action.error or {}
    key = action.operation_key
    text = f"Failed: nothing was done ({error.get('code')}: {error.get('message')})."
    if action.given_up:
        return given_up_guidance(action, text)
    if action.task_id is not None:
        return (f"{text} It is a step of task {action.task_id!r}, which retries it{_not_before(error)} or stops for "
                "a person to redrive: do not ask for it again under a new decision_id. Call get_task with "
                f"task_id={action.task_id!r} for what comes next.", _next("get_task", task_id=action.task_id))
    if not action.redrivable:  # a booking failed for good: its slot and decision were let go
        return (f"{text} It failed for good and gave its slot up: nobody will retry it. Tell the user why; "
                "booking it still is a new decision, with a decision_id of its own.", None)
    if error.get("retryable"):
        text += f" Operations were alerted: a person may retry it from the dead-letter queue{_not_before(error)}"
    else:
        text += (" It will not succeed as it stands. Operations were alerted: a person may retry it from the "
                 "dead-letter queue once its cause is fixed")
    text += (f", under its own key, which can never do it twice. Do not ask for it again under a new decision_id: "
             f"once they retry it, that would be a second {action.action_type}. Tell the user it failed and that "
             "operations may retry it. ")
    if waited is None:
        text += f"Call wait_for_action with operation_key={key!r} to wait for a retry's outcome."
    else:
        text += (f"It is still failed after the {waited:g} s this call waited: call wait_for_action with "
                 f"operation_key={key!r} again to wait longer.")
    return text, _next("wait_for_action", operation_key=key)


def given_up_guidance(action: Action, text: str) -> tuple[str, dict[str, Any] | None]:
    """A failure a person then gave up (its dead letter, or its task's, discarded): nothing was done,
    and nobody retries it. Told that a person may still retry it, the model waited for a retry that
    never comes."""
    entry = f"the dead-letter entry of its task {action.task_id!r}" if action.task_id else "its dead-letter entry"
    text += (f" Given up: a person discarded {entry}: nobody will retry it. Tell the user it was not done and why; if "
             "they still want it, asking for it again is a new decision, with a decision_id of its own.")
    if action.task_id is None:
        return text, None
    return f"{text} Call get_task with task_id={action.task_id!r} for what its task did.", _next(
        "get_task", task_id=action.task_id)


def by_hand_guidance(action: Action) -> str:
    """A failure a person then did by hand (its dead letter resolved, or its task's): the effect
    happened, outside Surety, and nothing retries it. Told that nothing was done, the model would
    ask for it again, and it would be done twice."""
    error = action.error or {}
    text = (f"Done by hand: a person made this {action.action_type} outside Surety after it failed here "
            f"({error.get('code')}: {error.get('message')}), and resolved its dead-letter entry: it happened. Nothing "
            "will retry it, a person's retry included. Do not ask for it again, under this decision or a new "
            "decision_id: that would do it twice. Tell the user it was done, by hand.")
    if action.task_id is not None:
        text += (f" It is a step of task {action.task_id!r}, which a person finished by hand too: nothing runs it "
                 "again, and it is not to be started again either.")
    return text


def _not_before(error: dict[str, Any]) -> str:
    """When a retry of a retryable failure is worth making, if a rate-limited provider said so."""
    seconds = error.get("retry_after")
    if not error.get("retryable") or not isinstance(seconds, (int, float)) or seconds <= 0:
        return ""
    return (f" (not before {seconds:g} s after it failed: the provider was rate-limited and asked to be left alone "
            "that long)")


def task_guidance(task: Checkpoint, waited: float | None = None) -> tuple[str, dict[str, Any] | None]:
    """As action_guidance, for a task; `waited`: the seconds wait_for_task waited, which it does
    while the task is dead-lettered (a person may redrive it), unless a person finished it by hand."""
    text = f"Task {task.task_id} ({task.workflow}): {task.state}, attempt {task.attempts} of {task.max_attempts}."
    next_tool = None
    if task.state == "waiting":
        open_keys = [step.idempotency_key for step in task.steps.values() if step.status != "done"
                     and step.idempotency_key]
        if open_keys:
            text += (" A step's action waits for a person; get_action with operation_key="
                     f"{open_keys[0]!r} gives the dashboard link.")
            next_tool = _next("get_action", operation_key=open_keys[0])
        else:
            text += " A step waits for a person."
    elif task.state in ("failed", "dead_lettered", "cancelled"):
        # Why it stopped, with what to do: a step refused as the decision's effect recorded elsewhere
        # (another task, a direct request) was done there, and a new decision would do it twice.
        error = task.last_error or {}
        code = error.get("code")
        if error:
            text += f" It stopped at {error.get('step')}: {code}: {error.get('message')}."
        done = ", ".join(name for name, step in task.steps.items() if step.status == "done") or "none"
        if task.done_by_hand:
            text += f" {task_by_hand_guidance(task)}"
        elif task.given_up:
            text += f" {task_given_up_guidance(done)}"
        else:
            if code in ADVICE:
                text += f" {ADVICE[code][0]}"
            text += f" Its done steps ({done}) were carried out and stay done; the others were not completed."
            # Either way it has a dead-letter entry and an alert: a person redrives it, or finishes it
            # by hand, and the same refund started under a new decision would then be a second one.
            if task.redrivable:
                text += (" Out of attempts: operations were alerted, and a person may redrive it from the dead-letter "
                         "queue: it resumes from its checkpoint, under its own task id, never making a done step "
                         "again. Do not start it again under a new decision_id: once they redrive it, that would do "
                         "its steps twice. Tell the user it stopped and that operations may redrive it. ")
                text += (f"Call wait_for_task with task_id={task.task_id!r} to wait for a redrive's outcome."
                         if waited is None else
                         f"It is still dead-lettered after the {waited:g} s this call waited: call wait_for_task with "
                         f"task_id={task.task_id!r} again to wait longer.")
                next_tool = _next("wait_for_task", task_id=task.task_id)
            else:
                text += (" It failed for good: no retry changes it and nobody can redrive it. Operations were alerted, "
                         "and a person may finish it by hand. Do not start it again under a new decision_id: tell the "
                         "user.")
    elif not task.settled:
        text += f" Call wait_for_task with task_id={task.task_id!r} to wait for it."
        next_tool = _next("wait_for_task", task_id=task.task_id)
    if task.replayed:
        text = "Already started for this decision; nothing was started again. " + text
    steps = ", ".join(f"{name}: {step.status}" for name, step in task.steps.items())
    return f"{text} Steps: {steps}.", next_tool


def task_by_hand_guidance(task: Checkpoint) -> str:
    """A stopped task a person then finished by hand (its dead letter resolved): its work happened,
    outside Surety, and nothing redrives it. Told that a person may redrive it, the model would wait
    for a redrive that never comes, or, told its steps were not completed, start it again: its
    refund made twice."""
    return ("Done by hand: a person finished this task outside Surety after it stopped here, and resolved its "
            "dead-letter entry: its work happened (its done steps here, the rest by hand). Nothing will retry or "
            "redrive it. Do not start it again under a new decision_id or task id: that would do it twice. "
            "Tell the user it was done, by hand.")


def task_given_up_guidance(done: str) -> str:
    """A stopped task a person then gave up (its dead letter discarded: cancelled, or failed still):
    they decided it stops where it stopped. Told only its state, or that a person may finish it by
    hand, the model took it as not done and started it again under a new decision: the rest the person
    decided against, and its done steps (a refund made) a second time."""
    return (f"Given up: a person discarded this task's dead-letter entry and decided it stops here: nothing will "
            f"retry or redrive it. Its done steps ({done}) were carried out and stand (what they did is not undone); "
            "the others were not done and will not be. Do not start it again, under this decision or a new "
            "decision_id: a person decided against the rest, and the done steps would be done twice. Tell the "
            "user which steps were done and that a person stopped the rest.")


def _answer(result: Action | Checkpoint, waited: float | None = None) -> types.CallToolResult:
    """The API's resource with what the model should do next: calling again with the same
    decision only answers the same action, so `retry` is false."""
    guidance, next_tool = (action_guidance(result, waited) if isinstance(result, Action)
                           else task_guidance(result, waited))
    return _result({**result.raw, "replayed": result.replayed, "guidance": guidance, "retry": False,
                    "next_tool": next_tool})


def _result(structured: dict[str, Any], *, is_error: bool = False) -> types.CallToolResult:
    """The specification's shape: the structured content, and as text its serialized JSON, so a
    host that hands the model either one hands it the guidance."""
    return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(structured))],
                                structured_content=structured, is_error=is_error)


def call(client: SuretyClient, name: str, arguments: dict[str, Any] | None,
         stop: threading.Event | None = None) -> types.CallToolResult:
    """One tool call, answered as the API would: a result, or its problem. `stop`, once set, ends
    a wait at its next read (the host cancelled the call: nobody reads its answer)."""
    tool = TOOLS.get(name)
    if tool is None:
        return _failed(_problem_body(404, "not_found", "Not found", f"No tool named {name!r}."))
    args = dict(arguments or {})
    errors = _schema_errors(tool, args)
    if errors:
        return _failed(_problem_body(400, "invalid", "Invalid request", "The arguments did not pass validation.",
                                     errors))
    # The wait tools wait through a person's decision: their guidance says how long nobody decided.
    waited = args.get("seconds", SECONDS["default"]) if name in ("wait_for_action", "wait_for_task") else None
    try:
        return _answer(_run(tool, client, args, stop), waited)
    except _StillThrottled as throttled:
        return _failed(throttled.problem.body, throttled_said(throttled.problem.retry_after, throttled.waited,
                                                             throttled.room))
    except IdempotencyKeyReused as problem:
        return _reused(client, tool, problem)
    except Problem as problem:
        return _failed({**problem.body, "errors": _as_arguments(tool, problem.errors)} if problem.errors
                       else problem.body)
    except SuretyUnreachable as exc:
        return _failed(_problem_body(503, "unreachable", "Surety unreachable",
                                     f"{exc} Call again with the same decision_id: it can never double the effect."))
    except Unsendable as exc:
        return _failed(_problem_body(400, "unsendable", "Request not sendable", str(exc)))
    except Unreadable as exc:
        return _failed(_problem_body(502, "unreadable", "Answer not readable", str(exc)))


class _StillThrottled(Exception):
    """A call refused for the agent's rate limit to the end: the last refusal (`problem`), the
    seconds the call waited before its one more try (`waited`; None: it made none), and those it
    could have waited (`room`)."""

    def __init__(self, problem: Throttled, waited: float | None, room: float = THROTTLED_WAIT_MAX) -> None:
        super().__init__(str(problem))
        self.problem, self.waited, self.room = problem, waited, room


def _run(tool: Tool, client: SuretyClient, args: dict[str, Any], stop: threading.Event | None) -> Action | Checkpoint:
    """The tool's call, made once more after a rate limit's wait (THROTTLED_WAIT_MAX at most, cut short
    by `stop`): told to wait, a model calls again at once, throttled again, over and over. The wait is
    taken from the call's own, which a host's timeout leaves no room to add to. Each run takes its
    arguments apart: it gets a copy."""
    started = clock()
    try:
        return tool.run(client, dict(args), stop)
    except Throttled as throttled:
        wait = THROTTLED_WAIT_UNSAID if throttled.retry_after is None else throttled.retry_after
        # Refused partway through a wait (a person's decision read every few seconds), the call has
        # spent some of its CALL_WAIT_MAX already: it waits only what is left.
        room = max(0.0, THROTTLED_WAIT_MAX - (clock() - started))
        if wait > room or pause(wait, stop):
            raise _StillThrottled(throttled, None, room) from None
    try:
        return tool.run(client, _less_waiting(tool, args, clock() - started), stop)
    except Throttled as again:
        raise _StillThrottled(again, wait) from None


def _less_waiting(tool: Tool, args: dict[str, Any], spent: float) -> dict[str, Any]:
    """A copy of `args` whose wait (`wait`, `seconds`, given or by default) is what is left of it after
    `spent` seconds."""
    left = dict(args)
    for name in ("wait", "seconds"):
        schema = tool.input_schema["properties"].get(name)
        if schema is not None:
            left[name] = max(0.0, left.get(name, schema["default"]) - spent)
    return left


def _reused(client: SuretyClient, tool: Tool, problem: IdempotencyKeyReused) -> types.CallToolResult:
    """The refusal, with the action (or task) that stands for the decision as it is now: most often
    the model's own request written otherwise, whose outcome is the one to tell the user. Under
    another agent's key, or unreadable now, the refusal alone."""
    refused = _failed(problem.body)
    key = problem.recorded_key
    if key is None:
        return refused
    try:
        recorded = client.get_task(key) if tool.name == "start_refund_task" else client.get_action(key)
    except SuretyError:
        return refused
    guidance, next_tool = action_guidance(recorded) if isinstance(recorded, Action) else task_guidance(recorded)
    answer = refused.structured_content or {}
    return _result({**answer, "recorded": recorded.raw,
                    "guidance": f"{answer['guidance']} What stands for this decision, under {key!r}: {guidance}",
                    "next_tool": next_tool}, is_error=True)


async def _report_waiting(ctx: ServerRequestContext[Any]) -> None:
    """Progress every PROGRESS_INTERVAL seconds while a call waits (a person's decision, up to
    CALL_WAIT_MAX): a host may show it, or reset a timeout shorter than the call on it (the TypeScript
    SDK's, when the host asks it to). Sent only to a caller that asked for progress (a progressToken):
    the SDK sends nothing otherwise."""
    started = anyio.current_time()
    while True:
        await anyio.sleep(PROGRESS_INTERVAL)
        waited = anyio.current_time() - started
        await ctx.session.report_progress(waited, message=f"Still waiting on Surety after {waited:.0f} s.")


def build_server(client: SuretyClient) -> Server[Any]:
    async def list_tools(ctx: ServerRequestContext[Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool.as_mcp() for tool in TOOLS.values()])

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        # The client blocks (it waits on the API); a thread keeps the server answering meanwhile.
        # A host that cancels the call (notifications/cancelled, which the SDK applies by cancelling
        # this handler) ends it at once, not once the thread is done (abandon_on_cancel), and `stop`
        # ends the thread's wait at its next read: it would otherwise read the API on until its
        # seconds ran out, for an answer nobody takes.
        stop = threading.Event()
        try:
            async with anyio.create_task_group() as waiting:
                waiting.start_soon(_report_waiting, ctx)
                result = await anyio.to_thread.run_sync(call, client, params.name, params.arguments, stop,
                                                        abandon_on_cancel=True)
                waiting.cancel_scope.cancel()
        except ExceptionGroup as group:  # the task group's wrapping: the host is told what went wrong
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        finally:
            stop.set()
        return result

    return Server("surety", version="0.2.0", instructions=INSTRUCTIONS, on_list_tools=list_tools,
                  on_call_tool=call_tool)


INSTRUCTIONS = (
    "Surety records each real-world action (refund, message, booking) once per decision before anything is "
    "called. Pass the id of your decision as decision_id. Derive it from an identifier the conversation gives and "
    "what is decided (for ticket T-4711's refund: T-4711-refund), so that you write it the same after a restart; "
    "never a random id, a time or a counter: another id is another decision, and a second effect. Calling again "
    "with the same decision and the same "
    "order, recipient and message type, or resource and customer is always safe. "
    "An action above its limit waits for a person: the answer gives the dashboard link, and wait_for_action "
    "waits for the decision (up to its seconds; call it again if nobody decided yet). A shadow action was "
    "recorded and never executed (the agent's grant is not live yet): do not retry or wait for it, tell the "
    "user. A rejected action answers the reviewer's reason: do not retry it. An expired one was not rejected "
    "(nobody decided in time): ask again under a new decision_id if it still stands, unless it is a task's step "
    "(its task failed with it: get_task says what comes next). A superseded one was "
    "edited by a person into a version that runs instead: wait for that version. A failed action did nothing, "
    "and operations were alerted: a person may retry it from the dead-letter queue under its own key. Never ask "
    "for it again under a new decision_id (once they retry it, that is a second effect): tell the user, and "
    "wait_for_action waits for the retry. A failed or dead-lettered task likewise: its done steps stand, and a "
    "person may redrive a dead-lettered one. A failed action whose error says done_by_hand was done by a person "
    "outside Surety after it failed: it happened and nothing retries it; tell the user it was done, and never ask "
    "for it again (that would do it twice). A failed action whose error says given_up was given up by a person (its "
    "dead-letter entry discarded): it did nothing and nobody retries it; tell the user, and if they still want it, "
    "asking for it again is a new decision. "
    "A task whose last_error says done_by_hand was finished by a person "
    "outside Surety, whatever its state: nothing redrives it; tell the user, and never start it again under a new "
    "decision_id. A task whose last_error says given_up (cancelled, or failed) was stopped by a person: its done "
    "steps stand and nothing runs the others; tell the user which were done, and never start it again, under a new "
    "decision_id either. A refusal as already recorded (idempotency_key_reused) answers the "
    "action that stands for the decision: tell the user its outcome, do not ask again. Every answer carries "
    "guidance (what happened, what to do), retry (whether the same call again may answer otherwise) and "
    "next_tool (the call to make next, or null)."
)


def main() -> None:
    # Without surrounding whitespace: a secret mounted from a file keeps its newline.
    token = os.environ.get("SURETY_TOKEN", "").strip()
    if not token:
        sys.exit("SURETY_TOKEN is not set: the agent's API token (manage.py create_agent prints it).")
    fault = token_fault(token)
    if fault:  # each call would be refused, as unsendable: said once, here, and without the token
        sys.exit(f"SURETY_TOKEN {fault}: give the agent's API token as manage.py create_agent printed it.")
    # No default: a server started without it called a Surety nobody meant, and answered every call
    # "unreachable, call again", which a model does, over and over.
    url = os.environ.get("SURETY_URL", "").strip()
    if not url:
        sys.exit("SURETY_URL is not set: where Surety answers, such as https://surety.example.")
    client = SuretyClient(url, token)
    server = build_server(client)

    async def serve() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    try:
        anyio.run(serve)
    finally:
        client.close()


if __name__ == "__main__":
    main()

