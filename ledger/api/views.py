"""The agents' API: one view per operation, no business logic here."""

import re
import time
from contextlib import contextmanager
from urllib.parse import unquote

from django.conf import settings
from django.db import InterfaceError, InternalError, OperationalError
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.exceptions import APIException
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger.actions import DecisionTaken, KeyReused, Refused, SlotTaken, action_by_pk, action_request
from ledger.evidence import evidence_actions, evidence_record
from ledger.grants import grant_state
from ledger.metrics import API_KEY_REUSED, API_REPLAYS
from ledger.models import Action, ActionStatus, ActionType, Capability, GrantState, Task, TaskState
from ledger.outages import close_broken_connection, connection_lost, rolled_back, too_large
from ledger.resources import checkpoint
from ledger.retention import KEY_EXPIRES_HEADER, ArchivedKey, ArchivedTask, KeyExpired, key_expired, key_expires_at, rfc3339
from ledger.tasks import task_request

from .wire import well_formed_key
from .evidence_schema import evidence_record_serializer
from .openapi import (
    ACTION_REQUEST, COMMON_PROBLEMS, KEY_EXPIRED, KEY_EXPIRES, KEY_HEADER, PROBLEM_JSON, REPLAYED, RETRY_AFTER,
    TASK_ID_HEADER, TASK_REQUEST, WAIT, ApiSchema, CheckpointSerializer, intake_description, intake_responses,
    links_to, path_key, problem, read_responses,
)
from .problems import Problem
from .serializers import (
    ActionRequestSerializer, ActionSerializer, TaskRequestSerializer, asks_again, task_id_room,
)

UNSETTLED_ACTION = {ActionStatus.QUEUED, ActionStatus.PENDING, ActionStatus.UNKNOWN}


def idempotency_key(request):
    key = request.headers.get("Idempotency-Key")
    # A header with nothing in it sends no key: an HTTP field's value has no whitespace around it
    # (RFC 9110, 5.5), which gunicorn strips, so an empty one and a blank one arrive alike.
    if key is None or not key.strip(" \t"):
        raise Problem(400, "idempotency_key_missing", "Idempotency-Key missing",
                      "Send the operation key in the Idempotency-Key header.")
    if not well_formed_key(key):
        raise Problem(400, "invalid", "Invalid request", "The Idempotency-Key is not valid.",
                      {"Idempotency-Key": ["1 to 255 printable ASCII characters."]})
    return key


def key_reused(request, key, existing=None):
    API_KEY_REUSED.labels(request.auth.name).inc()
    if existing is not None and getattr(existing, "operation_key", key) != key:
        return Problem(422, "idempotency_key_reused", "Decision already recorded",
                       f"This decision's {existing.action_type} is recorded under the key "
                       f"{existing.operation_key!r} with other params; nothing was changed. Do not retry it "
                       "with other params.", recorded_under=existing.operation_key)
    return Problem(422, "idempotency_key_reused", "Idempotency-Key reused",
                   f"The key {key!r} was already used for a different request; nothing was changed.")


def key_expired_problem(key, expires_at):
    return Problem(410, "operation_key_expired", "Operation key expired",
                   f"The key {key!r} named its request until {rfc3339(expires_at)} (a lifetime of "
                   f"{settings.OPERATION_KEY_LIFETIME_DAYS} days): nothing is executed or answered under it any "
                   "more. A new effect needs a new key.")


def refuse_expired(key, obj):
    """410 for a request under a key past its lifetime: `obj` is what the key names (an
    action or a task) or something else the intake found (another key's action)."""
    if key in (getattr(obj, "operation_key", None), getattr(obj, "task_id", None)) and key_expired(obj.created_at):
        raise key_expired_problem(key, key_expires_at(obj.created_at))


def answer(body, obj, status=200, headers=None):
    """An answer about an action or task, with the time its key stops naming it."""
    return Response(body, status=status,
                    headers={**(headers or {}), KEY_EXPIRES_HEADER: rfc3339(key_expires_at(obj.created_at))})


