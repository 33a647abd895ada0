"""Input and output of the agents' API. Validation lives here, at the edge."""

import re
import threading
from decimal import Decimal, InvalidOperation
from urllib.parse import quote

import pycountry
from django.utils.functional import cached_property
from django.core.validators import validate_email
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from ledger import money
from ledger.models import Action, ActionType

# ASCII digits only: `\d` also matches digits such as ٢ or ２, which no provider can dial.
PHONE = re.compile(r"\+[1-9][0-9]{6,14}")
MAX_AMOUNT = Decimal("1000000000")


class AmountField(serializers.Field):
    """A decimal string such as "25.00": never a JSON number, positive, with at most the
    decimals the ledger keeps; its currency's own limit is checked beside the currency."""

    default_error_messages = {
        "type": 'Send the amount as a decimal string, e.g. "25.00", not as a number.',
        "invalid": "Not a decimal number.",
        "positive": "Must be greater than zero.",
        "places": f"At most {money.LEDGER_PLACES} decimal places.",
        "large": "Too large.",
    }

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("type")
        if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", data.strip()):
            self.fail("positive" if data.strip().startswith("-") else "invalid")
        try:
            amount = Decimal(data.strip())
        except InvalidOperation:
            self.fail("invalid")
        if amount <= 0:
            self.fail("positive")
        if money.places(amount) > money.LEDGER_PLACES:
            self.fail("places")
        if amount >= MAX_AMOUNT:
            self.fail("large")
        return data.strip()

    def to_representation(self, value):
        return str(value)


class CurrencyField(serializers.CharField):
    def to_internal_value(self, data):
        code = super().to_internal_value(data)
        if len(code) != 3 or not code.isalpha() or pycountry.currencies.get(alpha_3=code.upper()) is None:
            raise serializers.ValidationError("Not an ISO 4217 currency code.")
        return code.upper()


