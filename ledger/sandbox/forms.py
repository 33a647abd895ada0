"""Input validation for the sandbox's JSON bodies, one form per write operation."""

from datetime import UTC
from decimal import Decimal

import pycountry
from django import forms
from django.core.exceptions import ValidationError

from .models import SandboxFault, SandboxMessage

CENT = Decimal("0.01")


class AmountField(forms.DecimalField):
    def __init__(self, **kwargs):
        super().__init__(max_digits=12, decimal_places=2, min_value=CENT, **kwargs)

    def clean(self, value):
        # Quantized here so a stored amount and a fresh one render alike ("25.50", not "25.5").
        return super().clean(value).quantize(CENT)


class CurrencyField(forms.CharField):
    def __init__(self, **kwargs):
        super().__init__(min_length=3, max_length=3, **kwargs)

    def clean(self, value):
        code = super().clean(value)
        if pycountry.currencies.get(alpha_3=code) is None or code != code.upper():
            raise ValidationError("Must be an ISO 4217 currency code such as EUR.")
        return code


class UTCDateTimeField(forms.DateTimeField):
    def clean(self, value):
        # Naive times are taken as UTC (the project's time zone); aware ones are kept in UTC so a
        # stored booking and a fresh one render alike.
        return super().clean(value).astimezone(UTC)


class EffectForm(forms.Form):
    """A write call's `metadata`, which may carry the ledger's operation key."""

    metadata = forms.Field(required=False)

    def clean_metadata(self):
        metadata = self.cleaned_data["metadata"] or {}
        if not isinstance(metadata, dict):
            raise ValidationError("Must be an object.")
        operation_key = metadata.get("operation_key", "")
        if not isinstance(operation_key, str) or len(operation_key) > 255:
            raise ValidationError("operation_key must be a string of at most 255 characters.")
        return metadata

    def clean(self):
        cleaned = super().clean()
        cleaned["operation_key"] = cleaned.get("metadata", {}).get("operation_key", "")
        return cleaned


class RefundForm(EffectForm):
    order_id = forms.CharField(max_length=255)
    amount = AmountField()
    currency = CurrencyField()


class MessageForm(EffectForm):
    recipient = forms.CharField(max_length=255)
    channel = forms.ChoiceField(choices=SandboxMessage.Channel.choices)
    message_type = forms.CharField(max_length=100)
    body = forms.CharField(strip=False)


class BookingForm(EffectForm):
    resource = forms.CharField(max_length=255)
    customer = forms.CharField(max_length=255)
    service = forms.CharField(max_length=255)
    start = UTCDateTimeField()
    end = UTCDateTimeField()

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("start") and cleaned.get("end") and cleaned["end"] <= cleaned["start"]:
            self.add_error("end", "Must be after start.")
        return cleaned


class OrderForm(forms.Form):
    order_id = forms.CharField(max_length=255)
    customer = forms.CharField(max_length=255)
    amount = AmountField()
    currency = CurrencyField()


class FaultForm(forms.Form):
    target = forms.CharField(max_length=255)
    fault = forms.ChoiceField(choices=SandboxFault.Kind.choices)
    times = forms.IntegerField(min_value=1, required=False)

    def clean_times(self):
        return self.cleaned_data["times"] or 1
