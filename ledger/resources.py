"""The resources of docs/contract.md as plain data: an action, and a task's checkpoint, as the
API answers them (ledger.api.serializers describes them for the OpenAPI document) and as a
dead-letter entry keeps them in its snapshot."""

from django.conf import settings
from django.urls import reverse

from .key_paths import resource_segment
from .models import PERSON_STATUSES, Action, ActionStatus, AuditEvent


def action_resource(action):
    """The action resource; built directly, not through a serializer, because it is made on
    every request and replay."""
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
    return f"/api/v1/actions/{resource_segment(action.operation_key)}"


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
        "url": f"/api/v1/tasks/{resource_segment(task.task_id)}",
    }
