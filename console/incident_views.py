"""Incidents: the list, one incident's page, and taking, noting and resolving it."""

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Min
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from dlq.incidents import (
    Incident,
    IncidentKind,
    IncidentStatus,
    ReconciliationRun,
    incident_note,
    incident_resolve,
    incident_take,
)
from ledger.access import RESOLVE, decidable_names, user_may
from ledger.models import AuditEvent, Capability
from ledger.statemachine import InvalidTransition

from .dashboard import count_up_to, keyset_page, render_partial, staff_required
from .filters import IncidentFilters

DONE = {"take": "it is yours now", "note": "note added", "resolve": "resolved"}
# The open incidents are counted exactly up to this many, as the dead-letter queue's entries.
OPEN_EXACT_UP_TO = 10_000


def get_incident_for_user(user, pk, *, to_work=False):
    """The incident; to work it, the user must be allowed to resolve unknown outcomes of its
    action type (the same people judge what a provider really did)."""
    incident = get_object_or_404(Incident.objects.select_related("owner"), pk=pk)
    if to_work and not user_may(user, RESOLVE, Capability.Kind.ACTION_TYPE, incident.action_type):
        raise PermissionDenied(f"you may not work {incident.action_type or 'these'} incidents")
    return incident


def _filtered(q):
    incidents = Incident.objects.select_related("owner")
    for field in ("status", "kind", "connector"):
        if q[field]:
            incidents = incidents.filter(**{field: q[field]})
    return incidents


def open_incident_count():
    return count_up_to(Incident.objects.filter(status=IncidentStatus.OPEN), OPEN_EXACT_UP_TO)


def incident_card(user, now):
    """The incidents' card on the overview (console.overview): the open ones, how
    many of them this user may work, and the oldest. Both counts are exact up to
    OPEN_EXACT_UP_TO, as the card is polled every 3 s."""
    open_incidents = Incident.objects.filter(status=IncidentStatus.OPEN)
    count = open_incident_count()
    mine = count_up_to(open_incidents.filter(action_type__in=decidable_names(user, RESOLVE)),
                       OPEN_EXACT_UP_TO) if count else 0
    return [{"kind": "incidents", "label": "Incidents", "href": reverse("incident-list"), "count": count,
             "count_id": "incidents-open", "mine": mine, "overdue": count,
             "oldest": open_incidents.aggregate(oldest=Min("created_at"))["oldest"] if count else None,
             "deadline": None,
             "hint": _quiet(ReconciliationRun.objects.filter(finished_at__isnull=False).first())}]


def _quiet(run):
    """What the card says while no incident is open: only a finished run that read every connector
    it could found nothing wrong (one that cannot list its records is skipped by every run)."""
    if run is None:
        return "Reconciliation has not finished a run yet"
    failed = [name for name, part in run.report.items() if "failed" in part]
    if failed:
        return f"The last reconciliation could not read {', '.join(failed)}"
    return "Reconciliation found nothing wrong" if run.complete else "The last reconciliation did not read to the end"


def _unread(run):
    """(connector, why) for each connector the run skipped or could not read to the end."""
    parts = run.report.items() if run else ()
    return [(name, part.get("skipped") or part.get("failed")) for name, part in parts
            if "skipped" in part or "failed" in part]


@staff_required
def incident_list(request):
    form = IncidentFilters(request.GET)
    q = form.values()
    rows, next_cursor = keyset_page(_filtered(q), q["after"])
    filters = form.echo()
    last_run = ReconciliationRun.objects.first()
    context = {"rows": rows, "next_cursor": next_cursor, "filters": filters, "query": filters.urlencode(),
               "statuses": IncidentStatus.values, "kinds": IncidentKind.choices, "open_count": open_incident_count(),
               "last_run": last_run, "unread": _unread(last_run)}
    return render_partial(request, "dlq/incident_list.html", "rows" if request.htmx else None, context)


@staff_required
def incident_detail(request, pk):
    incident = get_incident_for_user(request.user, pk)
    context = {
        "incident": incident,
        "alerts": incident.alerts.prefetch_related("deliveries"),
        "history": AuditEvent.objects.history(incident),
        "may_work": user_may(request.user, RESOLVE, Capability.Kind.ACTION_TYPE, incident.action_type),
    }
    return render(request, "dlq/incident_detail.html", context)


@staff_required
@require_POST
def incident_operate(request, pk, op):
    if op not in DONE:
        raise Http404("No such operation.")
    incident = get_incident_for_user(request.user, pk, to_work=True)
    text = request.POST.get("reason", "").strip()
    try:
        if op == "take":
            incident_take(incident, user=request.user)
        elif op == "note":
            incident_note(incident, actor=request.user, text=text)
        else:
            incident_resolve(incident, actor=request.user, reason=text)
    except (InvalidTransition, ValueError) as exc:
        messages.error(request, f"Not done: {exc}.")
    else:
        messages.success(request, f"Incident #{incident.pk}: {DONE[op]}.")
    return redirect("incident-detail", pk=pk)
