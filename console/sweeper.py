"""The sweeper's passes as this product runs them: the ledger's mechanism (ledger.sweeper) with
the steps of the apps built on it, in this order, each under its name, which is also its lease
(one sweeper leads it at a time)."""

from approvals.reviews import approval_expire_due
from approvals.summaries import summarise_due
from dlq.alerts import alerts_redeliver_stale
from dlq.bulk import bulk_redrives_resume
from dlq.overdue import review_alert_overdue
from dlq.reconcile import reconcile_schedule
from ledger import sweeper
from sandbox.webhooks import webhooks_redeliver_stale

STEPS = (
    # An event of the sandbox provider whose delivery job Redis lost is sent all the same.
    ("sandbox_webhooks_redelivered", webhooks_redeliver_stale),
    # An approval nobody decided in time expires.
    ("approvals_expired", approval_expire_due),
    # The what-if's summary of a closed day, or of one changed since (decision 46).
    ("actions_summarised", summarise_due),
    # Never silent: a review item past its deadline alerts its tier, once, and escalates; an
    # alert whose delivery job was lost is enqueued again; the ledger is compared with the
    # providers' records every few minutes; a bulk redrive whose job was lost resumes.
    ("reviews_overdue", review_alert_overdue),
    ("alerts_redelivered", alerts_redeliver_stale),
    ("reconciliations_started", reconcile_schedule),
    ("bulk_redrives_resumed", bulk_redrives_resume),
)


def sweep_once(holder=None, ring_all=False):
    """One pass (ledger.sweeper.sweep_once) with every step above."""
    return sweeper.sweep_once(STEPS, holder, ring_all)


def sweep_forever(interval):
    return sweeper.sweep_forever(interval, STEPS)
