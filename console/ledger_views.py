"""Dashboard pages about the ledger itself: overview, search, details, agents, audit log."""

import csv
import json

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db.models import IntegerField, OuterRef, Q, Subquery
from django.http import Http404, HttpResponseBadRequest, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_POST

from ledger.access import WORK_DLQ, user_may
from ledger.agents import agent_create, agent_name_owner, agent_rotate_token, capabilities_named
from ledger.connectors import connector_name
from ledger.connectors.test_mode import REPLAY_AGENT, REPLAY_KEY_PREFIX
from ledger.counts import HISTORY_EXACT_UP_TO, action_counts
from ledger.grants import GrantRefused, agent_grant, agent_revoke
from ledger.models import (UNASSIGNED_OWNER, Action, ActionStatus, ActionType, Agent, AuditEvent,
                           Capability, ChainCheck, ChainWalk, Task, TaskState)
from ledger.tasks import task_run_now
from ledger.workflows import WORKFLOWS

from .dashboard import keyset_page, past_cap, render_partial, shown_estimate, staff_required
from .filters import ActionSearchFilters, AuditFilters
from .overview import overview_cards
from .readiness_views import with_grant_states
from .stepup import step_up_required

STATUS_ORDER = list(ActionStatus.values)
# The fragments of the overview htmx may ask for by name (?partial=): its counts' poll. The
# template's other partials are pieces of the page (`event` is a row of the activity list, and
# rendered without one it failed: a 500).
OVERVIEW_FRAGMENTS = ("counts",)


def _status_counts():
    """Actions per status for the overview, which every open dashboard polls every 3 s: exact
    where it matters, an estimate such as "≈930,000" where only the order of magnitude does
    (see ledger.counts.action_counts). Returns {status: int, or str for an estimate}."""
    counts, estimates = action_counts()
    return {status: shown_estimate(estimates[status], HISTORY_EXACT_UP_TO) if status in estimates else n
            for status, n in counts.items()}


@staff_required
def overview(request):
    partial = request.GET.get("partial")
    if request.htmx and partial and partial not in OVERVIEW_FRAGMENTS:
        return HttpResponseBadRequest("no such fragment")
    now = timezone.now()
    counts = _status_counts()
    context = {
        "counts": [(s, counts.get(s, 0)) for s in STATUS_ORDER],
        "cards": overview_cards(request.user, now),
        "recent": _recent_activity()[:15],
        "audit_unsealed": AuditEvent.objects.unsealed_for(settings.AUDIT_SEAL_ALERT_SECONDS),
        "refreshed_at": now,
    }
    return render_partial(request, "ledger/overview.html", partial, context)


def _recent_activity():
    """The audit log newest first, without the replay set's internals: its agent's requests
    and what became of its `replay:` actions are the connector's test, not anyone's activity
    (the run itself, started and ended, stays)."""
    replay_labels = Q(object_label__startswith=REPLAY_KEY_PREFIX) | Q(object_label__contains=f"({REPLAY_KEY_PREFIX}")
    return AuditEvent.objects.exclude(actor=f"agent:{REPLAY_AGENT}").exclude(replay_labels).order_by("-id")


@staff_required
def ledger_search(request):
    form = ActionSearchFilters(request.GET)
    q = form.values()
    actions = Action.objects.select_related("agent", "task")
    if q["key"]:
        actions = actions.filter(operation_key__startswith=q["key"])
    for field in ("target", "customer"):
        if q[field]:
            actions = _matching(actions, field, q[field])
    if q["agent"]:
        # By the agent's id rather than a join on its name: with the id the planner knows from
        # agent_id's statistics how many actions the agent has and reads action_agent_idx in
        # order; with the join it has to guess, and for an agent with few or no actions it walked
        # the whole ledger newest first (~600 ms at 1M actions). An unknown name matches nothing.
        agent_id = Agent.objects.filter(name=q["agent"]).values_list("pk", flat=True).first()
        actions = actions.filter(agent_id=agent_id) if agent_id is not None else actions.none()
    if q["status"]:
        actions = actions.filter(status=q["status"])
    if q["since"]:
        actions = actions.filter(created_at__gte=q["since"])
    if q["until"]:
        actions = actions.filter(created_at__lt=q["until"])
    rows, next_cursor = keyset_page(actions, q["after"])
    filters = form.echo()
    context = {"rows": rows, "next_cursor": next_cursor, "filters": filters, "statuses": STATUS_ORDER,
               "query": filters.urlencode(), "agents": Agent.objects.values_list("name", flat=True)}
    return render_partial(request, "ledger/search.html", "results" if request.htmx else None, context)


