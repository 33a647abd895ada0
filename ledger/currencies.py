"""Which currency codes are money one may pay in: the only ones the intake takes.

ISO 4217 lists codes that are nobody's means of payment: XXX ("no currency"), XTS (for
testing), the precious metals (XAU, XAG, XPT, XPD), the IMF's special drawing right (XDR),
the bond markets' units (XBA to XBD), XSU, XUA, and the funds and units of account beside
a country's currency (BOV, CLF, COU, MXV, UYI, UYW, CHE, CHW, USN). Historic codes (DEM,
HRK, ANG) are no longer tender anywhere. A refund "in" any of them is a mistake or a probe,
and no limit set in real currencies covers it.

CLDR's supplemental data (through babel, which the ledger already reads for minor digits)
names, for every territory, the currencies that are legal tender there and from when to
when: a code is payable when some territory takes it as tender today. That leaves out all
of the above without a list of our own, and follows CLDR's updates (a new currency, one
withdrawn) with babel's.
"""

import functools

from babel.core import get_global
from babel.numbers import get_territory_currencies
from django.utils import timezone

from ledger.compiled import register_cache


@functools.lru_cache(maxsize=1)
def payable_on(day):
    """The codes some territory takes as legal tender on `day` (a date)."""
    return frozenset(code for territory in get_global("territory_currencies")
                     for code in get_territory_currencies(territory, day))


register_cache("ledger.currencies.payable_on", holds="the codes tender somewhere, for one day",
               clear=payable_on.cache_clear, stale_when="the day changes (it is keyed by the day) or babel is upgraded: restart the processes")


def payable():
    """The codes one may pay in today (UTC), sorted."""
    return sorted(payable_on(timezone.now().date()))


def is_payable(code):
    """Whether `code` (upper case) is a currency one may pay in today."""
    return code in payable_on(timezone.now().date())


def currency_problem(code):
    """Why `code` (upper case) is refused as a currency, in words for a person or an agent, or
    None: the one rule of the API's params and the limits form."""
    if len(code) != 3 or not code.isalpha():
        return "Not an ISO 4217 currency code."
    if not is_payable(code):
        return (f"{code} is not a currency one may pay in: no country takes it as legal tender today "
                "(ISO 4217 also lists codes for no currency, tests, metals, funds and units of account).")
    return None
