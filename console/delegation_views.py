"""The delegations page: a person names who stands in for them while they are away, sees the
delegations they gave and took, and ends one early (approvals.delegation decides)."""

from django import forms
from django.contrib import messages
from django.db.models import Q
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from approvals.delegation import (DelegationRefused, delegate_choices, delegation_name, delegation_revoke,
                                  delegations_of)
from approvals.models import Delegation

from .dashboard import staff_required
from .stepup import step_up_required

WHEN = {"widget": forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        "input_formats": ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"]}


class DelegationForm(forms.Form):
    delegate = forms.ModelChoiceField(queryset=Delegation.objects.none(), empty_label="Choose a person")
    starts_at = forms.DateTimeField(label="From (UTC)", **WHEN)
    ends_at = forms.DateTimeField(label="Until (UTC)", **WHEN)
    reason = forms.CharField(max_length=2000, widget=forms.TextInput(attrs={"placeholder": "e.g. on leave"}))

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["delegate"].queryset = delegate_choices(user)


@staff_required
def delegations(request, form=None, status=200):
    return render(request, "approvals/delegations.html", {
        "form": form or DelegationForm(user=request.user), "delegations": delegations_of(request.user)},
        status=status)


@staff_required
@step_up_required  # a delegate decides money on this person's authority
@require_POST
def delegation_create(request):
    form = DelegationForm(request.POST, user=request.user)
    if form.is_valid():
        try:
            delegation = delegation_name(person=request.user, **form.cleaned_data)
        except DelegationRefused as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"{delegation.delegate.get_username()} stands in for you until "
                                      f"{delegation.ends_at:%Y-%m-%d %H:%M} UTC.")
            return redirect("delegations")
    return delegations(request, form=form, status=400)


@staff_required
@require_POST
def delegation_end(request, pk):
    # Another person's delegation is not there for them to end.
    delegation = get_object_or_404(Delegation.objects.filter(Q(person=request.user) | Q(delegate=request.user)), pk=pk)
    try:
        delegation_revoke(delegation, user=request.user)
    except DelegationRefused as exc:
        messages.error(request, str(exc))
        return delegations(request, status=409)
    messages.success(request, f"The delegation to {delegation.delegate.get_username()} has ended.")
    return redirect("delegations")
