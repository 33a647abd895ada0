"""A bulk redrive's page: its dry run, then its progress, then its report; and the list of runs."""

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseClientRefresh

from dlq.bulk import RunInTheWay, SelectionChanged, bulk_start, bulk_stop, may_redrive_any
from dlq.redrive_runs import ACTIVE_STATUSES, BulkRedrive, Plan
from ledger.statemachine import InvalidTransition

from .dashboard import render_partial, staff_required
from .filters import PageFilters
from .stepup import step_up_required

ITEMS_PER_PAGE = 50


class StartForm(forms.Form):
    rate = forms.DecimalField(
        max_digits=8, decimal_places=2, label="Rate (entries per minute)",
        error_messages={"invalid": "The rate is a number of entries per minute, e.g. 30.",
                        "max_digits": "The rate is a number of entries per minute, e.g. 30.",
                        "max_decimal_places": "The rate takes at most two decimals."},
    )
    reason = forms.CharField(max_length=2000, error_messages={"required": "A reason is required to redrive."})

    def __init__(self, *args, ceiling, **kwargs):
        super().__init__(*args, **kwargs)
        self.ceiling = ceiling
        self.fields["rate"].initial = ceiling

    def clean_rate(self):
        rate = self.cleaned_data["rate"]
        if rate <= 0:
            raise forms.ValidationError("The rate must be above 0 entries per minute.")
        if rate > self.ceiling:
            raise forms.ValidationError(f"At most {self.ceiling} entries per minute: the redrive limit of the "
                                        "connectors these entries call.")
        return rate

    def clean_reason(self):
        reason = self.cleaned_data["reason"].strip()
        if not reason:
            raise forms.ValidationError("A reason is required to redrive.")
        return reason


@staff_required
def bulk_redrive_list(request):
    runs = BulkRedrive.objects.select_related("started_by").order_by("-planned_at", "-id")[:100]
    return render(request, "dlq/redrive_list.html", {"runs": runs})


@staff_required
def bulk_redrive_detail(request, pk, *, form=None, difference=None, in_the_way=None, status=200):
    run = get_object_or_404(BulkRedrive.objects.select_related("started_by"), pk=pk)
    if request.htmx and run.status not in ACTIVE_STATUSES:
        return HttpResponseClientRefresh()  # the run ended while watched: show its whole report
    items = run.items.select_related("entry", "entry__task", "entry__action").order_by("position")
    page = Paginator(items, ITEMS_PER_PAGE).get_page(PageFilters(request.GET).values()["page"])
    context = {
        "run": run, "page": page, "counts": run.counts(),
        "active": run.status in ACTIVE_STATUSES, "may_work": may_redrive_any(request.user),
        "form": form or StartForm(ceiling=run.ceiling), "difference": difference, "in_the_way": in_the_way,
        "to_redrive": run.items.exclude(plan=Plan.SKIP).count(),
        "spike_failures": settings.REDRIVE_SPIKE_FAILURES, "spike_window": settings.REDRIVE_SPIKE_WINDOW,
    }
    response = render_partial(request, "dlq/redrive_run.html", "progress" if request.htmx else None, context)
    response.status_code = status
    return response


def _run_to_work(user, pk):
    """Starting or stopping a run needs the permission to work the dead-letter queue; which
    entries a run touches follows the permissions of the person who started it (dlq/bulk.py)."""
    run = get_object_or_404(BulkRedrive, pk=pk)
    if not may_redrive_any(user):
        raise PermissionDenied("you may not work the dead-letter queue")
    return run


@staff_required
@step_up_required
@require_POST
def bulk_redrive_start(request, pk):
    run = _run_to_work(request.user, pk)
    form = StartForm(request.POST, ceiling=run.ceiling)
    if not form.is_valid():
        return bulk_redrive_detail(request, pk, form=form)
    try:
        bulk_start(run, user=request.user, reason=form.cleaned_data["reason"], rate=form.cleaned_data["rate"])
    except SelectionChanged as exc:
        messages.error(request, "Not started: the entries these filters select changed since the dry run. "
                                "Do a new dry run to see them as they are.")
        return bulk_redrive_detail(request, pk, form=form, difference=exc.difference, status=409)
    except RunInTheWay as exc:
        messages.error(request, f"Not started: {exc}.")
        return bulk_redrive_detail(request, pk, form=form, in_the_way=exc, status=409)
    except (InvalidTransition, ValueError) as exc:
        messages.error(request, f"Not started: {exc}.")
    else:
        messages.success(request, f"Bulk redrive #{run.pk} started at {form.cleaned_data['rate']} entries per minute.")
    return redirect(run)


@staff_required
@require_POST
def bulk_redrive_stop(request, pk):
    run = _run_to_work(request.user, pk)
    try:
        bulk_stop(run, user=request.user, reason=request.POST.get("reason", ""))
    except (InvalidTransition, ValueError) as exc:
        messages.error(request, f"Not stopped: {exc}.")
    else:
        messages.success(request, f"Bulk redrive #{run.pk} stops before its next entry.")
    return redirect(run)
