"""Operation keys derived from the decision: one key per intended effect, the same on every retry.

    refund:{order}:{amount}{currency}:{decision_id}                  refund:ORD-8841:25.00EUR:dec-77
    send_message:{recipient}:{message_type}:{decision_id}            send_message:ana@example.com:receipt:dec-9
    create_booking:{resource}:{customer}:{service}:{start}/{end}:{decision_id}
    task:refund:{order}:{amount}{currency}:{decision_id}             (a refund task's id)

The same call with the same decision gives the same key, so a retry, a restarted agent or the
model reaching the decision again never doubles the effect; a new decision is a new key.
Keys are 1-255 printable ASCII characters (the API's rule), and a task id at most 200, as the
keys of its steps (`{task_id}:call_refund_api:v1`) must fit in 255 too: a key that would be
longer, or holds other characters, is `{kind}:sha256:{hex digest of the long form}` instead.
"""

from __future__ import annotations

import hashlib
from decimal import Decimal

MAX_KEY = 255
MAX_TASK_ID = 200


def operation_key(kind: str, *parts: object, limit: int = MAX_KEY) -> str:
    key = ":".join([kind, *(str(part) for part in parts)])
    if len(key) <= limit and key.isascii() and key.isprintable():
        return key
    return f"{kind}:sha256:{hashlib.sha256(key.encode()).hexdigest()}"


def refund_key(order: str, amount: str | Decimal, currency: str, decision_id: str) -> str:
    return operation_key("refund", order, f"{amount}{currency.upper()}", decision_id)


def message_key(recipient: str, message_type: str, decision_id: str) -> str:
    return operation_key("send_message", recipient, message_type, decision_id)


def booking_key(resource: str, customer: str, service: str, start: str, end: str, decision_id: str) -> str:
    return operation_key("create_booking", resource, customer, service, f"{start}/{end}", decision_id)


def refund_task_id(order: str, amount: str | Decimal, currency: str, decision_id: str) -> str:
    return operation_key("task:refund", order, f"{amount}{currency.upper()}", decision_id, limit=MAX_TASK_ID)
