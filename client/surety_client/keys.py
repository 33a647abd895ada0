"""Operation keys named by the intended effect: the business object, the action type and the
decision, never the arguments the model wrote.

    refund:{order}:{decision_id}                          refund:ORD-8841:dec-77
    refund:{order}:{scope}:{decision_id}                  refund:ORD-8841:partial:dec-77
    send_message:{recipient}:{message_type}:{decision_id} send_message:ana@example.com:receipt:dec-9
    create_booking:{resource}:{customer}:{decision_id}    create_booking:ROOM-1:CUST-17:dec-5
    task:refund:{order}:{decision_id}                     (a refund task's id; a scope likewise)

An amount, a message's body, a booking's times are parameters, not part of the key: a model
that writes the same decision again with "25" for "25.00", or rewrites the amount when it
summarises the conversation, sends the same key. The ledger then answers the action already
recorded (the same parameters, whatever their spelling) or refuses the other parameters
(`idempotency_key_reused`); it never executes them as new work. A new decision is a new key.

Each part of an action's key is taken as the API stores it, stripped of surrounding whitespace
(" dec-7 " is the decision "dec-7"), and within it '%' is written %25 and ':' %3A, so that no two
effects share a key (a refund task's id keeps its parts as written: `refund_task_id`): `refund:gid%3A//shop/Order/1:dec-7` is the order "gid://shop/Order/1", never the order "gid"
and the decision "//shop/Order/1:dec-7". A part without ':', '%' or surrounding whitespace is
written as it is, so keys made of such parts are what they were before this rule.

Keys are 1-255 printable ASCII characters (the API's rule), and a task id at most 200, as the
keys of its steps (`{task_id}:call_refund_api:v1`) must fit in 255 too: a key that would be
longer, or holds other characters, is `{kind}:sha256:{hex digest of the long form}` instead.
"""

from __future__ import annotations

import hashlib

MAX_KEY = 255
MAX_TASK_ID = 200


def operation_key(kind: str, *parts: object, limit: int = MAX_KEY) -> str:
    return _joined(kind, [_part(part) for part in parts], limit)


def _joined(kind: str, parts: list[str], limit: int) -> str:
    key = ":".join([kind, *parts])
    if len(key) <= limit and key.isascii() and key.isprintable():
        return key
    return f"{kind}:sha256:{hashlib.sha256(key.encode()).hexdigest()}"


def _part(part: object) -> str:
    """One part of a key: stripped, as the API strips the target, customer and decision it stores
    (it records the decision "dec-7 " as "dec-7"; and a trailing space is no valid header value),
    then '%' and ':' percent-encoded, '%' first so that an escape in the part stays its own."""
    return str(part).strip().replace("%", "%25").replace(":", "%3A")


def _scoped(scope: str | None) -> tuple[str, ...]:
    return (scope,) if scope else ()


def refund_key(order: str, decision_id: str, *, scope: str | None = None) -> str:
    """The key of a refund of `order` for the decision. A `scope` ("full", "partial") names
    which refund in the key; the ledger still holds one refund per order and decision."""
    return operation_key("refund", order, *_scoped(scope), decision_id)


def message_key(recipient: str, message_type: str, decision_id: str) -> str:
    return operation_key("send_message", recipient, message_type, decision_id)


def booking_key(resource: str, customer: str, decision_id: str) -> str:
    return operation_key("create_booking", resource, customer, decision_id)


def refund_task_id(order: str, decision_id: str, *, scope: str | None = None) -> str:
    """A refund task's id, its parts as written: the escaping and stripping above are not applied.
    The ledger knows a task by its id alone, so a task an earlier client started, asked again in a
    new form after an upgrade, would be a second task and a second refund. What a shared id costs
    is safe: the second order's task is refused (`idempotency_key_reused`), never run; and the
    refund inside is held to one per order and decision by the decision the task's input carries."""
    parts = [str(part) for part in (order, *_scoped(scope), decision_id)]
    task_id = _joined("task:refund", parts, MAX_TASK_ID)
    if task_id.endswith(" "):
        # No valid header value, so no client ever started a task under it: the decision is taken
        # without its trailing spaces, as the API stores it ("dec-7 " is "dec-7"), not refused.
        task_id = _joined("task:refund", [*parts[:-1], parts[-1].rstrip(" ")], MAX_TASK_ID)
    return task_id
