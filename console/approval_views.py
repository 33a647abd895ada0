"""Pages where people decide: the approval and unknown-outcome queues, an item, the limits."""

from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Q
from django.http import HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import resolve, reverse
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseClientRefresh

from approvals.access import acting_for, get_review_item_for_user, may_decide
from approvals.decisions import (AlreadyDecided, DecisionRefused, approvals_counted, given_by_the_same_eyes,
                                 held_group, held_group_decide, in_flight_print, params_changed, past_its_window,
                                 review_decide, review_edit, waiting_for)
from approvals.intake import covered_currencies, customer_total_today, uncovered_refused
from approvals.models import Limit, ReviewItem, ReviewKind, ReviewStatus
from approvals.whatif import DEFAULT_DAYS, MAX_DAYS, Proposal, preview_for_audit
from ledger.actions import in_flight_near
from ledger.models import Action, ActionStatus, ActionType, AuditEvent, money_in_params
from ledger.versions import edited_from

from .approval_forms import DecisionForm, EditForm, LimitForm, fingerprint_seen, in_flight_seen
from .dashboard import keyset_page, posted_pk, recent_reasons, render_partial, staff_required
from .templatetags.amounts import in_currency
from .filters import ReviewQueueFilters
from .stepup import step_up_required

QUEUES = {
    "approvals": ([ReviewKind.APPROVAL, ReviewKind.HELD], "Approvals", "approvals"),
    "unknown": ([ReviewKind.UNKNOWN_OUTCOME], "Unknown outcomes", "unknown-outcomes"),
}
# What a person is told after each decision: the item's status alone said "resolved" for a
# verification that had only just been asked for.
DONE = {
    "approve": "approved",
    "reject": "rejected",
    "release": "released",
    "mark_succeeded": "marked succeeded",
    "mark_failed": "marked failed (safe to retry)",
    "verify": "sent back to the provider to verify; its outcome shows on this page once it is known",
}
# An action the executor still works on: what a verification waits for.
UNSETTLED = {ActionStatus.QUEUED, ActionStatus.PENDING, ActionStatus.UNKNOWN}


def _queue_of(item):
    return "unknown" if item.kind == ReviewKind.UNKNOWN_OUTCOME else "approvals"


def _waiting_for(user):
    """Open items this user may decide now, as the items' pages offer them a decision
    (approvals.decisions.waiting_for)."""
    return ReviewItem.objects.filter(waiting_for(user), status=ReviewStatus.OPEN)


def came_from(request, item):
    """The queue the person works, as the item's links and forms carry it (`?queue=`): the
    approvals page as a whole ("approvals", the default for its items) or one kind of item,
    as the overview's cards and the queue's kind filter open it. Without one (or one the item
    is not in), the queue its breadcrumb names."""
    queue = request.POST.get("queue") or request.GET.get("queue") or ""
    if queue == item.kind or queue == "approvals" and item.kind in QUEUES["approvals"][0]:
        return queue
    return _default_queue(item)


def _default_queue(item):
    return "approvals" if item.kind in QUEUES["approvals"][0] else item.kind


def _kinds_of(queue):
    return QUEUES["approvals"][0] if queue == "approvals" else [queue]


def _queue_query(item, queue):
    """What an item's URL carries to stay in `queue`: nothing for the default."""
    return "" if queue == _default_queue(item) else f"?{urlencode({'queue': queue})}"


def _queue_as_shown(queue, filters):
    """The queue's address with the filters and page it showed (`filters`, its query string, as
    a row's reject form posts it back): its own filters only, each written out afresh, so that
    no post can make it an address of another page or site."""
    given = QueryDict(filters)
    shown = {name: given[name] for name in ReviewQueueFilters.base_fields if given.get(name)}
    return reverse(QUEUES[queue][2]) + (f"?{urlencode(shown)}" if shown else "")


def _next_after(item, user, queue):
    """The item after `item` in the queue's order, as a URL that stays in that queue; the
    item's own page when it is the last."""
    following = _next_item(item, user, queue) or item
    return reverse("review-detail", args=[following.pk]) + _queue_query(following, queue)


def _next_item(item, user, queue):
    """The item after `item` in the order of `queue` (deadline, then id: equal deadlines are
    not skipped) that this user can act on: never one of another queue."""
    kinds = _kinds_of(queue)
    after = Q(deadline__gt=item.deadline) | Q(deadline=item.deadline, pk__gt=item.pk)
    return _waiting_for(user).filter(after, kind__in=kinds).order_by("deadline", "id").first()


