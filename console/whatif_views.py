"""The policies page's what-if: the limit form's values previewed over real actions, never saved."""

from django import forms
from django.shortcuts import render
from django.views.decorators.http import require_POST

from approvals.whatif import DEFAULT_DAYS, MAX_DAYS, Proposal, preview_signed, whatif

from .approval_forms import LimitForm
from .approval_views import policies_page
from .dashboard import staff_required


class WhatIfForm(LimitForm):
    """The limit form's thresholds, validated by its own rules, and the window to replay."""

    reason = None  # nothing is saved
    days = forms.IntegerField(min_value=1, max_value=MAX_DAYS, required=False, label="Days to replay",
                              help_text=f"The last 1 to {MAX_DAYS} days (default {DEFAULT_DAYS}).")

    class Meta(LimitForm.Meta):
        fields = ["action_type", "currency", "max_amount", "dual_approval_above", "daily_customer_total"]



@staff_required
@require_POST
def policy_whatif(request):
    """htmx: the preview fragment (the form's errors instead, if any). Without JavaScript the
    preview button posts here too, and the whole policies page comes back with the preview."""
    form = WhatIfForm(request.POST)
    preview = None
    if form.is_valid():
        preview = whatif(Proposal.of(form.cleaned_data), days=form.cleaned_data["days"] or DEFAULT_DAYS)
        preview["signed"] = preview_signed(preview)
    context = {"whatif_form": form, "preview": preview}
    if request.htmx:
        return render(request, "approvals/whatif.html", context)
    # The limit form keeps what was typed, without a bound form's errors (the reason is only
    # needed to save).
    return policies_page(request, LimitForm(initial=request.POST.dict()), **context)
