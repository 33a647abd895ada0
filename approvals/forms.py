from django import forms

from .models import Limit


class DecisionForm(forms.Form):
    decision = forms.CharField(max_length=30)
    reason = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}), max_length=2000)
    external_ref = forms.CharField(required=False, max_length=255)
    confirm_absent = forms.BooleanField(required=False)

    def clean(self):
        data = super().clean()
        if data.get("decision") == "mark_failed" and not data.get("confirm_absent"):
            raise forms.ValidationError("confirm that the effect did not happen")
        return data


class LimitForm(forms.ModelForm):
    reason = forms.CharField(max_length=500, help_text="Why the change (recorded in the audit log).")

    class Meta:
        model = Limit
        fields = ["action_type", "currency", "max_amount", "dual_approval_above", "daily_customer_total",
                  "review_deadline_hours"]

    def clean_currency(self):
        return self.cleaned_data["currency"].upper()

    def clean(self):
        data = super().clean()
        dual, top = data.get("dual_approval_above"), data.get("max_amount")
        if dual is not None and top is not None and dual < top:
            self.add_error("dual_approval_above", "Must be at least the maximum amount.")
        return data

    def validate_unique(self):
        """An existing (type, currency) is updated, not refused."""