def wait_seconds(request):
    raw = request.query_params.get("wait")
    if raw is None:
        return 0
    try:
        # A number as JSON writes one (exponent and all): Python's float() also reads "1_0", " 5 " and
        # other scripts' digits ("١٠" is 10).
        if not raw.isascii() or "_" in raw or raw != raw.strip():
            raise ValueError(raw)
        value = float(raw)
    except ValueError:
        raise Problem(400, "invalid", "Invalid request", "wait must be a number of seconds.",
                      {"wait": ["A number of seconds, 0 to 30."]}) from None
    if not 0 <= value <= settings.API_MAX_WAIT_SECONDS:
        raise Problem(400, "invalid", "Invalid request", "wait must be between 0 and 30.",
                      {"wait": ["A number of seconds, 0 to 30."]})
    return value


def poll(load, unsettled, seconds):
    """Re-read until the object leaves the unsettled states or time runs out."""
    obj = load()
    deadline = time.monotonic() + seconds
    while unsettled(obj) and time.monotonic() < deadline:
        time.sleep(0.1)
        obj = load()
    return obj


def require_grant(agent, kind, name):
    """The grant's state (live or shadow); 403 without one."""
    state = grant_state(agent, kind, name)
    if state is None:
        raise Problem(403, "forbidden", "Forbidden", f"This agent may not use {name}.")
    return state


INTAKE_ATTEMPTS = 2


def intake_through_transient_failures(intake):
    """Run `intake`, again if the database rolled it back to break a deadlock (two
    transactions on the same target or customer that took their locks in another order), or
    on a fresh connection if the connection died under it (a failover, a restarted pooler):
    the intake is idempotent by key, so a commit that went through before the connection
    died is found again as a replay. A 503 problem if it cannot get through (`busy`, or
    `database_unavailable` from ledger.api.unavailable): nothing was half-written, the same
    request may be sent again."""
    for attempt in range(INTAKE_ATTEMPTS):
        try:
            return intake()
        # InternalError too: a session the server ended in its transaction for idling (25P03) is one
        # to psycopg; connection_lost tells it by its SQLSTATE, and any other one is raised as before.
        except (OperationalError, InterfaceError, InternalError) as exc:
            if connection_lost(exc) and attempt + 1 < INTAKE_ATTEMPTS:
                close_broken_connection()
                continue
            if too_large(exc):  # the edge's bounds (ledger.api.serializers) should have refused it
                raise Problem(400, "invalid", "Too large to store", "The database refused to store this request "
                              "(a field, or the fields together, past what it can index); nothing was recorded. "
                              "Shorten it: the same request fails the same way.") from exc
            if not rolled_back(exc):  # running it again records the request at most once (the key is unique)
                raise
    busy = Problem(503, "busy", "Busy", "The ledger was busy with the same target or customer; nothing was "
                   "recorded. Send the same request again.")
    busy.wait = 1
    raise busy


# Another agent's action holds the decision's effect (ledger.actions.same_decision).
DECISION_TAKEN = {
    ActionType.SEND_MESSAGE: ("message_already_sent", "Message already sent",
                              "Another agent's message to this recipient, of this type, for this decision is "
                              "recorded; nothing was recorded."),
    ActionType.REFUND: ("refund_already_recorded", "Refund already recorded",
                        "Another agent's refund of this order for this decision is recorded; nothing was recorded."),
    ActionType.CREATE_BOOKING: ("booking_conflict", "Booking already recorded",
                                "Another agent's booking of this resource for this customer and decision is "
                                "recorded; nothing was recorded."),
}