@staff_required
def review_queue(request, queue):
    kinds, title, url_name = QUEUES[queue]
    items = ReviewItem.objects.select_related("action", "action__agent").filter(kind__in=kinds)
    form = ReviewQueueFilters(request.GET, kinds=kinds)
    q = form.values()
    if q["status"]:
        items = items.filter(status=q["status"])
    kind = q["kind"] or ""
    if kind:
        items = items.filter(kind=kind)
    if q["action_type"]:
        items = items.filter(action__action_type=q["action_type"])
    # Earliest deadline first, a page at a time: what is due next is what a person works.
    items, next_cursor = keyset_page(items, q["after"], time_field="deadline", newest_first=False)
    context = {"items": items, "queue": queue, "title": title, "status": q["status"] or "all",
               "statuses": ReviewStatus.values,
               "kinds": kinds if len(kinds) > 1 else [], "kind": kind, "queue_url": reverse(url_name),
               # Its rows' pages go on to the next item of this list as filtered (held, ...).
               "row_query": f"?{urlencode({'queue': kind})}" if kind else "",
               "action_types": ActionType.values, "next_cursor": next_cursor, "query": form.echo().urlencode(),
               # A row offers its Reject as the item's page offers a decision: where it waits for this person.
               "rejectable": set(_waiting_for(request.user).filter(pk__in=[item.pk for item in items])
                                 .values_list("pk", flat=True)) if queue == "approvals" else set(),
               "reject_reasons": recent_reasons(ReviewItem.objects.filter(decided_by=request.user,
                                                                          status=ReviewStatus.REJECTED))}
    return render_partial(request, "approvals/queue.html", "rows" if request.htmx else None, context)


@staff_required
def review_detail(request, pk):
    return detail_page(request, detail_context(request, get_review_item_for_user(request.user, pk)))


def detail_page(request, context):
    """An item's page (its own, or a decision link's); to htmx's poll of its verification note,
    the note alone."""
    if request.htmx and not (context["verifying"] and context["verifying"]["pending"]):
        # The verification it polled for has ended: the whole page, its badges and the item's
        # state with it (waiting again, or settled), not the note alone.
        return HttpResponseClientRefresh()
    return render_partial(request, "approvals/detail.html", "outcome" if request.htmx else None, context)


def _asked_otherwise(action):
    """(amount, currency) as the params ask for them now, where they are not the ones recorded with
    the request (changed behind the ledger's back): the headline shows the recorded amount, and the
    provider is sent the params."""
    try:
        amount, currency = money_in_params(action.params)
    except (ArithmeticError, AttributeError, TypeError, ValueError):  # not an amount at all
        return action.params.get("amount") if isinstance(action.params, dict) else action.params, ""
    same = amount == action.amount and currency == action.currency  # as the intake compares them
    return None if same else (amount, currency)


