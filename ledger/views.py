"""Dashboard pages about the ledger itself: overview, search, details, agents, audit log."""

import csv

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Min
from django.http import StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_POST

from approvals.access import APPROVE, RESOLVE, WORK_DLQ, decidable_names, user_may
from approvals.models import ReviewItem, ReviewKind, ReviewStatus
from dlq.models import DeadLetter, EntryStatus

from .agents import agent_create, agent_rotate_token, capabilities_named
from .dashboard import keyset_page, render_partial, staff_required
from .grants import agent_grant, agent_revoke
from .models import Action, ActionStatus, ActionType, Agent, AuditEvent, Capability, Task
from .tasks import task_run_now
from .workflows import WORKFLOW_NAMES

STATUS_ORDER = list(ActionStatus.values)


@staff_required
def overview(request):
    now = timezone.now()
    counts = dict(Action.objects.values_list("status").annotate(n=Count("id")).values_list("status", "n"))
    open_items = ReviewItem.objects.filter(status=ReviewStatus.OPEN)
    queues = []
    for kind, perm in ((ReviewKind.APPROVAL, APPROVE), (ReviewKind.HELD, APPROVE), (ReviewKind.UNKNOWN_OUTCOME, RESOLVE)):
        items = open_items.filter(kind=kind)
        oldest = items.aggregate(oldest=Min("created_at"), deadline=Min("deadline"))
        mine = items.filter(action__action_type__in=decidable_names(request.user, perm))
        mine = mine.exclude(action__agent__owner=request.user)
        queues.append({"kind": kind, "label": ReviewKind(kind).label, "count": items.count(), "mine": mine.count(),
                       "oldest": oldest["oldest"], "deadline": oldest["deadline"],
                       "overdue": items.filter(deadline__lt=now).count()})
    context = {
        "counts": [(s, counts.get(s, 0)) for s in STATUS_ORDER],
        "queues": queues,
        "dlq_open": DeadLetter.objects.filter(status=EntryStatus.OPEN).count(),
        "recent": AuditEvent.objects.order_by("-id")[:15],
        "refreshed_at": now,
    }
    return render_partial(request, "ledger/overview.html", request.GET.get("partial"), context)


@staff_required
def ledger_search(request):
    q = request.GET
    actions = Action.objects.select_related("agent", "task")
    if q.get("key"):
        actions = actions.filter(operation_key__startswith=q["key"].strip())
    if q.get("target"):
        actions = actions.filter(target=q["target"].strip())
    if q.get("customer"):
        actions = actions.filter(customer=q["customer"].strip())
    if q.get("agent"):
        actions = actions.filter(agent__name=q["agent"].strip())
    if q.get("status") in STATUS_ORDER:
        actions = actions.filter(status=q["status"])
    since, until = parse_datetime(q.get("since", "") or ""), parse_datetime(q.get("until", "") or "")
    if since:
        actions = actions.filter(created_at__gte=since)
    if until:
        actions = actions.filter(created_at__lt=until)
    rows, next_cursor = keyset_page(actions, q.get("after"))
    filters = q.copy()
    filters.pop("after", None)
    context = {"rows": rows, "next_cursor": next_cursor, "filters": filters, "statuses": STATUS_ORDER,
               "query": filters.urlencode(), "agents": Agent.objects.values_list("name", flat=True)}
    return render_partial(request, "ledger/search.html", "results" if request.htmx else None, context)


def _history(obj):
    return AuditEvent.objects.filter(object_type=obj._meta.label_lower, object_id=str(obj.pk)).order_by("id")


@staff_required
def action_detail(request, pk):
    action = get_object_or_404(Action.objects.select_related("agent", "task"), pk=pk)
    context = {"action": action, "history": _history(action),
               "items": action.review_items.order_by("-id"),
               "siblings": Action.objects.filter(target=action.target).exclude(pk=action.pk).order_by("-id")[:10]}
    return render(request, "ledger/action_detail.html", context)