def recorded(request, key, intake, represent):
    """The shared answer of both intakes: 201 new; 200 replayed; 410 for a key past its
    lifetime (ledger.retention), archived or not; 422 for a key that names another request or
    belongs to another agent (whose objects are never shown); 409 for a booking whose slot is
    taken; 422 for a request the limits refuse (LIMITS_UNCOVERED_CURRENCY); 503 when the
    database stays deadlocked."""
    try:
        obj, created = intake_through_transient_failures(intake)
    except KeyExpired as exc:
        if exc.agent_id != request.auth.pk:  # another agent's key, archived or not, tells nothing
            raise key_reused(request, key) from None
        raise key_expired_problem(exc.key, exc.expires_at) from None
    except KeyReused as exc:
        if exc.existing.agent_id == request.auth.pk:
            refuse_expired(key, exc.existing)
        raise key_reused(request, key, exc.existing) from None
    except SlotTaken as exc:
        raise Problem(409, "booking_conflict", "Slot taken", f"{exc}; nothing was recorded.") from None
    except Refused as exc:
        raise Problem(422, exc.code, "Refused by the limits", f"{exc}; nothing was recorded.") from None
    except DecisionTaken as exc:
        raise Problem(409, *DECISION_TAKEN[exc.existing.action_type]) from None
    if obj.agent_id != request.auth.pk:
        raise key_reused(request, key)
    if created:
        return answer(represent(obj), obj, status=201)
    refuse_expired(key, obj)
    return replayed(request, represent(obj), obj)


def replayed(request, body, obj):
    API_REPLAYS.labels(request.auth.name).inc()
    return answer(body, obj, headers={"Idempotent-Replayed": "true"})


def load_own(queryset, what, gone=lambda: None):
    """`gone`: the problem to answer instead of a 404 (an archived action's 410), or None."""
    def load():
        found = queryset.first()
        if found is None:
            raise gone() or Problem(404, "not_found", "Not found", f"No such {what}.")
        return found

    return load


EVIDENCE_LINK = {"read_evidence": {
    "operationId": "actions_evidence_retrieve", "parameters": {"operation_key": "$response.body#/operation_key"},
    "description": "Read the action's evidence record.",
}}


class AgentView(APIView):
    """A path of the agents' API: it answers the methods it lists and 405 `method_not_allowed` to
    any other, OPTIONS too (DRF answers it with a description of the view, 200, a method the
    document lists on no path)."""

    http_method_names = [method for method in APIView.http_method_names if method != "options"]


class ActionCreateView(AgentView):
    finds_key = True  # see AgentTokenAuthentication
    schema = ApiSchema()
    openapi_links = {status: {**link, **EVIDENCE_LINK}
                     for status, link in links_to("actions_retrieve", "operation_key").items()}

    @extend_schema(
        operation_id="actions_create", parameters=[KEY_HEADER, REPLAYED, RETRY_AFTER, KEY_EXPIRES],
        request=ACTION_REQUEST,
        responses=intake_responses(ActionSerializer),
        description=intake_description(
            "Request one guarded effect. Same key and body again: 200 with `Idempotent-Replayed: true`, nothing "
            "executed again. While the agent's grant for the action type is shadow (not yet made live by a "
            "person after the replay set passed), the action is recorded with status `shadow` and never "
            "executed."),
    )
    def post(self, request):
        key = idempotency_key(request)
        agent = request.auth
        stored = action_by_pk(agent.key_action_id) if agent.key_action_id else None
        if stored is not None and stored.agent_id == agent.pk:
            refuse_expired(key, stored)
            if asks_again(stored, request.data):
                # The very request that was recorded (so valid as it was): answered from the row.
                require_grant(agent, Capability.Kind.ACTION_TYPE, stored.action_type)
                return replayed(request, ActionSerializer(stored).data, stored)
        with gone_whatever_the_body(ArchivedKey.objects.filter(agent=agent, operation_key=key), key):
            incoming = ActionRequestSerializer(data=request.data)
            incoming.is_valid(raise_exception=True)
            data = incoming.validated_data
            state = require_grant(agent, Capability.Kind.ACTION_TYPE, data["action_type"])
        return recorded(request, key, lambda: action_request(
            agent=agent, operation_key=key, action_type=data["action_type"], target=data["target"],
            customer=data["customer"], decision_id=data["decision_id"], params=data["params"],
            limits_version=agent.limits_version, shadow=state == GrantState.SHADOW,
        ), lambda action: ActionSerializer(action).data)