def detail_context(request, item, decide_url=None):
    """What an item's page shows; its decision form posts to `decide_url` (the item's own
    decide URL unless given: an e-mail's decision link gives its own)."""
    action = item.action
    approvals = list(item.approvals.select_related("user", "on_behalf_of"))
    history = AuditEvent.objects.history(action)
    near = in_flight_near(action) if item.kind == ReviewKind.HELD else None
    typed = request.session.pop(TYPED, None) or {}
    typed = typed if typed.get("item") == item.pk else {}
    behalf = _deciding_for(request.user, item)
    approved_by_me = any(a.user_id == request.user.pk for a in approvals)
    return {
        "item": item,
        "action": action,
        "may_decide": may_decide(request.user, item),
        # Past its window an approval is refused (approvals.decisions): the page offers none.
        "window_closed": item.status == ReviewStatus.OPEN and past_its_window(item),
        "is_owner": action.agent.answers_for(request.user),
        # Four eyes as the decision holds them for a delegate: the person they would decide for
        # answers for the agent, or gave (or was given, by a delegate) the first of two approvals.
        "owner_behalf": behalf if behalf is not None and action.agent.answers_for(behalf) else None,
        "approved_by_me": approved_by_me,
        "approved_by_us": None if approved_by_me else given_by_the_same_eyes(approvals, request.user, behalf),
        "approvals": approvals,
        # An approval whose person answers for the agent now (named its owner since) counts no more.
        "approvals_counted": approvals_counted(approvals, action.agent)[0],
        "why": _why_now(item, history),
        # The agent's own words: a version's reason may be an approver's edit of them (`edit` says so).
        "rationale": (edited_from(action)[-1].params or {}).get("reason", ""),
        "edit": _edit_of(action),
        "asked": _asked_otherwise(action),
        "customer_recent": Action.objects.filter(customer=action.customer).exclude(pk=action.pk).order_by("-id")[:10]
        if action.customer else [],
        "customer_today": _customer_total_today(action),
        "siblings": Action.objects.filter(target=action.target).exclude(pk=action.pk).order_by("-id")[:10],
        # Who was told, and each try (a second approval's mail not sent once nobody it went to is waited for).
        "alerts": item.alerts.prefetch_related("deliveries"),
        # What is in flight now on the held action's target or customer, read when the page is (the
        # item's `why` was written when it was held), and the print a release is bound to, of the
        # same reading: a retry landing between two readings would be in the print, not on the page.
        "holding": near[:10] if near is not None else None,
        "group": _group(item, near),
        "references": _references_found(action.evidence),
        "verifying": _verification(item, action, history),
        "form": DecisionForm(),
        # What the decision is taken on: the print of the params this page shows.
        "fingerprint": action.params_fingerprint(),
        # And a release, on what it shows in flight on the held action's order or customer.
        "in_flight": in_flight_print(near) if near is not None else "",
        "edit_form": EditForm(action=action, initial=typed if typed.get("form") == "edit" else None)
        if item.kind == ReviewKind.APPROVAL else None,
        "typed": typed,
        "queue": came_from(request, item),
        "queue_query": _queue_query(item, came_from(request, item)),
        "next_item": _next_item(item, request.user, came_from(request, item)),
        "decide_url": decide_url or reverse("review-decide", args=[item.pk]),
        "reason_choices": _reason_choices(request.user, item),
    }


def _edit_of(action):
    """How a version came to be, for the approver of its own item: the action it was edited from,
    that action's item the edit decided (who edited it, for whom, and why) and each param as it was
    and as edited. None for an action an agent asked for."""
    original = action.supersedes
    if original is None:
        return None
    return {"original": original, "changes": params_changed(original.params, action.params),
            "by": original.review_items.filter(status=ReviewStatus.EDITED)
            .select_related("decided_by", "decided_for").first()}


def _deciding_for(user, item):
    """The person `user` would decide `item` for (approvals.access.acting_for): None for
    themselves, and where they may not decide it at all (the page says so on its own)."""
    try:
        return acting_for(user, item)
    except PermissionDenied:
        return None


# The decision a reason given before takes in one click, per kind, and the person's earlier
# decisions of that kind it is taken from.
CHOICES = {ReviewKind.APPROVAL: ("approve", {"status": ReviewStatus.APPROVED, "kind": ReviewKind.APPROVAL}),
           ReviewKind.HELD: ("release", {"status": ReviewStatus.RESOLVED, "kind": ReviewKind.HELD})}


def _reason_choices(user, item):
    """The decision (approve, release) and the reasons `user` gave for their latest such ones."""
    if item.kind not in CHOICES or item.status != ReviewStatus.OPEN:
        return None
    decision, earlier = CHOICES[item.kind]
    reasons = recent_reasons(ReviewItem.objects.filter(decided_by=user, **earlier))
    if not reasons:
        return None
    action = item.action
    # As the Approve button asks, above the two-approver threshold.
    confirm = (f"Approve {in_currency(action.amount, action.currency)} {action.currency}? It is above the two-approver "
               "threshold." if decision == "approve" and item.approvals_needed > 1 else "")
    return {"decision": decision, "reasons": reasons, "confirm": confirm}


def _why_now(item, history):
    """Why the item waits, as the move that made it wait recorded it: an unknown outcome the
    provider did confirm waits for the limit, not because the outcome is unproven."""
    if item.kind == ReviewKind.UNKNOWN_OUTCOME:
        move = history.filter(after__status=ActionStatus.NEEDS_REVIEW).exclude(reason="").last()
        if move is not None:
            return move.reason
    return item.why


def _group(item, near):
    """An open held item's group, each member with the print of what is in flight near it
    (`in_flight`): the group's form releases one on what the page showed (the item's own, on
    `near`, the reading the page shows)."""
    if item.kind != ReviewKind.HELD or item.status != ReviewStatus.OPEN:
        return []
    group = held_group(item)
    for member in group:
        seen = near if member.action_id == item.action_id else in_flight_near(member.action)
        member.in_flight = in_flight_print(seen)
    return group


