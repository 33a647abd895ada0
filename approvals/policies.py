"""Pure policy: a limit and an action's amount in, a verdict out. No database here."""

from decimal import Decimal

from ledger.hooks import RUN, Verdict  # approvals_needed 0: run it; 1: one approver; 2: two different approvers

CENTS = Decimal("0.01")


def money(amount):
    """1000.000 -> "1000.00"; keeps a third decimal only where there is one."""
    return f"{amount.quantize(CENTS) if amount == amount.quantize(CENTS) else amount:f}"


def verdict_for(limit, amount: Decimal | None, customer_total_today: Decimal = Decimal(0)) -> Verdict:
    if limit is None or amount is None:
        return RUN
    if limit.dual_approval_above is not None and amount > limit.dual_approval_above:
        return Verdict(2, f"{money(amount)} {limit.currency} is above {money(limit.dual_approval_above)}: two approvers")
    if amount > limit.max_amount:
        return Verdict(1, f"{money(amount)} {limit.currency} is above the limit of {money(limit.max_amount)}")
    if limit.daily_customer_total is not None and customer_total_today + amount > limit.daily_customer_total:
        return Verdict(
            1,
            f"the customer's total today would be {money(customer_total_today + amount)} {limit.currency}, "
            f"above {money(limit.daily_customer_total)}",
        )
    return RUN
