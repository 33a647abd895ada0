"""Surety's Python client: post guarded actions under keys derived from the decision, wait for
their outcome, read a task's checkpoint. `python -m surety_client.mcp_server` serves the same
to an LLM agent over MCP (the `mcp` extra)."""

from .client import Action, Checkpoint, Review, Step, SuretyClient, Version
from .errors import (
    PROBLEMS,
    ActionNotDone,
    ActionRejected,
    ApprovalExpired,
    BookingConflict,
    CurrencyNotCovered,
    Forbidden,
    IdempotencyKeyMissing,
    IdempotencyKeyReused,
    Invalid,
    MessageAlreadySent,
    MethodNotAllowed,
    NotAcceptable,
    NotFound,
    OperationKeyExpired,
    Problem,
    RefundAlreadyRecorded,
    SuretyError,
    SuretyUnreachable,
    Throttled,
    Unauthenticated,
    Unreadable,
    Unsendable,
    UnsupportedMediaType,
)
from .keys import booking_key, message_key, operation_key, refund_key, refund_task_id

__all__ = [
    "Action", "Checkpoint", "Review", "Step", "SuretyClient", "Version",
    "PROBLEMS", "ActionNotDone", "ActionRejected", "ApprovalExpired", "BookingConflict", "CurrencyNotCovered", "Forbidden", "IdempotencyKeyMissing", "IdempotencyKeyReused", "Invalid",
    "MessageAlreadySent", "MethodNotAllowed", "NotAcceptable", "NotFound", "OperationKeyExpired", "Problem", "RefundAlreadyRecorded", "SuretyError",
    "SuretyUnreachable", "Throttled", "Unauthenticated", "Unreadable", "Unsendable", "UnsupportedMediaType",
    "booking_key", "message_key", "operation_key", "refund_key", "refund_task_id",
]