def _matching(actions, field, text):
    """The target or customer as written (action_target_idx, action_customer_idx answer it),
    else any whose id starts so in any case ("cust-17" finds CUST-17 and CUST-170): people
    type ids from e-mails and tickets, not from the ledger."""
    exact = actions.filter(**{field: text})
    return exact if exact.exists() else actions.filter(**{f"{field}__istartswith": text})


@staff_required
def action_detail(request, pk):
    action = get_object_or_404(Action.objects.select_related("agent", "task"), pk=pk)
    context = {"action": action, "history": AuditEvent.objects.history(action),
               "connector": connector_name(action.action_type) or "none configured",
               "items": action.review_items.order_by("-id"),
               "siblings": Action.objects.filter(target=action.target).exclude(pk=action.pk).order_by("-id")[:10]}
    return render(request, "ledger/action_detail.html", context)


@staff_required
def task_detail(request, pk):
    task = get_object_or_404(Task.objects.select_related("agent"), pk=pk)
    context = {"task": task, "steps": task.steps.all(), "history": AuditEvent.objects.history(task),
               "actions": task.actions.order_by("id"), "dead_letters": task.dead_letters.order_by("-id"),
               "may_run": user_may(request.user, WORK_DLQ, Capability.Kind.WORKFLOW, task.workflow)}
    return render(request, "ledger/task_detail.html", context)


@staff_required
@require_POST
def task_run_now_view(request, pk):
    task = get_object_or_404(Task, pk=pk)
    if not user_may(request.user, WORK_DLQ, Capability.Kind.WORKFLOW, task.workflow):
        raise PermissionDenied("you may not run tasks of this workflow")
    task = task_run_now(task, actor=request.user)
    if task.state == TaskState.QUEUED:
        messages.success(request, f"{task.task_id} will run now.")
    else:  # a worker took it, or it ended, since the page was opened
        messages.error(request, f"Not done: {task.task_id} is {task.state} now; only a queued task waits to run.")
    return redirect("task-detail", pk=pk)


# --- agents -----------------------------------------------------------------------------------


def _agents_admin(request):
    if not request.user.has_perm("ledger.change_agent"):
        raise PermissionDenied("managing agents needs the change_agent permission")


# Creating an agent or rotating its token shows a working token, which moves money at once
# under the agent's live grants: a fresh second factor first, as for every money decision.
@staff_required
@step_up_required
def agent_list(request):
    if request.method == "POST":
        _agents_admin(request)
        name = request.POST.get("name", "").strip()
        grants = request.POST.getlist("grant")
        # The person responsible for the agent (four eyes: never its approver); the creator unless named.
        owner = _people().filter(username=request.POST.get("owner") or request.user.get_username()).first()
        try:
            agent, token = agent_create(name, actor=request.user, grants=grants, owner=owner)
        except ValueError as exc:
            messages.error(request, str(exc))
            return redirect("agent-list")
        return _token_page(request, agent, token)
    # Each agent's actions counted up to HISTORY_EXACT_UP_TO, "1,000+" past it: counting them all
    # read the ledger's whole history on every visit (decision 38); the ledger search lists them.
    firsts = Action.objects.filter(agent=OuterRef("pk")).order_by().values("pk")[:HISTORY_EXACT_UP_TO + 1]
    agents = with_grant_states(Agent.objects.select_related("owner").annotate(actions_count=_CountOf(firsts)))
    grantable = sorted({*ActionType.values, *WORKFLOWS})
    connectors = [(action_type, connector_name(action_type) or "none configured") for action_type in ActionType.values]
    return render(request, "ledger/agents.html", {"agents": agents, "grantable": grantable, "people": _people(),
                                                   "connectors": connectors,
                                                   "unassigned": UNASSIGNED_OWNER,
                                                   "counted_up_to": HISTORY_EXACT_UP_TO,
                                                   "counted_past": past_cap(HISTORY_EXACT_UP_TO),
                                                   "may_manage": request.user.has_perm("ledger.change_agent")})


def _token_page(request, agent, token):
    """The page that shows a new token, which moves money at once: kept by no cache (no-store)."""
    response = render(request, "ledger/agent_token.html", {"agent": agent, "token": token})
    add_never_cache_headers(response)
    return response


