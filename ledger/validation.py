"""Validation shared by the agents' API, the workflows' inputs, the ledger's own edits
(ledger.versions) and the pages' filters: amounts, currencies, each action type's params, moments,
and serializers that refuse what they do not know."""

import re
import threading
from decimal import Decimal, InvalidOperation

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.functional import cached_property
from rest_framework import serializers

from ledger import currencies, money
from ledger.compiled import register_cache
from ledger.recipients import customer_spelling
from ledger.connectors import NoConnector, connector_for
from ledger.models import ActionType

MAX_AMOUNT = Decimal("1000000000")


class AmountField(serializers.Field):
    """A decimal string such as "25.00": never a JSON number, positive, with at most the
    decimals the ledger keeps; its currency's own limit is checked beside the currency."""

    default_error_messages = {
        "type": 'Send the amount as a decimal string, e.g. "25.00", not as a number.',
        "invalid": "Not a decimal number.",
        "positive": "Must be greater than zero.",
        "places": f"At most {money.LEDGER_PLACES} decimal places.",
        "large": "Too large.",
    }

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("type")
        if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", data.strip()):
            self.fail("positive" if data.strip().startswith("-") else "invalid")
        try:
            amount = Decimal(data.strip())
        except InvalidOperation:
            self.fail("invalid")
        if amount <= 0:
            self.fail("positive")
        if money.places(amount) > money.LEDGER_PLACES:
            self.fail("places")
        if amount >= MAX_AMOUNT:
            self.fail("large")
        return data.strip()

    def to_representation(self, value):
        return str(value)


class CurrencyField(serializers.CharField):
    """An ISO 4217 code of a currency one may pay in (ledger.currencies): not XXX, XTS, a
    metal, a fund or a code no longer in use, which no limit in real currencies covers."""

    def to_internal_value(self, data):
        code = super().to_internal_value(data).upper()
        problem = currencies.currency_problem(code)
        if problem:
            raise serializers.ValidationError(problem)
        return code


class CustomerField(serializers.CharField):
    """A customer, in the one spelling the ledger keeps (`customer_spelling`), before its length
    is checked (NFKC may lengthen it)."""

    def to_internal_value(self, data):
        return customer_spelling(super().to_internal_value(data))


_field_sets = threading.local()
register_cache("ledger.validation._field_sets", holds="each strict serializer's bound fields, per thread",
               stale_when="never: fields keep nothing between calls", clear=lambda: _field_sets.__dict__.clear())


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not know: what is not validated must not reach the ledger.

    Its fields are copied once per thread rather than for every instance: DRF deep-copies
    every declared field of every serializer it builds, a third of a millisecond on each
    request. A thread validates with one instance of a class at a time, and the fields keep
    nothing between calls but their binding, which each instance renews."""

    @cached_property
    def fields(self):
        cache = _field_sets.__dict__.setdefault("by_class", {})
        fields = cache.get(type(self))
        if fields is None:
            fields = cache[type(self)] = super().fields
        else:  # bound as BindingDict bound them, to the instance in hand
            fields.serializer = self
            for field in fields.values():
                field.parent = self
        return fields

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


def amount_problem(action_type, amount, currency):
    """Why `amount` in `currency` cannot be paid by an action of `action_type`, or None:
    more decimals than the currency has (0.5 JPY), or an amount the type's connector's provider
    cannot take in its own units (1.255 KWD at Stripe, which takes a three-decimal currency's
    amounts in multiples of 0.010)."""
    problem = money.places_problem(Decimal(amount), currency)
    if problem:
        return problem
    try:
        connector = connector_for(action_type)
    except NoConnector:  # no start gets this far without one (manage.py check, surety.E001)
        return None
    return connector.amount_problem(amount, currency)


class PayableAmount:
    """The `validate` of a serializer with an `amount` and its `currency` (a refund's params, a
    refund workflow's input): refused, with the reason, unless the refund's connector can pay
    it; the amount kept in its canonical form, with exactly the currency's decimals ("25" EUR
    is kept as "25.00"), as its fingerprint is taken (ledger.money.canonical)."""

    action_type = ActionType.REFUND

    def validate(self, data):
        problem = amount_problem(self.action_type, data["amount"], data["currency"])
        if problem:
            raise serializers.ValidationError({"amount": [problem]})
        return money.canonical(data)


class RefundParams(PayableAmount, StrictSerializer):
    amount = AmountField()
    currency = CurrencyField()
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True)


class MessageParams(StrictSerializer):
    channel = serializers.ChoiceField(choices=["email", "sms", "whatsapp"])
    message_type = serializers.CharField(max_length=100)
    body = serializers.CharField(max_length=10_000)


class BookingParams(StrictSerializer):
    service = serializers.CharField(max_length=200)
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()

    def validate(self, data):
        if data["end"] <= data["start"]:
            raise serializers.ValidationError({"end": ["Must be after start."]})
        return data


PARAMS = {
    ActionType.REFUND: RefundParams,
    ActionType.SEND_MESSAGE: MessageParams,
    ActionType.CREATE_BOOKING: BookingParams,
}


def parse_moment(value):
    """A filter's date-time (ISO 8601, or a datetime-local input's naive one, taken in the
    current time zone) as an aware datetime; None for a missing or malformed one.

    `parse_datetime` raises ValueError for well-formed but impossible values
    ("2026-13-45T99:99"), and an offset at the edge of the calendar
    ("0001-01-01T00:00+01:00") overflows when converted."""
    try:
        moment = parse_datetime((value or "").strip())
        if moment is None:
            return None
        if timezone.is_naive(moment):
            moment = timezone.make_aware(moment)
        moment.astimezone(timezone.get_current_timezone())  # raises OverflowError out of range
        return moment
    except (ValueError, OverflowError):
        return None
