"""Pure policy: a limit and an action's amount in, a verdict out. No database here."""

from dataclasses import dataclass
from decimal import Decimal

from ledger import money as minor
from ledger.hooks import RUN, Verdict  # approvals_needed 0: run it; 1: one approver; 2: two different approvers


def money(amount, currency):
    """`amount` as `currency` writes it (decision 32): 1000.000 EUR -> "1000.00", 15000 JPY ->
    "15000", 150.5 KWD -> "150.500", in the reasons people read and the limits' snapshots (two
    decimals whatever the currency made a limit of 10000 JPY "10000.00 JPY", one of 100.500 KWD
    "100.50 KWD"). An amount with more decimals than its currency has (a limit saved before the
    form refused them) is written whole, never rounded."""
    written = minor.quantized(amount, currency)
    return f"{written if written == amount else amount:f}"


# The code of a request refused because no limit of its type covers its currency.
NOT_COVERED = "currency_not_covered"


@dataclass(frozen=True)
class Uncovered:
    """Where an action type has limits, but not in this currency: the limit's place is not
    empty (which would let any amount in any other currency run unchecked) but this, so
    the policy fails closed. `covered`: the currencies that have a limit of the type;
    `refuse`: a new request is refused at intake rather than waiting for a person
    (LIMITS_UNCOVERED_CURRENCY)."""

    action_type: str
    currency: str
    covered: tuple[str, ...]
    refuse: bool = False

    def why(self):
        return f"no {self.action_type} limit covers {self.currency} (limits are set in {', '.join(self.covered)})"


def verdict_for(limit, amount: Decimal | None, customer_total_today: Decimal = Decimal(0), *,
                no_customer: bool = False) -> Verdict:
    """`limit`: a Limit (or the what-if's proposal), an Uncovered, or None: no limit of the
    type at all, so it runs. `no_customer`: the request names none, and its total today is
    that of the requests that name none (they share one, decision 30)."""
    if limit is None or amount is None:
        return RUN
    if isinstance(limit, Uncovered):
        # A refusal still names an approver: whatever reads only approvals_needed waits.
        if limit.refuse:
            return Verdict(1, f"{limit.why()}: refused at intake", refused=NOT_COVERED)
        return Verdict(1, f"{limit.why()}: a person approves")
    if limit.dual_approval_above is not None and amount > limit.dual_approval_above:
        return Verdict(2, f"{money(amount, limit.currency)} {limit.currency} is above "
                          f"{money(limit.dual_approval_above, limit.currency)}: two approvers")
    if amount > limit.max_amount:
        return Verdict(1, f"{money(amount, limit.currency)} {limit.currency} is above the limit of "
                          f"{money(limit.max_amount, limit.currency)}")
    if limit.daily_customer_total is not None and customer_total_today + amount > limit.daily_customer_total:
        whose = f"the total today of {limit.action_type}s that name no customer" if no_customer else \
            "the customer's total today"
        return Verdict(
            1,
            f"{whose} would be {money(customer_total_today + amount, limit.currency)} {limit.currency}, "
            f"above {money(limit.daily_customer_total, limit.currency)}",
        )
    return RUN
