"""Input validation for the sandbox's JSON bodies, one form per write operation."""

from datetime import UTC
from decimal import Decimal

import pycountry
from django import forms
from django.core.exceptions import ValidationError

from ledger import money

from .models import SandboxFault, SandboxMessage


class AmountField(forms.DecimalField):
    """Positive, with at most the ledger's decimals; the currency's own limit is checked by
    the form (`AmountInCurrency`), which knows the currency."""

    def __init__(self, **kwargs):
        super().__init__(max_digits=12, decimal_places=money.LEDGER_PLACES, min_value=Decimal("0.001"), **kwargs)


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
        # A JSON number reached DateTimeField.to_python (AttributeError on
        # .strip()) and a time at the calendar's edge ("0001-01-01T00:00+01:00") overflowed
        # converting to UTC (OverflowError): both were 500s.
        if value is not None and not isinstance(value, str):
            raise ValidationError("Must be an ISO 8601 date-time string.")
        # Naive times are taken as UTC (the project's time zone); aware ones are kept in UTC so a
        # stored booking and a fresh one render alike.
        try:
            return super().clean(value).astimezone(UTC)
        except OverflowError:
            raise ValidationError("Out of range.") from None


class StringsOnly:
    """A CharField takes any JSON value and stores its str() (an order_id sent
    as ["ORD-1"] was stored as "['ORD-1']"). Text fields of these forms take strings only."""

    def clean(self):
        for name, field in self.fields.items():
            value = self.data.get(name)
            if isinstance(field, forms.CharField) and value is not None and not isinstance(value, str):
                self.add_error(name, "Must be a string.")
        return super().clean()


class EffectForm(StringsOnly, forms.Form):
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


class AmountInCurrency:
    """An amount fits its currency's minor units (none for JPY, three for KWD), and is
    quantized to them so a stored amount and a fresh one render alike ("25.50", not "25.5")."""

    def clean(self):
        cleaned = super().clean()
        amount, currency = cleaned.get("amount"), cleaned.get("currency")
        if amount is not None and currency:
            digits = money.minor_digits(currency)
            if money.places(amount) > digits:
                self.add_error("amount", f"At most {digits} decimal places in {currency}.")
            else:
                cleaned["amount"] = money.quantized(amount, currency)
        return cleaned


class RefundForm(AmountInCurrency, EffectForm):
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


class OrderForm(AmountInCurrency, StringsOnly, forms.Form):
    order_id = forms.CharField(max_length=255)
    customer = forms.CharField(max_length=255)
    amount = AmountField()
    currency = CurrencyField()


class FaultForm(StringsOnly, forms.Form):
    target = forms.CharField(max_length=255)
    fault = forms.ChoiceField(choices=SandboxFault.Kind.choices)
    # At most what the column (a PostgreSQL integer) holds.
    times = forms.IntegerField(min_value=1, max_value=2**31 - 1, required=False)

    def clean_times(self):
        return self.cleaned_data["times"] or 1
