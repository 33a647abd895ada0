"""Amounts as their currency writes them: 500 JPY, 25.00 EUR, 1.234 KWD (see ledger.money)."""

from django import template

from ledger import money

register = template.Library()


@register.filter
def in_currency(amount, currency):
    """`amount` with exactly its currency's decimals; as it is when either is missing."""
    if amount is None or amount == "" or not currency:
        return amount
    return str(money.quantized(amount, currency))