class ActionDetailView(AgentView):
    @extend_schema(
        operation_id="actions_retrieve",
        responses={**read_responses(ActionSerializer, "action"), (410, PROBLEM_JSON): problem(KEY_EXPIRED)},
        parameters=[path_key("operation_key", "The action's operation key."), WAIT, RETRY_AFTER, KEY_EXPIRES],
    )
    def get(self, request, operation_key):
        seconds = wait_seconds(request)
        load = own_action(request, operation_key, Action.objects.select_related("task"))
        action = poll(load, lambda a: a.status in UNSETTLED_ACTION, seconds)
        return answer(ActionSerializer(action).data, action)


def own_action(request, operation_key, queryset):
    mine = queryset.filter(agent=request.auth, operation_key=operation_key)
    if "\x00" in operation_key:  # PostgreSQL text holds no NUL, so no key has one (nor any archived key)
        return load_own(mine.none(), "action")
    return load_own(mine, "action", gone=lambda: archived(
        ArchivedKey.objects.filter(agent=request.auth, operation_key=operation_key), operation_key))


def archived(mine, key):
    """The 410 for a key of this agent's (`mine`: its ArchivedKey or ArchivedTask) whose action or
    task was archived (ledger.retention), or None."""
    found = mine.first()
    return None if found is None else key_expired_problem(key, found.expires_at)


@contextmanager
def gone_whatever_the_body(mine, key):
    """A request refused before the intake (its body, its grant) under a key of this agent's
    whose action or task was archived (`mine`: its ArchivedKey or ArchivedTask) is answered `410`
    all the same: the contract's "whatever the body" (one past its lifetime still unarchived, the
    view refuses as it reads its row). Looked up only then, so that a request that gets through
    costs no statement for it (the intake's insert finds an archived key by itself, ledger.dbrules)."""
    try:
        yield
    except APIException:
        gone = archived(mine, key)
        if gone is not None:
            raise gone from None
        raise


ENCODED_SLASH = re.compile("%2f", re.IGNORECASE)


def key_ends_in_evidence(request):
    """Whether the URL named an action whose own key ends in "/evidence" ("%2Fevidence", or
    any other spelling of it, "%2F%65vidence"): the server decodes the path before it is
    routed, so such a read reaches the evidence view too. gunicorn passes the path as it was
    sent (RAW_URI), which tells them apart once every escape but a "/"'s is decoded."""
    path = request.META.get("RAW_URI", "").split("?", 1)[0]
    return "%2F".join(unquote(piece) for piece in ENCODED_SLASH.split(path)).lower().endswith("%2fevidence")


def evidence_view(sections):
    """The evidence record's read, with `sections` (ledger.evidence.EvidenceSection) in the
    record and in the document (the product's are composed in console.evidence)."""
    record = evidence_record_serializer(sections)

    class ActionEvidenceView(AgentView):
        @extend_schema(
            operation_id="actions_evidence_retrieve",
            parameters=[path_key("operation_key", "The action's operation key."), RETRY_AFTER, KEY_EXPIRES],
            responses={200: OpenApiResponse(record, description="The action's evidence record."),
                       **COMMON_PROBLEMS,
                       (404, PROBLEM_JSON): problem("`not_found`: no such action, or another agent's."),
                       (410, PROBLEM_JSON): problem(KEY_EXPIRED)},
            description="The action's evidence record: the request, the agent and its grant, the provider's "
            "evidence, webhooks, review items and the limit in force, dead-letter entries and alerts, and every "
            "audit event covering them with its place in the hash chain, digested and signed "
            "(`manage.py evidence_verify` checks a saved record). Staff's e-mail addresses (a limit's alert tiers) "
            "are withheld, each `{\"withheld\": n}`; an event so shown names them in `redacted`.",
        )
        def get(self, request, operation_key):
            if key_ends_in_evidence(request):
                return ActionDetailView().get(request, f"{operation_key}/evidence")
            action = own_action(request, operation_key, evidence_actions())()
            return answer(evidence_record(action, sections), action)

    return ActionEvidenceView.as_view()