def _customer_total_today(action):
    """The customer's total today for this action type and currency, counted as the limits
    count it (what is not rejected, cancelled or failed), this action included."""
    if not action.customer or action.amount is None:
        return None
    return customer_total_today(action.action_type, action.currency, action.customer)


def _references_found(evidence):
    """The provider's references for this operation key that a verification found."""
    references = []
    for entry in evidence or []:
        if entry.get("found") is True:
            for ref in (entry.get("verification") or {}).get("matches") or []:
                if isinstance(ref, str) and ref not in references:
                    references.append(ref)
    return references


def _verification(item, action, history):
    """For an item sent back to verify: whether the executor is still at it, what it came to
    (the action's latest move since), and the action's new item if it needs a person again."""
    if item.status != ReviewStatus.RESOLVED or not AuditEvent.objects.history(item).filter(verb="verify").exists():
        return None
    asked = history.filter(verb="verify_again").last()
    latest = history.last()
    return {"pending": action.status in UNSETTLED,
            "latest": latest if asked is not None and latest.pk != asked.pk else None,
            "open_item": action.review_items.filter(status=ReviewStatus.OPEN).first()}


@staff_required
@step_up_required
@require_POST
def review_decide_view(request, pk):
    item = get_review_item_for_user(request.user, pk, to_decide=True)
    try:
        item, form = take_decision(request, item)
    except AlreadyDecided as exc:
        return refused(request, item, str(exc), 409)
    except DecisionRefused as exc:
        return refused(request, item, str(exc), 400)
    return decided(request, item, form)


def take_decision(request, item, fingerprint=None):
    """Take the decision posted on `item`; returns the item afterwards and the form. It binds to
    `fingerprint` when given (an e-mail link's), else to the form's. DecisionRefused (or
    AlreadyDecided), in words, when it is not taken."""
    form = DecisionForm(request.POST)
    if not form.is_valid():
        said = [error for name in DecisionForm.SAID for error in form.errors.get(name, [])]
        raise DecisionRefused("; ".join([*form.non_field_errors(), *said]) or "the decision form is incomplete")
    item = review_decide(item, user=request.user, decision=form.cleaned_data["decision"],
                         reason=form.cleaned_data["reason"], external_ref=form.cleaned_data["external_ref"],
                         fingerprint=fingerprint or form.cleaned_data["fingerprint"],
                         in_flight=form.cleaned_data["in_flight"])
    return item, form


def decided(request, item, form):
    """The answer to a decision taken: said, and on to where the person works next."""
    decision = form.cleaned_data["decision"]
    if item.status == ReviewStatus.OPEN:
        messages.info(request, "Your approval is recorded; a second approver is needed.")
    else:
        messages.success(request, f"{item.action.operation_key}: {DONE[decision]}.")
    if decision == "verify":
        return redirect("review-detail", pk=item.pk)
    if form.cleaned_data["return_to"] == "queue":
        return redirect(_queue_as_shown(_queue_of(item), request.POST.get("queue_filters", "")))
    # On to the next item in the queue's order; the last one stays on the page it was decided on.
    return redirect(_next_after(item, request.user, came_from(request, item)))


@staff_required
@step_up_required
@require_POST
def held_group_decide_view(request, pk):
    """Release one action of a held group and reject the rest, or reject them all: one form."""
    item = get_review_item_for_user(request.user, pk, to_decide=True)
    for member in held_group(item):  # the same permission and four eyes for every one of them
        get_review_item_for_user(request.user, member.pk, to_decide=True)
    # A person chooses: "none" rejects them all, anything else must name an action, and no
    # choice decides nothing (a mistyped id or a missing choice must not turn into rejecting
    # the one meant to be released).
    release = request.POST.get("release", "")
    if not release:
        return refused(request, item, "choose the one to release, or reject them all", 400)
    if release != "none" and posted_pk(release) is None:
        return refused(request, item, "the action to release is not one of this group", 400)
    release = None if release == "none" else posted_pk(release)
    # The members the page showed, all of whom the decision rejects but one: a group grown or shrunk
    # since is decided on nothing the person saw.
    shown = [posted_pk(pk) for pk in request.POST.get("members", "").split(",")]
    if None in shown:
        return refused(request, item, "the page did not say which actions the group held: reload it and decide again",
                       400)
    try:
        # The one released goes on with the params the page showed for it, never with whatever they are by now.
        fingerprint = fingerprint_seen(request.POST.get(f"fingerprint_{release}", "")) if release else ""
        # And on what the page showed in flight near it, never on whatever is by now.
        in_flight = in_flight_seen(request.POST.get(f"in_flight_{release}", "")) if release else ""
    except ValidationError as exc:
        return refused(request, item, " ".join(exc.messages), 400)
    try:
        group = held_group_decide(item, user=request.user, release=release, reason=request.POST.get("reason", ""),
                                  fingerprint=fingerprint, in_flight=in_flight, members=shown)
    except AlreadyDecided as exc:
        return refused(request, item, str(exc), 409)
    except DecisionRefused as exc:
        return refused(request, item, str(exc), 400)
    released = [m.action.operation_key for m in group if m.action_id == release]
    messages.success(request, f"Group of {len(group)} decided: " + (f"{released[0]} released, the rest rejected."
                                                                   if released else "all rejected."))
    return redirect(_next_after(item, request.user, came_from(request, item)))


