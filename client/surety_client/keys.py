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

Keys are 1-255 printable ASCII characters (the API's rule), and a task id at most 200, as the
keys of its steps (`{task_id}:call_refund_api:v1`) must fit in 255 too: a key that would be
longer, or holds other characters, is `{kind}:sha256:{hex digest of the long form}` instead.
"""

from __future__ import annotations

import hashlib

MAX_KEY = 255
MAX_TASK_ID = 200


def operation_key(kind: str, *parts: object, limit: int = MAX_KEY) -> str:
    key = ":".join([kind, *(str(part) for part in parts)])
    if len(key) <= limit and key.isascii() and key.isprintable():
        return key
    return f"{kind}:sha256:{hashlib.sha256(key.encode()).hexdigest()}"


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
    return operation_key("task:refund", order, *_scoped(scope), decision_id, limit=MAX_TASK_ID)
