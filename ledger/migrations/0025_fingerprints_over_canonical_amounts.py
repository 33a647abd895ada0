"""Fingerprints over canonical amounts: a refund's print, and a refund task's, is taken with the
amount written with exactly its currency's decimals and the currency upper-cased, so that "25"
and "25.00" EUR are one request (ledger.money.canonical). The refunds and tasks recorded before
are given their print under that rule, so that a replay of one recorded as "25" matches "25"
and "25.00" alike; so are the prints that bind a person's decision to those params (the
approval the executor checks, a first of two approvals, a decision's record): the params are
the same, only the way they are hashed changes. The audit trail keeps what it recorded."""

import hashlib
import json
from decimal import Decimal, InvalidOperation

from babel.numbers import get_currency_precision
from django.db import migrations

BATCH = 1000
LEDGER_PLACES = 3


def hashed(kind, target, params):
    """As ledger.models.fingerprint hashed a request when this migration was written (a
    migration keeps the rules it ran with)."""
    text = json.dumps([kind, target, params], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def canonical(params):
    """As ledger.money.canonical wrote an amount when this migration was written: with exactly
    its currency's CLDR decimals (at most the ledger's three), never rounded into another."""
    amount, currency = params.get("amount"), params.get("currency")
    if isinstance(amount, bool) or not isinstance(amount, str | int) or not isinstance(currency, str):
        return params
    try:
        digits = min(get_currency_precision(currency.upper()), LEDGER_PLACES)
        written = Decimal(amount).quantize(Decimal(1).scaleb(-digits))
        if written != Decimal(amount):
            return params
    except (InvalidOperation, ValueError):
        return params
    return {**params, "amount": str(written), "currency": currency.upper()}


def _moves(rows, request):
    """(row, old print, new print) for each row whose print the rule changes; `request(row)`
    is what the row's print is taken over: (kind, target, params)."""
    for row in rows:
        kind, target, params = request(row)
        old, new = hashed(kind, target, params), hashed(kind, target, canonical(params))
        if old != new:
            yield row, old, new


def _reprint(apps, forward):
    """1. Refunds: the print, and the approval bound to it, where they are of the params as
       they were hashed before (`forward`; backwards, the other way round).
    2. What people's decisions on those refunds were bound to: each approval of two, each
       decision's record.
    3. Refund tasks: the print of their input."""
    Action, Task = apps.get_model("ledger", "Action"), apps.get_model("ledger", "Task")
    Approval, ReviewItem = apps.get_model("approvals", "Approval"), apps.get_model("approvals", "ReviewItem")
    refunds = Action.objects.filter(action_type="refund", params__has_key="amount").only(
        "id", "action_type", "target", "params", "fingerprint", "approved_fingerprint")
    moved = {}  # action id -> {print before: print after}
    batch = []
    for action, old, new in _moves(refunds.iterator(chunk_size=BATCH), lambda a: (a.action_type, a.target, a.params)):
        before, after = (old, new) if forward else (new, old)
        moved[action.pk] = {before: after}
        if action.fingerprint == before or action.approved_fingerprint == before:
            action.fingerprint = after if action.fingerprint == before else action.fingerprint
            action.approved_fingerprint = after if action.approved_fingerprint == before else action.approved_fingerprint
            batch.append(action)
        if len(batch) == BATCH:
            Action.objects.bulk_update(batch, ["fingerprint", "approved_fingerprint"])
            batch = []
    Action.objects.bulk_update(batch, ["fingerprint", "approved_fingerprint"])

    ids = list(moved)
    for start in range(0, len(ids), BATCH):
        chunk = ids[start:start + BATCH]
        approvals = [a for a in Approval.objects.filter(item__action_id__in=chunk).select_related("item")
                     if a.fingerprint in moved[a.item.action_id]]
        for approval in approvals:
            approval.fingerprint = moved[approval.item.action_id][approval.fingerprint]
        Approval.objects.bulk_update(approvals, ["fingerprint"])
        items = [i for i in ReviewItem.objects.filter(action_id__in=chunk) if i.decided_fingerprint in moved[i.action_id]]
        for item in items:
            item.decided_fingerprint = moved[item.action_id][item.decided_fingerprint]
        ReviewItem.objects.bulk_update(items, ["decided_fingerprint"])

    tasks = Task.objects.filter(input__has_key="amount").only("id", "workflow", "task_id", "input", "fingerprint")
    batch = []
    for task, old, new in _moves(tasks.iterator(chunk_size=BATCH), lambda t: (f"workflow:{t.workflow}", t.task_id,
                                                                               t.input)):
        before, after = (old, new) if forward else (new, old)
        if task.fingerprint == before:
            task.fingerprint = after
            batch.append(task)
        if len(batch) == BATCH:
            Task.objects.bulk_update(batch, ["fingerprint"])
            batch = []
    Task.objects.bulk_update(batch, ["fingerprint"])


def forwards(apps, schema_editor):
    _reprint(apps, forward=True)


def backwards(apps, schema_editor):
    _reprint(apps, forward=False)


class Migration(migrations.Migration):

    dependencies = [
        ("ledger", "0024_refund_once_per_decision"),
        ("approvals", "0008_approvals_bound_edited_expired"),
    ]

    operations = [
        migrations.RunPython(forwards, backwards),
    ]