@staff_required
@step_up_required
@require_POST
def review_edit_view(request, pk):
    """Edit an over-limit action down instead of rejecting it: a new version, approved by
    this person as it is made (approvals.decisions.review_edit)."""
    item = get_review_item_for_user(request.user, pk, to_decide=True)
    form = EditForm(request.POST, action=item.action)
    if not form.is_valid():
        return refused(request, item, "; ".join(
            " ".join(errors) if field == "fingerprint" else f"{field}: {' '.join(errors)}"
            for field, errors in form.errors.items()), 400)
    try:
        item, version = review_edit(item, user=request.user, changes=form.changes(), reason=form.cleaned_data["reason"],
                                    fingerprint=form.cleaned_data["fingerprint"])
    except AlreadyDecided as exc:
        return refused(request, item, str(exc), 409)
    except DecisionRefused as exc:
        return refused(request, item, str(exc), 400)
    # Approved by its editor as it was made: alone (its print bound), or the first of two (ledger.versions).
    said = "approved by you" if version.has_approval() else (
        "approved by you; a second approver is needed" if version.status == ActionStatus.AWAITING_APPROVAL
        else "approved by you, the first of two")
    if version.status == ActionStatus.HELD:
        said += ", and held: another action is in flight on its target or customer"
    messages.success(request, f"Edited into {version.operation_key}: {said}.")
    return redirect("review-detail", pk=item.pk)


# What a person typed into a form whose decision was refused, kept for the item's page they are
# sent back to (a redirect alone emptied the form): which form, and its text.
TYPED = "review_typed"
FORM_OF_VIEW = {"review-edit": "edit", "held-group-decide": "group"}  # else the decision form


def refused(request, item, why, status):
    messages.error(request, f"Not done: {why.rstrip('.')}.")  # some reasons end in a full stop of their own
    request.session[TYPED] = {
        # The view by the request's own path: a decision replayed after a step-up carries the
        # factor page's resolver_match.
        "item": item.pk, "form": FORM_OF_VIEW.get(resolve(request.path_info).url_name, "decision"),
        **{name: value[:2000] for name, value in request.POST.items()
           if name in ("reason", "external_ref") or name.startswith("param_")}}
    if request.htmx:
        return HttpResponse(status=status, headers={"HX-Redirect": item.get_absolute_url()})
    response = redirect("review-detail", pk=item.pk)
    response.status_code = 303
    return response


@staff_required
@step_up_required
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
            # The audit event keeps the what-if the person saw for these values (approvals.whatif).
            preview = preview_for_audit(request.POST.get("whatif", ""), Proposal.of(data))
            Limit.limit_set(actor=request.user, reason=reason, preview=preview, **data)
            messages.success(request, f"Limit for {data['action_type']} {data['currency']} saved; it applies to new actions.")
            return redirect("policies")
    return policies_page(request, form)


def policies_page(request, form, **extra):
    """The policies page: the limits, and the form to set one (with a what-if preview in `extra`)."""
    limits = list(Limit.objects.select_related("updated_by"))
    covered = covered_currencies(limits)
    coverage = [{"action_type": value, "currencies": covered.get(value, ())} for value in ActionType.values]
    return render(request, "approvals/policies.html", {"limits": limits, "form": form, "days": DEFAULT_DAYS,
                                                       "coverage": coverage, "refuse_uncovered": uncovered_refused(),
                                                       "max_days": MAX_DAYS,
                                                       "may_edit": request.user.has_perm("approvals.change_limit"),
                                                       **extra})