_field_sets = threading.local()


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not know: what is not validated must not reach the ledger.

    Its fields are copied once per thread rather than for every instance: DRF deep-copies
    every declared field of every serializer it builds, a third of a millisecond on each
    request. A thread validates with one instance of a class at a time, and the fields keep
    nothing between calls but their binding, which each instance renews."""

    @cached_property
    def fields(self):
        cache = _field_sets.__dict__.setdefault("by_class", {})
        fields = cache.get(type(self))
        if fields is None:
            fields = cache[type(self)] = super().fields
        else:  # bound as BindingDict bound them, to the instance in hand
            fields.serializer = self
            for field in fields.values():
                field.parent = self
        return fields

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


class RefundParams(StrictSerializer):
    amount = AmountField()
    currency = CurrencyField()
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True)

    def validate(self, data):
        # A provider takes the amount in the currency's minor units: 0.5 JPY cannot be paid.
        digits = money.minor_digits(data["currency"])
        if money.places(Decimal(data["amount"])) > digits:
            raise serializers.ValidationError({"amount": [f"At most {digits} decimal places in {data['currency']}."]})
        return data


class MessageParams(StrictSerializer):
    channel = serializers.ChoiceField(choices=["email", "sms", "whatsapp"])
    message_type = serializers.CharField(max_length=100)
    body = serializers.CharField(max_length=10_000)


class BookingParams(StrictSerializer):
    service = serializers.CharField(max_length=200)
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()

    def validate(self, data):
        if data["end"] <= data["start"]:
            raise serializers.ValidationError({"end": ["Must be after start."]})
        return data


PARAMS = {
    ActionType.REFUND: RefundParams,
    ActionType.SEND_MESSAGE: MessageParams,
    ActionType.CREATE_BOOKING: BookingParams,
}


class ActionRequestSerializer(StrictSerializer):
    action_type = serializers.ChoiceField(choices=ActionType.choices)
    target = serializers.CharField(max_length=255)
    customer = serializers.CharField(max_length=255, required=False, allow_blank=True, allow_null=True, default="")
    decision_id = serializers.CharField(max_length=255, required=False, allow_blank=True, allow_null=True, default="")
    # Only a workflow's steps add actions to a task (the runner executes them while the task
    # runs); an action the API recorded under a task would wait for a runner that never comes.
    task_id = serializers.CharField(max_length=255, required=False, allow_null=True, default=None)
    params = serializers.DictField()

    def validate_task_id(self, value):
        if value is not None:
            raise serializers.ValidationError("Only a workflow's steps add actions to a task: send null or leave it out.")
        return value

    def validate(self, data):
        params = PARAMS[data["action_type"]](data=data["params"])
        if not params.is_valid():
            raise serializers.ValidationError({"params": params.errors})
        clean = dict(params.validated_data)
        for moment in ("start", "end"):
            if moment in clean:
                clean[moment] = clean[moment].isoformat()
        data["params"] = clean
        data["customer"] = data.get("customer") or ""
        data["decision_id"] = data.get("decision_id") or ""
        if data["action_type"] == ActionType.SEND_MESSAGE:
            self._check_recipient(data["target"], clean["channel"])
        if data["action_type"] == ActionType.CREATE_BOOKING and not data["customer"]:
            raise serializers.ValidationError({"customer": ["A booking needs the customer."]})
        return data

    @staticmethod
    def _check_recipient(target, channel):
        if channel == "email":
            try:
                validate_email(target)
            except DjangoValidationError:
                raise serializers.ValidationError({"target": ["Not an e-mail address."]}) from None
        elif not PHONE.fullmatch(target):
            raise serializers.ValidationError({"target": ["Not a phone number in E.164 form (+4930123456)."]})


def asks_again(action, data):
    """Whether the raw body `data` asks exactly what `action` recorded. Such a body was valid
    when it was recorded, so validating it again could only say so; anything else (another
    spelling, a task, a field more) takes the full path."""
    return (
        isinstance(data, dict)
        and data.keys() <= {"action_type", "target", "customer", "decision_id", "task_id", "params"}
        and data.get("task_id") is None
        and action.task_id is None
        and data.get("action_type") == action.action_type
        and data.get("target") == action.target
        and _or_blank(data.get("customer")) == action.customer
        and _or_blank(data.get("decision_id")) == action.decision_id
        and data.get("params") == action.params
    )


def _or_blank(value):
    """What the serializer stores for an optional text field: null or absent -> ""."""
    return "" if value is None else value


class ActionSerializer(serializers.ModelSerializer):
    """The action resource of CONTRACT.md. The fields document the schema; the dict is
    built directly because this runs on every request and replay."""

    task_id = serializers.CharField(allow_null=True)
    url = serializers.CharField()

    class Meta:
        model = Action
        fields = [
            "operation_key", "action_type", "target", "customer", "decision_id", "task_id", "params", "status",
            "attempts", "external_ref", "result", "error", "created_at", "updated_at", "url",
        ]

    def to_representation(self, action):
        return {
            "operation_key": action.operation_key,
            "action_type": action.action_type,
            "target": action.target,
            "customer": action.customer,
            "decision_id": action.decision_id,
            "task_id": action.task.task_id if action.task_id else None,
            "params": action.params,
            "status": action.status,
            "attempts": action.attempts,
            "external_ref": action.external_ref or None,
            "result": action.result,
            "error": action.error,
            "created_at": _utc(action.created_at),
            "updated_at": _utc(action.updated_at),
            "url": f"/api/v1/actions/{quote(action.operation_key, safe='')}",
        }


def _utc(moment):
    return moment.isoformat().replace("+00:00", "Z")

class TaskRequestSerializer(StrictSerializer):
    workflow = serializers.CharField(max_length=100)
    input = serializers.DictField()

    def validate(self, data):
        from ledger.workflows import WORKFLOWS  # the refund workflow's input uses this module's fields

        workflow = WORKFLOWS.get(data["workflow"])
        if workflow is None:
            raise serializers.ValidationError({"workflow": [f"Unknown workflow {data['workflow']!r}."]})
        incoming = workflow.input_serializer(data=data["input"])
        if not incoming.is_valid():
            raise serializers.ValidationError({"input": incoming.errors})
        data["input"] = {k: str(v) if not isinstance(v, (str, int, bool)) else v
                         for k, v in incoming.validated_data.items()}
        return data


def _step_view(step, first_open):
    view = {"status": "running" if step.name == first_open else step.status}
    if step.idempotency_key:
        view["idempotency_key"] = step.idempotency_key
    if step.result is not None:
        view["result"] = step.result
    if step.error:
        view["error"] = step.error
    return view


def checkpoint(task):
    """The checkpoint record of CONTRACT.md, steps in execution order."""
    steps = list(task.steps.all())
    running = task.state == "running"
    first_open = next((s.name for s in steps if s.status != "done"), None) if running else None
    return {
        "task_id": task.task_id,
        "workflow": task.workflow,
        "state": task.state,
        "attempts": task.attempts,
        "max_attempts": task.max_attempts,
        "next_attempt_at": task.next_attempt_at.isoformat() if task.next_attempt_at and task.state == "queued" else None,
        "last_error": task.last_error,
        "steps": {s.name: _step_view(s, first_open) for s in steps},
        "updated_at": _utc(task.updated_at),
        "url": f"/api/v1/tasks/{quote(task.task_id, safe='')}",
    }
