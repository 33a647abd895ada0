"""Input and output of the agents' API. Validation lives here, at the edge (each action type's
params with the serializers in ledger/validation.py, which the ledger's own edits use too)."""

import re
from types import SimpleNamespace

from django.core.validators import BaseValidator
from rest_framework import serializers

from ledger.models import Action, ActionStatus, ActionType
from ledger.resources import action_resource
from ledger.validation import PARAMS, CustomerField, StrictSerializer
from ledger.recipients import TARGET_LENGTH, RecipientRefused, email_recipient_checked
from ledger.workflows import WORKFLOWS

# ASCII digits only: `\d` also matches digits such as ٢ or ２, which no provider can dial.
PHONE = re.compile(r"\+[1-9][0-9]{6,14}")
# A booking's once-per-decision index (ledger.models) holds its target, customer and decision_id in
# one btree row, which PostgreSQL caps at 2704 bytes: 255 characters of 4 bytes each make 3,060
# (refused at the INSERT, the same on every retry), three fields of 800 bytes about 2,420.
INDEXED_BYTES = 800


class MaxBytesValidator(BaseValidator):
    """Django's MaxLengthValidator, counting bytes in UTF-8 instead of characters."""

    message = "At most %(limit_value)d bytes in UTF-8 (this has %(show_value)d)."
    code = "max_bytes"

    def compare(self, a, b):
        return a > b

    def clean(self, x):
        return len(x.encode())


def indexed_text(max_length=255, field=serializers.CharField, **kwargs):
    """Text the ledger's unique indexes hold: at most its column's characters, and INDEXED_BYTES."""
    return field(max_length=max_length, validators=[MaxBytesValidator(INDEXED_BYTES)],
                                 help_text=f"At most {max_length} characters and {INDEXED_BYTES} bytes in UTF-8.",
                                 **kwargs)


class ActionRequestSerializer(StrictSerializer):
    action_type = serializers.ChoiceField(choices=ActionType.choices)
    target = indexed_text(TARGET_LENGTH)
    customer = indexed_text(field=CustomerField, required=False, allow_blank=True, allow_null=True, default="")
    decision_id = indexed_text(required=False, allow_blank=True, allow_null=True, default="")
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
            data["target"] = self._recipient(data["target"], clean["channel"])
        if data["action_type"] == ActionType.CREATE_BOOKING and not data["customer"]:
            raise serializers.ValidationError({"customer": ["A booking needs the customer."]})
        return data

    @staticmethod
    def _recipient(target, channel):
        """The recipient, checked, as one message per recipient is held (an e-mail address as the
        mail is sent to it: ledger.recipients), so that the same address written otherwise is not
        a second recipient."""
        if channel == "email":
            try:
                return email_recipient_checked(target)
            except RecipientRefused as refused:
                said = (f"At most {TARGET_LENGTH} characters as it is sent to (its domain in ASCII)."
                        if refused.is_address else "Not an e-mail address.")
                raise serializers.ValidationError({"target": [said]}) from None
        if not PHONE.fullmatch(target):
            raise serializers.ValidationError({"target": ["Not a phone number in E.164 form (+4930123456)."]})
        return target


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


class ReviewSerializer(serializers.Serializer):
    """Where a person decides on an action, and once it ended without running, who and why."""

    url = serializers.URLField(help_text="The action's page on the dashboard.")
    by = serializers.CharField(allow_null=True, help_text="Who rejected, cancelled or edited it (`system:approvals` "
                               "when its approval expired); null while undecided.")
    reason = serializers.CharField(allow_null=True, help_text="Why; null while undecided.")


class VersionSerializer(serializers.Serializer):
    """The version a person edited a superseded action into: it runs in the action's place."""

    operation_key = serializers.CharField(help_text="The version's own key: the original's with `~v2` (`~v3`, …).")
    url = serializers.CharField()
    status = serializers.ChoiceField(choices=ActionStatus.choices)
    params = serializers.DictField(help_text="The params the person approved.")
    by = serializers.CharField(help_text="Who edited it.")
    reason = serializers.CharField(help_text="Why.")


class ActionSerializer(serializers.ModelSerializer):
    """The action resource of docs/contract.md. The fields document the schema; the dict is
    built directly because this runs on every request and replay."""

    task_id = serializers.CharField(allow_null=True)
    url = serializers.CharField()
    review = ReviewSerializer(
        allow_null=True,
        help_text="Null unless a person must decide (awaiting_approval, held, needs_review), said no "
        "(rejected, cancelled) or edited it (superseded), or nobody decided in time (expired).",
    )
    supersedes = serializers.CharField(
        allow_null=True, help_text="The operation key of the action a person edited down into this version; "
        "null for an action an agent requested.")
    superseded_by = VersionSerializer(
        allow_null=True, help_text="Null unless superseded: the version a person edited this action into, which "
        "runs in its place.")

    class Meta:
        model = Action
        fields = [
            "operation_key", "action_type", "target", "customer", "decision_id", "task_id", "params", "status",
            "attempts", "external_ref", "result", "error", "created_at", "updated_at", "url", "review",
            "supersedes", "superseded_by",
        ]

    def to_representation(self, action):
        # The dict is ledger.resources' (a dead-letter entry's snapshot keeps it too).
        return action_resource(action)


def task_id_room(workflow):
    """The longest task id a workflow takes: its steps' keys are the task id and a suffix
    (`:call_refund_api:v1`), and a key holds as many characters as an operation key."""
    suffixes = [len(step.key(_NO_ID)) for step in WORKFLOWS[workflow].steps]
    return Action._meta.get_field("operation_key").max_length - max(suffixes, default=0)


_NO_ID = SimpleNamespace(task_id="")


class TaskRequestSerializer(StrictSerializer):
    workflow = serializers.CharField(max_length=100)
    input = serializers.DictField()

    def validate(self, data):
        workflow = WORKFLOWS.get(data["workflow"])
        if workflow is None:
            raise serializers.ValidationError({"workflow": [f"Unknown workflow {data['workflow']!r}."]})
        # context["recorded"]: asks whether a task is recorded under this id already (the view's);
        # a workflow may hold a new task to rules that came after it (ledger.workflows.refund).
        incoming = workflow.input_serializer(data=data["input"], context=self.context)
        if not incoming.is_valid():
            raise serializers.ValidationError({"input": incoming.errors})
        data["input"] = {k: str(v) if not isinstance(v, (str, int, bool)) else v
                         for k, v in incoming.validated_data.items()}
        return data