@staff_required
def task_detail(request, pk):
    task = get_object_or_404(Task.objects.select_related("agent"), pk=pk)
    context = {"task": task, "steps": task.steps.all(), "history": _history(task),
               "actions": task.actions.order_by("id"), "dead_letters": task.dead_letters.order_by("-id"),
               "may_run": user_may(request.user, WORK_DLQ, Capability.Kind.WORKFLOW, task.workflow)}
    return render(request, "ledger/task_detail.html", context)


@staff_required
@require_POST
def task_run_now_view(request, pk):
    task = get_object_or_404(Task, pk=pk)
    if not user_may(request.user, WORK_DLQ, Capability.Kind.WORKFLOW, task.workflow):
        raise PermissionDenied("you may not run tasks of this workflow")
    task_run_now(task, actor=request.user)
    messages.success(request, f"{task.task_id} will run now.")
    return redirect("task-detail", pk=pk)


# --- agents -----------------------------------------------------------------------------------


def _agents_admin(request):
    if not request.user.has_perm("ledger.change_agent"):
        raise PermissionDenied("managing agents needs the change_agent permission")


@staff_required
def agent_list(request):
    if request.method == "POST":
        _agents_admin(request)
        name = request.POST.get("name", "").strip()
        grants = request.POST.getlist("grant")
        try:
            if not name or Agent.objects.filter(name=name).exists():
                raise ValueError("give a new, unused name")
            agent, token = agent_create(name, actor=request.user, grants=grants, owner=request.user)
        except ValueError as exc:
            messages.error(request, str(exc))
            return redirect("agent-list")
        return render(request, "ledger/agent_token.html", {"agent": agent, "token": token})
    agents = Agent.objects.select_related("owner").annotate(actions_count=Count("actions"))
    grantable = sorted({*ActionType.values, *WORKFLOW_NAMES})
    return render(request, "ledger/agents.html", {"agents": agents, "grantable": grantable,
                                                   "may_manage": request.user.has_perm("ledger.change_agent")})


@staff_required
@require_POST
def agent_change(request, pk, op):
    _agents_admin(request)
    agent = get_object_or_404(Agent, pk=pk)
    reason = request.POST.get("reason", "")
    if op == "rotate":
        token = agent_rotate_token(agent, actor=request.user, reason=reason)
        return render(request, "ledger/agent_token.html", {"agent": agent, "token": token})
    try:
        capabilities = capabilities_named(request.POST.get("capability", ""))
    except ValueError as exc:
        messages.error(request, str(exc))
        return redirect("agent-list")
    for capability in capabilities:
        (agent_grant if op == "grant" else agent_revoke)(agent, capability, actor=request.user, reason=reason)
    messages.success(request, f"{op} {request.POST.get('capability')} for {agent.name}: done.")
    return redirect("agent-list")


# --- audit log ----------------------------------------------------------------------------------


def _audit_filtered(q):
    events = AuditEvent.objects.all()
    for field in ("actor", "verb", "object_type", "object_id"):
        if q.get(field):
            events = events.filter(**{field: q[field].strip()})
    since = parse_datetime(q.get("since", "") or "")
    if since:
        events = events.filter(occurred_at__gte=since)
    return events


@staff_required
def audit_log(request):
    if not request.user.has_perm("ledger.view_auditevent"):
        raise PermissionDenied("reading the audit log needs the view_auditevent permission")
    events = _audit_filtered(request.GET)
    if request.GET.get("format") == "csv":
        return _audit_csv(events)
    rows, next_cursor = keyset_page(events, request.GET.get("after"), time_field="occurred_at")
    filters = request.GET.copy()
    filters.pop("after", None)
    context = {"rows": rows, "next_cursor": next_cursor, "filters": filters, "query": filters.urlencode(),
               "chain_broken_at": None}
    return render_partial(request, "ledger/audit.html", "results" if request.htmx else None, context)


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
            yield writer.writerow([e.seq, e.occurred_at.isoformat(), e.actor, e.verb, e.object_type, e.object_id,
                                   e.before, e.after, e.reason, e.request_id, e.hash])

    response = StreamingHttpResponse(rows(), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="audit-{timezone.now():%Y%m%d-%H%M}.csv"'
    return response