UNSETTLED_TASK = {TaskState.QUEUED, TaskState.RUNNING}


class TaskCreateView(AgentView):
    schema = ApiSchema()
    openapi_links = links_to("tasks_retrieve", "task_id")

    @extend_schema(
        operation_id="tasks_create", parameters=[TASK_ID_HEADER, REPLAYED, RETRY_AFTER, KEY_EXPIRES],
        request=TASK_REQUEST, responses=intake_responses(CheckpointSerializer),
        description=intake_description("Start a multi-step task; the Idempotency-Key is the task id. Returns the "
                                       "checkpoint."),
    )
    def post(self, request):
        task_id = idempotency_key(request)
        agent = request.auth
        # The intake's own look for the id (anyone's: another agent's is refused there), taken
        # before the body is validated, so that a replay is answered from the row (decision 71).
        found = Task.objects.filter(task_id=task_id).first()
        stored = found if found is not None and found.agent_id == agent.pk else None
        if stored is not None:
            refuse_expired(task_id, stored)
            if task_asks_again(stored, request.data):
                require_grant(agent, Capability.Kind.WORKFLOW, stored.workflow)
                return replayed(request, checkpoint(stored), stored)
        with gone_whatever_the_body(ArchivedTask.objects.filter(agent=agent, task_id=task_id), task_id):
            incoming = TaskRequestSerializer(data=request.data, context={"recorded": lambda: stored is not None})
            incoming.is_valid(raise_exception=True)
            data = incoming.validated_data
            room = task_id_room(data["workflow"])
            if len(task_id) > room:
                raise Problem(400, "invalid", "Invalid request", f"A {data['workflow']} task's id is too long.",
                              {"Idempotency-Key": [f"At most {room} characters: the steps' keys add their names to it."]})
            require_grant(agent, Capability.Kind.WORKFLOW, data["workflow"])
        return recorded(request, task_id, lambda: task_request(
            agent=agent, task_id=task_id, workflow=data["workflow"], input=data["input"], found=found,
        ), checkpoint)


def task_asks_again(task, data):
    """Whether the raw body `data` asks exactly what `task` recorded: its workflow, and its input
    as stored (the form a client that sent it canonical sends again). Such a body was valid when
    it was recorded, and its answer stays the same for the key's lifetime, whatever rules came
    since (a currency no longer tender); anything else takes the full path, as for an action
    (serializers.asks_again)."""
    return (isinstance(data, dict) and data.keys() == {"workflow", "input"}
            and data["workflow"] == task.workflow and data["input"] == task.input)


class TaskDetailView(AgentView):
    @extend_schema(
        operation_id="tasks_retrieve",
        responses={**read_responses(CheckpointSerializer, "task"), (410, PROBLEM_JSON): problem(KEY_EXPIRED)},
        parameters=[path_key("task_id", "The task's id (the key it was started with)."), WAIT, RETRY_AFTER,
                    KEY_EXPIRES],
    )
    def get(self, request, task_id):
        seconds = wait_seconds(request)
        mine = Task.objects.filter(agent=request.auth, task_id=task_id)
        if "\x00" in task_id:  # PostgreSQL text holds no NUL, so no task id has one (nor any archived one)
            load = load_own(mine.none(), "task")
        else:
            load = load_own(mine, "task", gone=lambda: archived(
                ArchivedTask.objects.filter(agent=request.auth, task_id=task_id), task_id))
        task = poll(load, lambda t: t.state in UNSETTLED_TASK, seconds)
        return answer(checkpoint(task), task)
