"""A bulk redrive's two machines, written out here rather than read from the product: the run
(planned, running, stopping, finished, stopped) and each item's outcome, one move out of
`planned`. A move the table refuses changes nothing."""

import itertools
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model

from dlq.models import BulkRedrive
from dlq.redrive_runs import ITEM_TRANSITIONS, RUN_TRANSITIONS, Outcome, RunStatus
from ledger.models import AuditEvent
from ledger.statemachine import InvalidTransition

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
