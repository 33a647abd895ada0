"""Input and output of the agents' API. Validation lives here, at the edge (each action type's
params with the serializers in ledger/validation.py, which the ledger's own edits use too)."""

import re
from types import SimpleNamespace
from urllib.parse import quote

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import validate_email
from django.urls import reverse
from rest_framework import serializers

from ledger.models import PERSON_STATUSES, Action, ActionStatus, ActionType, AuditEvent
from ledger.validation import PARAMS, StrictSerializer
from ledger.workflows import WORKFLOWS

# ASCII digits only: `\d` also matches digits such as ٢ or ２, which no provider can dial.
PHONE = re.compile(r"\+[1-9][0-9]{6,14}")


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
            "url": _url(action),
            "review": _review(action),
            "supersedes": action.supersedes.operation_key if action.supersedes_id else None,
            "superseded_by": _version(action),
        }


# Ended without running: the audit event of the move (its verb is the status) says who and why.
DECIDED_NO = {ActionStatus.REJECTED, ActionStatus.CANCELLED, ActionStatus.EXPIRED, ActionStatus.SUPERSEDED}


def _url(action):
    return f"/api/v1/actions/{quote(action.operation_key, safe='')}"


def _version(action):
    """What a person edited a superseded action into, who and why (two reads, only then)."""
    if action.status != ActionStatus.SUPERSEDED:
        return None
    version = Action.objects.get(supersedes=action)
    edited = AuditEvent.objects.history(action).filter(verb=ActionStatus.SUPERSEDED).values("actor", "reason").last()
    return {"operation_key": version.operation_key, "url": _url(version), "status": version.status,
            "params": version.params, "by": edited["actor"], "reason": edited["reason"]}


def _review(action):
    """Where a person decides on the action, and who said no and why: the agent is told the
    reason instead of a bare status. Only a refused action costs a read (of its audit trail)."""
    if action.status not in PERSON_STATUSES and action.status not in DECIDED_NO:
        return None
    url = settings.SITE_URL.rstrip("/") + reverse("action-detail", args=[action.pk])
    if action.status in PERSON_STATUSES:
        return {"url": url, "by": None, "reason": None}
    decided = AuditEvent.objects.history(action).filter(verb=action.status).values("actor", "reason").last()
    return {"url": url, "by": decided and decided["actor"], "reason": decided and decided["reason"]}


def _utc(moment):
    return moment.isoformat().replace("+00:00", "Z")

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
    """The checkpoint record of docs/contract.md, steps in execution order."""
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
