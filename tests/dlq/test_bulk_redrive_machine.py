"""A bulk redrive's two machines, written out here rather than read from the product: the run
(planned, running, stopping, finished, stopped) and each item's outcome, one move out of
`planned`. A move the table refuses changes nothing, and so does one made from a stale copy."""

import itertools
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from dlq.models import BulkRedrive, BulkRedriveItem, DeadLetter
from dlq.redrive_runs import ITEM_TRANSITIONS, RUN_TRANSITIONS, Outcome, Plan, RunStatus
from ledger.models import ActionStatus, AuditEvent
from ledger.statemachine import InvalidTransition
from tests.factories import make_action, make_agent

RUN = {"planned": {"running"}, "running": {"stopping", "finished", "stopped"}, "stopping": {"stopped"},
       "finished": set(), "stopped": set()}
ITEM = {"planned": {"redriven", "skipped", "failed", "left_open"}, "redriven": set(), "skipped": set(),
        "failed": set(), "left_open": set()}


def as_strings(table):
    return {str(a): {str(b) for b in to} for a, to in table.items()}


def test_each_machine_has_exactly_this_table_over_every_status():
    assert as_strings(RUN_TRANSITIONS) == RUN and set(RUN) == set(RunStatus.values)
    assert as_strings(ITEM_TRANSITIONS) == ITEM and set(ITEM) == set(Outcome.values)


MOVES = {"running": lambda run, user: run.start(actor=user, reason="go", rate=Decimal("10"), ceiling=Decimal("60")),
         "stopping": lambda run, user: run.ask_to_stop(actor=user, reason="enough"),
         "finished": lambda run, user: run.finish(actor="system:tests"),
         "stopped": lambda run, user: run.stop(actor="system:tests", stop_reason="a spike")}


@pytest.mark.django_db
@pytest.mark.parametrize(("start", "to"), [pytest.param(a, b, id=f"{a}->{b}") for a, b in
                                           itertools.product(RUN, MOVES) if b not in RUN[a]])
def test_a_move_the_run_table_refuses_changes_nothing(start, to):
    user = get_user_model().objects.create_user("olga", password=None)
    run = BulkRedrive.objects.create(filters={}, planned_by="olga", ceiling=Decimal("60"), status=start,
                                     started_by=user, rate=Decimal("10"), started_at="2026-09-10T03:00:00Z")
    before = AuditEvent.objects.count()
    with pytest.raises(InvalidTransition):
        MOVES[to](run, user)
    assert BulkRedrive.objects.get(pk=run.pk).status == start and AuditEvent.objects.count() == before


@pytest.mark.django_db
def test_a_stale_copy_of_an_item_cannot_overwrite_the_outcome_written_meanwhile():
    agent = make_agent("billing")[0]
    action = make_action(agent, ActionStatus.FAILED, key="refund:ORD-ST:full:dec-1", target="ORD-ST",
                         error={"code": "provider_unavailable", "message": "503", "retryable": True})
    run = BulkRedrive.objects.create(filters={}, planned_by="olga", ceiling=Decimal("60"))
    entry = DeadLetter.objects.open_for_action(action, actor="system:tests")
    item = BulkRedriveItem.objects.create(run=run, entry=entry, position=1, plan=Plan.ACTION_RETRY)
    stalled = BulkRedriveItem.objects.get(pk=item.pk)  # what a job that stalls holds: `planned`
    redriven_at = timezone.now()
    item.settle(Outcome.REDRIVEN, "one more attempt", redriven_at=redriven_at)

    with pytest.raises(InvalidTransition, match="it is redriven now"):
        stalled.settle(Outcome.SKIPPED, "already redriven by user:olga")
    assert BulkRedriveItem.objects.values_list("outcome", "outcome_detail", "redriven_at").get() == (
        "redriven", "one more attempt", redriven_at)
