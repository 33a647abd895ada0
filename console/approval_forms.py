from django import forms
from django.core.validators import RegexValidator, validate_email

from approvals.decisions import BINDING
from approvals.models import Limit, tier_addresses
from ledger import currencies, money
from ledger.versions import EDITABLE_PARAMS, edit_refusal


# The print of the params a page showed (a SHA-256, hex): a decision is taken on those.
UNSEEN = "the page did not say which parameters you saw: reload it and decide again"
FINGERPRINT = {"required": False, "validators": [RegexValidator(
    r"\A[0-9a-f]{64}\Z", "the page's print of the parameters you saw is not one: reload it and decide again")]}
# Where a decision lets the action go on with the params as edited or released, the print is
# required: without it, the decision would bind to whatever the params are by then.
SEEN = {**FINGERPRINT, "required": True, "error_messages": {"required": UNSEEN}}
# The print of what a held item's page showed in flight on its order or customer
# (approvals.decisions.in_flight_print): a release is taken on that, and required for it.
UNSEEN_IN_FLIGHT = "the page did not say what you saw in flight on its order or customer: reload it and decide again"
IN_FLIGHT = {"required": False, "validators": [RegexValidator(
    r"\A[0-9a-f]{64}\Z", "the page's print of what is in flight on its order or customer is not one: reload it "
    "and decide again")]}
IN_FLIGHT_SEEN = {**IN_FLIGHT, "required": True, "error_messages": {"required": UNSEEN_IN_FLIGHT}}


def fingerprint_seen(posted):
    """The print a page posted for one action (a held group's form names one per action),
    cleaned as a form's; forms.ValidationError, in words, when it is missing or not a print."""
    return forms.CharField(**SEEN).clean(posted)


def in_flight_seen(posted):
    """The same for the print of what was in flight near the action released from a group."""
    return forms.CharField(**IN_FLIGHT_SEEN).clean(posted)


def too_long(what):
    """A max_length error in words, for a field whose errors reach the page as a sentence."""
    return {"max_length": f"{what} is too long: at most %(limit_value)d characters (it has %(show_value)d)"}


class DecisionForm(forms.Form):
    # The fields whose own errors the page says (the others only miss on a hand-made post).
    SAID = ("reason", "external_ref", "fingerprint", "in_flight")

    decision = forms.CharField(max_length=30)
    reason = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}), max_length=2000,
                             error_messages=too_long("the reason"))
    external_ref = forms.CharField(required=False, max_length=255, error_messages=too_long("the reference"))
    confirm_absent = forms.BooleanField(required=False)
    fingerprint = forms.CharField(**FINGERPRINT)
    in_flight = forms.CharField(**IN_FLIGHT)
    # "queue": a decision taken from the queue's row goes back to the queue.
    return_to = forms.ChoiceField(choices=[("", "the next item"), ("queue", "the queue")], required=False)

    def clean(self):
        data = super().clean()
        if data.get("decision") == "mark_failed" and not data.get("confirm_absent"):
            raise forms.ValidationError("confirm that the effect did not happen")
        # An approval from a page binds to what the page showed: a form without it (an old
        # page, a hand-made post) approves nothing.
        if data.get("decision") in BINDING and not data.get("fingerprint") and "fingerprint" not in self.errors:
            raise forms.ValidationError(UNSEEN)
        # So is a release to what the page showed in flight near it.
        if data.get("decision") == "release" and not data.get("in_flight") and "in_flight" not in self.errors:
            raise forms.ValidationError(UNSEEN_IN_FLIGHT)
        return data


class EditForm(forms.Form):
    """Edit an over-limit action down: its editable params (ledger.versions.EDITABLE_PARAMS),
    the approver's reason, and the print of the params the page showed."""

    reason = forms.CharField(max_length=2000, required=False, widget=forms.Textarea(attrs={"rows": 2}))
    fingerprint = forms.CharField(**SEEN)

    def __init__(self, *args, action, **kwargs):
        super().__init__(*args, **kwargs)
        self.editable = () if edit_refusal(action) else EDITABLE_PARAMS[action.action_type]
        for name in self.editable:
            # Named apart from the decision's own reason: a refund's `reason` is a param.
            # An amount is typed in its action's currency, with that currency's decimals: the label says which.
            currency = f" ({action.currency})" if name == "amount" and action.currency else ""
            self.fields[f"param_{name}"] = forms.CharField(
                label=f"{action.action_type.replace('_', ' ').capitalize()} {name}{currency}", required=False,
                max_length=500,
                initial=(action.params or {}).get(name, ""))

    def changes(self):
        """The params as edited (field -> text); posted fields that are not editable too,
        so that the ledger refuses them by name rather than ignoring them."""
        edited = {name: self.cleaned_data[f"param_{name}"].strip() for name in self.editable}
        extra = {key.removeprefix("param_"): value for key, value in self.data.items()
                 if key.startswith("param_") and key.removeprefix("param_") not in self.editable}
        return {**edited, **extra}


