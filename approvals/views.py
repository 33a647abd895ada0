"""Pages where people decide: the approval and unknown-outcome queues, an item, the limits."""

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from ledger.dashboard import keyset_page, render_partial, staff_required
from ledger.models import Action, ActionType, Capability

from .access import PERM_FOR_KIND, get_review_item_for_user, user_may
from .decisions import AlreadyDecided, DecisionRefused, review_decide
from .forms import DecisionForm, LimitForm
from .models import Limit, ReviewItem, ReviewKind, ReviewStatus

QUEUES = {
    "approvals": ([ReviewKind.APPROVAL, ReviewKind.HELD], "Approvals"),
    "unknown": ([ReviewKind.UNKNOWN_OUTCOME], "Unknown outcomes"),
}


@staff_required
def review_queue(request, queue):
    kinds, title = QUEUES[queue]
    items = ReviewItem.objects.select_related("action", "action__agent").filter(kind__in=kinds)
    status = request.GET.get("status", ReviewStatus.OPEN)
    if status in ReviewStatus.values:
        items = items.filter(status=status)
    if request.GET.get("action_type"):
        items = items.filter(action__action_type=request.GET["action_type"])
    # Earliest deadline first, a page at a time: what is due next is what a person works.
    items, next_cursor = keyset_page(items, request.GET.get("after"), time_field="deadline", newest_first=False)
    filters = request.GET.copy()
    filters.pop("after", None)
    context = {"items": items, "queue": queue, "title": title, "status": status, "statuses": ReviewStatus.values,
               "action_types": ActionType.values, "next_cursor": next_cursor, "query": filters.urlencode()}
    return render_partial(request, "approvals/queue.html", "rows" if request.htmx else None, context)


@staff_required
def review_detail(request, pk):
    item = get_review_item_for_user(request.user, pk)
    action = item.action
    context = {
        "item": item,
        "action": action,
        "may_decide": user_may(request.user, PERM_FOR_KIND[item.kind], Capability.Kind.ACTION_TYPE, action.action_type)
        and action.agent.owner_id != request.user.pk,
        "is_requester": action.agent.owner_id == request.user.pk,
        "approvals": item.approvals.select_related("user"),
        "customer_recent": Action.objects.filter(customer=action.customer).exclude(pk=action.pk).order_by("-id")[:10]
        if action.customer else [],
        "siblings": Action.objects.filter(target=action.target).exclude(pk=action.pk).order_by("-id")[:10],
        "form": DecisionForm(),
        "next_item": ReviewItem.objects.filter(status=ReviewStatus.OPEN, kind=item.kind, deadline__gt=item.deadline)
        .order_by("deadline", "id").first(),
    }
    return render(request, "approvals/detail.html", context)


@staff_required
@require_POST
def review_decide_view(request, pk):
    item = get_review_item_for_user(request.user, pk, to_decide=True)
    form = DecisionForm(request.POST)
    if not form.is_valid():
        return _refused(request, item, "; ".join(form.non_field_errors()) or "the decision form is incomplete", 400)
    try:
        item = review_decide(item, user=request.user, decision=form.cleaned_data["decision"],
                             reason=form.cleaned_data["reason"], external_ref=form.cleaned_data["external_ref"])
    except AlreadyDecided as exc:
        return _refused(request, item, str(exc), 409)
    except DecisionRefused as exc:
        return _refused(request, item, str(exc), 400)
    if item.status == ReviewStatus.OPEN:
        messages.info(request, "Your approval is recorded; a second approver is needed.")
    else:
        messages.success(request, f"{item.action.operation_key}: {item.status}.")
    return redirect("review-detail", pk=item.pk)


def _refused(request, item, why, status):
    messages.error(request, f"Not done: {why}.")
    if request.htmx:
        return HttpResponse(status=status, headers={"HX-Redirect": item.get_absolute_url()})
    response = redirect("review-detail", pk=item.pk)
    response.status_code = 303
    return response


@staff_required
def policies(request):
    may_edit = request.user.has_perm("approvals.change_limit")
    form = LimitForm()
    if request.method == "POST":
        if not may_edit:
            raise PermissionDenied("changing limits needs the change_limit permission")
        form = LimitForm(request.POST)
        if form.is_valid():
            data = dict(form.cleaned_data)
            reason = data.pop("reason")
            Limit.limit_set(actor=request.user, reason=reason, **data)
            messages.success(request, f"Limit for {data['action_type']} {data['currency']} saved; it applies to new actions.")
            return redirect("policies")
    limits = Limit.objects.select_related("updated_by")
    return render(request, "approvals/policies.html", {"limits": limits, "form": form, "may_edit": may_edit})

