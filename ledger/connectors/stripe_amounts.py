"""Amounts as Stripe's API counts them, which is not always as CLDR does (ledger.money).

Stripe takes every amount as an integer of the currency's "smallest unit", by rules of its
own, published at https://docs.stripe.com/currencies (sections "Zero-decimal",
"Three-decimal" and "Special cases"):

1. Zero-decimal currencies (its list, ZERO_DECIMAL): 1500 JPY is 1500.
2. Three-decimal currencies (BHD, JOD, KWD, OMR, TND): 1.250 KWD is 1250, and the last digit
   must be 0 for Stripe's payment partners, so 1.255 KWD cannot be sent at all.
3. Every other currency has two decimals in the API, whatever CLDR says: HUF 5000 is 500000,
   where CLDR (and so the ledger) writes HUF, ISK, COP, IDR and others with none.
4. Special cases:
   - ISK: whole krónur only since 2023-04-14, but still two decimals in the API for backwards
     compatibility: an amount must be divisible by 100 (5 ISK is 500; Stripe refuses others
     with `invalid_charge_amount_no_decimal_compatible`, see
     https://support.stripe.com/questions/deprecation-of-fractional-isk-charges-and-refunds).
   - HUF and TWD: zero-decimal for payouts only; charges and refunds take two decimals, so
     rule 3 holds (10.50 TWD is 1050). This connector makes no payouts.
   - UGX: in the zero-decimal list for charges and refunds (5000 UGX is 5000); its special
     case concerns payouts too.

The connector converts with these (StripeConnector.to_provider_units), and so does the
sandbox's imitation of Stripe's wire format, so that both count alike.
"""

from decimal import Decimal, InvalidOperation

from .. import money

ZERO_DECIMAL = frozenset("BIF CLP DJF GNF JPY KMF KRW MGA PYG RWF UGX VND VUV XAF XOF XPF".split())
THREE_DECIMAL = frozenset("BHD JOD KWD OMR TND".split())
# Units an amount must be a multiple of: whole krónur (rule 4), a three-decimal's last digit 0 (rule 2).
_STEP = {"ISK": 100, **dict.fromkeys(THREE_DECIMAL, 10)}


def digits(currency):
    """The decimals of one of Stripe's units of `currency` (any case): 0, 2 or 3."""
    code = currency.upper()
    return 0 if code in ZERO_DECIMAL else 3 if code in THREE_DECIMAL else 2


def to_units(amount, currency):
    """The integer Stripe takes for `amount` (a decimal string or Decimal) in `currency`.
    Raises ValueError, saying why for the agent, for an amount Stripe cannot take."""
    code = currency.upper()
    try:
        value = Decimal(amount).scaleb(digits(code))
    except InvalidOperation:
        raise ValueError(f"{amount!r} is not an amount") from None
    step = _STEP.get(code, 1)
    if value != value.to_integral_value() or value % step:
        smallest = Decimal(step).scaleb(-digits(code))
        raise ValueError(f"Stripe takes {code} in multiples of {smallest}: {amount} {code} is not one.")
    return int(value)


def from_units(units, currency):
    """The amount `units` of Stripe's stand for, written with the currency's decimals where
    they hold it (500000 HUF is 5000; 500050 HUF, which CLDR cannot write, 5000.50)."""
    amount = Decimal(int(units)).scaleb(-digits(currency))
    written = money.quantized(amount, currency)
    return written if written == amount else amount