class LimitForm(forms.ModelForm):
    reason = forms.CharField(max_length=500, help_text="Why the change (recorded in the audit log).")

    class Meta:
        model = Limit
        fields = ["action_type", "currency", "max_amount", "dual_approval_above", "daily_customer_total",
                  "review_deadline_hours", "first_tier", "next_tier", "escalate_after_hours",
                  "approval_expires_after_hours"]

    def clean_currency(self):
        # Any three characters ("E1", "123") were saved as a currency; only
        # ISO 4217 codes, as the API takes them, can ever match an action.
        # ISO 4217 codes one may pay in, as the API takes them (not XXX, a metal, a fund): no
        # action could ever be in another.
        code = self.cleaned_data["currency"].strip().upper()
        problem = currencies.currency_problem(code)
        if problem:
            raise forms.ValidationError(problem)
        return code

    def clean_max_amount(self):
        # The database refuses it too, but in the words of its constraint's name.
        amount = self.cleaned_data["max_amount"]
        if amount is not None and amount < 0:
            raise forms.ValidationError("Must not be negative.")
        return amount

    def clean_review_deadline_hours(self):
        # 0 made every review item overdue the moment it opened (the database refuses it too;
        # here a person gets the reason next to the field).
        return _hours(self.cleaned_data["review_deadline_hours"])

    def clean_daily_customer_total(self):
        # A negative total was saved once (the database refuses it too).
        total = self.cleaned_data["daily_customer_total"]
        if total is not None and total < 0:
            raise forms.ValidationError("Must not be negative.")
        return total

    def clean_first_tier(self):
        return _tier(self.cleaned_data["first_tier"])

    def clean_next_tier(self):
        return _tier(self.cleaned_data["next_tier"])

    def clean_escalate_after_hours(self):
        return _hours(self.cleaned_data["escalate_after_hours"])

    def clean_approval_expires_after_hours(self):
        return _hours(self.cleaned_data["approval_expires_after_hours"])

    def clean(self):
        data = super().clean()
        # The database refuses one without the other too (limit_next_tier_with_its_deadline).
        if data.get("next_tier") and data.get("escalate_after_hours") is None and "escalate_after_hours" in data:
            self.add_error("escalate_after_hours", "Say after how many hours the next tier is alerted.")
        if data.get("escalate_after_hours") is not None and not data.get("next_tier") and "next_tier" in data:
            self.add_error("next_tier", "Name who is alerted at the second deadline.")
        # A limit's amounts in the currency's minor digits, as the API holds a request's: 500.015
        # EUR would be shown as 500.02, while the intake compares 500.015.
        for field in ("max_amount", "dual_approval_above", "daily_customer_total"):
            problem = data.get("currency") and data.get(field) is not None and money.places_problem(
                data[field], data["currency"])
            if problem:
                self.add_error(field, problem)
        dual, top = data.get("dual_approval_above"), data.get("max_amount")
        if dual is not None and top is not None and dual < top:
            self.add_error("dual_approval_above", "Must be at least the maximum amount.")
        # The limit of this type and currency, if there is one, is the one being changed
        # (Limit.limit_set): validated as that instance, its unique constraint does not refuse it.
        existing = Limit.objects.filter(action_type=data.get("action_type"), currency=data.get("currency")).first()
        if existing is not None:
            self.instance = existing
        return data


def _hours(hours):
    """A number of hours the database takes (limit_*_an_hour_to_a_year), said next to the field."""
    if hours is not None and not 1 <= hours <= 24 * 365:
        raise forms.ValidationError("Between 1 hour and a year.")
    return hours


def _tier(text):
    """A tier as typed ("a@x.example b@x.example; c@…") -> stored as "a@x.example, b@x.example, …"."""
    addresses = tier_addresses(text.replace(";", ",").replace(" ", ","))
    for address in addresses:
        try:
            validate_email(address)
        except forms.ValidationError:
            raise forms.ValidationError(f"{address!r} is not an e-mail address.") from None
    stored = ", ".join(dict.fromkeys(addresses))
    if len(stored) > Limit._meta.get_field("first_tier").max_length:
        raise forms.ValidationError("Too many addresses: name a group's address instead.")
    return stored
