"""The dead-letter queue: list, detail, and redrive / resolve / discard, one or in bulk."""

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from dlq.access import get_deadletter_for_user
from dlq.bulk import bulk_plan
from dlq.entries import deadletter_discard, deadletter_redrive, deadletter_resolve
from dlq.models import DeadLetter, EntryStatus
from ledger.access import WORK_DLQ, decidable_names
from ledger.audit import actor_label
from ledger.models import Action, ActionStatus, AuditEvent, Capability
from ledger.statemachine import InvalidTransition

from .dashboard import count_up_to, keyset_page, posted_pk, recent_reasons, render_partial, staff_required
from .filters import DeadLetterFilters
from .stepup import step_up_required

# The open entries are counted exactly up to this many (open_deadletter_count).
OPEN_EXACT_UP_TO = 10_000
OPERATIONS = {"redrive": deadletter_redrive, "resolve": deadletter_resolve, "discard": deadletter_discard}
BULK_MAX = 500


def deadletter_card(user, now):
    """The dead-letter queue's card on the overview (console.overview)."""
    count = open_deadletter_count()
    return [{"kind": "dead_letters", "label": "Dead letters", "href": reverse("deadletter-queue"), "count": count,
             "count_id": "dlq-open", "mine": None, "overdue": count, "hint": "Redrive, resolve or discard each one"}]


def open_deadletter_count():
    """The size of the queue, on this page and on the overview (polled every 3 s): exact up to
    OPEN_EXACT_UP_TO, "10,000+" past it. Up to there it is a queue people work through entry by
    entry, and they watch each one go; past it, it is an incident worked with bulk actions (which
    count exactly what they will touch), and an exact count would cost a scan of the whole open
    queue on every poll (~3 ms at 70k open entries, growing with them). Not an estimate: a
    statistics-based one would not move while the queue drains, until the next ANALYZE."""
    return count_up_to(DeadLetter.objects.filter(status=EntryStatus.OPEN), OPEN_EXACT_UP_TO)


@staff_required
def deadletter_queue(request):
    form = DeadLetterFilters(request.GET)
    q = form.values()
    rows, next_cursor = keyset_page(DeadLetter.objects.matching(q), q["after"])
    filters = form.echo()
    context = {"rows": rows, "next_cursor": next_cursor, "filters": filters, "query": filters.urlencode(),
               "statuses": EntryStatus.values, "open_count": open_deadletter_count(),
               "may_work": bool(decidable_names(request.user, WORK_DLQ, Capability.Kind.WORKFLOW)
                                or decidable_names(request.user, WORK_DLQ, Capability.Kind.ACTION_TYPE))}
    return render_partial(request, "dlq/queue.html", "rows" if request.htmx else None, context)


@staff_required
def deadletter_detail(request, pk):
    entry = get_deadletter_for_user(request.user, pk)
    kind, name = entry.capability
    context = {
        "entry": entry,
        "task": entry.task,
        "action": entry.action,
        "steps": _in_execution_order(entry) if entry.task_id else [],
        "alerts": entry.alerts.prefetch_related("deliveries"),
        "history": AuditEvent.objects.history(entry.task or entry.action),
        "attempts": _every_entry_of_its_subject(entry),
        "may_work": name in decidable_names(request.user, WORK_DLQ, kind),
        "redrive_reasons": recent_reasons(DeadLetter.objects.filter(decided_by=actor_label(request.user),
                                                                    status=EntryStatus.REDRIVEN)),
    }
    return render(request, "dlq/detail.html", context)


def _every_entry_of_its_subject(entry):
    """Each time the task or action reached the queue, oldest first: a redrive that fails
    again opens a new entry, and every earlier one keeps its error, checkpoint and decision."""
    subject = {"task_id": entry.task_id} if entry.task_id else {"action_id": entry.action_id}
    return DeadLetter.objects.filter(**subject).prefetch_related("bulk_items__run").order_by("created_at", "id")


def _in_execution_order(entry):
    """A task's snapshot steps as (name, step) pairs in execution order (jsonb keeps no order)."""
    positions = dict(entry.task.steps.values_list("name", "position"))
    return sorted(entry.snapshot.get("steps", {}).items(), key=lambda pair: positions.get(pair[0], len(positions)))


@staff_required
@step_up_required
@require_POST
def deadletter_operate(request, pk, op):
    if op not in OPERATIONS:
        raise Http404("No such operation.")
    entry = get_deadletter_for_user(request.user, pk, to_work=True)
    reason = request.POST.get("reason", "").strip()
    try:
        if op == "resolve":
            deadletter_resolve(entry, actor=request.user, note=reason)
        else:
            OPERATIONS[op](entry, actor=request.user, reason=reason)
    except (InvalidTransition, ValueError) as exc:
        messages.error(request, f"Not done: {exc}.")
    else:
        messages.success(request, f"Dead letter #{entry.pk}: {op} done{_held_after(entry) if op == 'redrive' else ''}.")
    return redirect("deadletter-detail", pk=pk)


def _held_after(entry):
    """A redriven action goes back to the queue, or is held behind another one in flight on its
    target or customer: said, as it waits for that one first."""
    if entry.action_id and Action.objects.filter(pk=entry.action_id, status=ActionStatus.HELD).exists():
        return "; the action is held while another action on its target or customer is in flight"
    return ""


@staff_required
@step_up_required
@require_POST
def deadletter_bulk(request):
    """A bulk redrive starts with its dry run (dlq/bulk.py), on a page of its own. A bulk
    discard has two steps: the first POST shows how many entries the filter matches; the
    second, with that count confirmed and a reason, does it. Only entries of workflows and
    action types you may work are touched."""
    op = request.POST.get("op")
    if op not in ("redrive", "discard"):
        raise PermissionDenied("bulk operations are redrive and discard")
    workflows = decidable_names(request.user, WORK_DLQ, Capability.Kind.WORKFLOW)
    action_types = decidable_names(request.user, WORK_DLQ, Capability.Kind.ACTION_TYPE)
    if not workflows and not action_types:
        raise PermissionDenied("you may not work the dead-letter queue")
    if op == "redrive":
        return redirect(bulk_plan(request.POST, user=request.user))
    entries = DeadLetter.objects.matching({**request.POST.dict(), "status": EntryStatus.OPEN}).filter(
        Q(task__workflow__in=workflows) | Q(action__action_type__in=action_types))
    count = entries.count()
    reason = request.POST.get("reason", "").strip()
    confirmed = request.POST.get("confirm_count") == str(count) and count > 0
    if not confirmed or not reason:
        if request.POST.get("confirm_count") and request.POST.get("confirm_count") != str(count):
            messages.warning(request, f"The queue changed: {count} entries match now. Confirm again.")
        elif request.POST.get("confirm_count") and not reason:
            messages.error(request, "A reason is required.")
        # The person sees which entries go, oldest first, and confirms those: no other is touched.
        listed = entries.select_related("task__agent", "action__agent").order_by("id")[:BULK_MAX]
        return render(request, "dlq/bulk_confirm.html", {"op": op, "count": min(count, BULK_MAX), "total": count,
                                                         "entries": listed, "filters": request.POST, "reason": reason})
    shown = [pk for pk in map(posted_pk, request.POST.getlist("entry")) if pk is not None]
    done = 0
    for entry in entries.filter(pk__in=shown).order_by("id")[:BULK_MAX]:
        try:
            deadletter_discard(entry, actor=request.user, reason=reason)
            done += 1
        except InvalidTransition:
            continue  # decided by someone else meanwhile
    messages.success(request, f"{op}: {done} of {count} entries.")
    return redirect("deadletter-queue")