class _CountOf(Subquery):
    """How many rows a (sliced) subquery has: a count that stops at its LIMIT."""

    template = "(SELECT count(*) FROM (%(subquery)s) AS counted)"
    output_field = IntegerField()


def _people():
    """Who may own an agent: active people, not the agents' own users."""
    return get_user_model().objects.filter(is_active=True, agent__isnull=True).order_by("username")


@staff_required
@require_POST
@step_up_required
def agent_change(request, pk, op):
    _agents_admin(request)
    agent = get_object_or_404(Agent, pk=pk)
    reason = request.POST.get("reason", "")
    # Any op but "grant" and "rotate" used to revoke (POST /agents/1/delete took
    # the capability away). Only the known operations are done.
    if op not in ("grant", "revoke", "rotate", "owner"):
        raise Http404("unknown operation")
    if op == "owner":
        owner = _people().filter(username=request.POST.get("owner", "")).first()
        try:
            agent_name_owner(agent, owner, actor=request.user, reason=reason)
        except ValueError as exc:
            messages.error(request, f"Not done: {exc}.")
            return redirect("agent-list")
        messages.success(request, f"{owner.get_username()} owns {agent.name} now.")
        return redirect("agent-list")
    if op == "rotate":
        try:
            token = agent_rotate_token(agent, actor=request.user, reason=reason)
        except ValueError as exc:
            messages.error(request, f"Not done: {exc}.")
            return redirect("agent-list")
        return _token_page(request, agent, token)
    try:
        capabilities = capabilities_named(request.POST.get("capability", ""))
    except ValueError as exc:
        messages.error(request, str(exc))
        return redirect("agent-list")
    try:  # one reason for every capability named: refused at the first, before any change
        for capability in capabilities:
            (agent_grant if op == "grant" else agent_revoke)(agent, capability, actor=request.user, reason=reason)
    except GrantRefused as exc:
        messages.error(request, f"Not done: {exc}.")
        return redirect("agent-list")
    messages.success(request, f"{op} {request.POST.get('capability')} for {agent.name}: done.")
    return redirect("agent-list")


# --- audit log ----------------------------------------------------------------------------------


def _audit_filtered(q):
    events = AuditEvent.objects.all()
    for field in ("actor", "verb", "object_type", "object_id"):
        if q[field]:
            events = events.filter(**{field: q[field]})
    if q["since"]:
        events = events.filter(occurred_at__gte=q["since"])
    return events


@staff_required
def audit_log(request):
    if not request.user.has_perm("ledger.view_auditevent"):
        raise PermissionDenied("reading the audit log needs the view_auditevent permission")
    form = AuditFilters(request.GET)
    q = form.values()
    events = _audit_filtered(q)
    if q["format"] == "csv":
        return _audit_csv(events)
    rows, next_cursor = keyset_page(events, q["after"], time_field="occurred_at")
    filters = form.echo()
    context = {"rows": rows, "next_cursor": next_cursor, "filters": filters, "query": filters.urlencode(),
               "chain": ChainCheck.objects.first(), "walk": ChainWalk.objects.first()}
    return render_partial(request, "ledger/audit.html", "results" if request.htmx else None, context)


def _as_json(value):
    """A before/after column as JSON, which any tool reads back (Python's repr was written)."""
    return "" if value is None else json.dumps(value, ensure_ascii=False, sort_keys=True)


# A spreadsheet runs a cell that starts so as a formula: an agent names its own X-Request-ID, a
# person types a reason, and opening the export must run neither (CSV injection). Such a cell is
# written after an apostrophe, which spreadsheets show as text. The JSON columns start with { or ".
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _as_text(value):
    return f"'{value}" if value.startswith(_FORMULA_START) else value


class _Echo:
    def write(self, value):
        return value


def _audit_csv(events):
    writer = csv.writer(_Echo())
    header = ["seq", "occurred_at", "actor", "verb", "object_type", "object_id", "before", "after", "reason",
              "request_id", "hash"]

    def rows():
        yield writer.writerow(header)
        for e in events.order_by("id").iterator(chunk_size=2000):
            names = map(_as_text, (e.actor, e.verb, e.object_type, e.object_id))
            yield writer.writerow([e.seq, e.occurred_at.isoformat(), *names, _as_json(e.before), _as_json(e.after),
                                   _as_text(e.reason), _as_text(e.request_id), e.hash])

    response = StreamingHttpResponse(rows(), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="audit-{timezone.now():%Y%m%d-%H%M}.csv"'
    return response

