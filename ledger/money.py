"""Amounts and their currencies' minor units: JPY has none, EUR two, KWD three.

The number of minor digits comes from CLDR's currency data (via babel): how amounts are
written and shown, and how many decimals an amount may have. A provider may count in other
units (Stripe takes HUF and ISK in hundredths, which CLDR has none of): each connector
converts with its provider's own rules (`Connector.to_provider_units`); the functions here
are the default. The ledger's amount column keeps at most three decimals.
"""

from decimal import Context, Decimal, InvalidOperation

from babel.numbers import get_currency_precision

LEDGER_PLACES = 3


def minor_digits(currency):
    """Decimals an amount in `currency` may have (an ISO 4217 code, any case)."""
    return min(get_currency_precision(currency.upper()), LEDGER_PLACES)


def places(amount):
    """Decimals `amount` (a Decimal) needs: "25.50" needs one, "500.00" none. Normalised with as
    many digits as it has: the default context's 28 would round "25.0000000000000000000000000001"
    to 25 first, and find it needs none."""
    return max(-amount.normalize(Context(prec=max(len(amount.as_tuple().digits), 1))).as_tuple().exponent, 0)


def places_problem(amount, currency):
    """Why `amount` (a Decimal) is no amount of `currency`, or None: more decimals than it has
    (0.5 JPY, 500.015 EUR)."""
    digits = minor_digits(currency)
    return f"At most {digits} decimal places in {currency}." if places(amount) > digits else None


def quantized(amount, currency):
    """`amount` written with exactly the currency's decimals ("25.5" EUR -> "25.50")."""
    return Decimal(amount).quantize(Decimal(1).scaleb(-minor_digits(currency)))


def to_minor_units(amount, currency):
    """The integer a provider takes for `amount`: 25.00 EUR -> 2500, 500 JPY -> 500, 1.500 KWD -> 1500."""
    value = Decimal(amount).scaleb(minor_digits(currency))
    if value != value.to_integral_value():
        raise ValueError(f"{amount} has more decimals than {currency.upper()} allows")
    return int(value)


def from_minor_units(units, currency):
    """The amount an integer of minor units stands for, written with the currency's decimals."""
    return quantized(Decimal(int(units)).scaleb(-minor_digits(currency)), currency)


def canonical(params):
    """`params` with the amount in its canonical form, the one a fingerprint is taken over: written
    with exactly its currency's decimals, the currency upper-cased ("25" EUR and "25.00" eur
    are the same amount, "25.00" EUR). `params` as they are where they have no amount and
    currency, or an amount the currency cannot hold (never rounded into another one)."""
    amount, currency = params.get("amount"), params.get("currency")
    if not isinstance(amount, str | Decimal | int) or isinstance(amount, bool) or not isinstance(currency, str):
        return params
    try:
        written = quantized(amount, currency)
        if written != Decimal(amount):
            return params
    except (InvalidOperation, ValueError):
        return params
    return {**params, "amount": str(written), "currency": currency.upper()}
