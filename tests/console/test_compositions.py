"""What the console lists instead of registering: each list holds what it must, once."""

import pytest

from console.monitoring import COLLECTORS
from console.sweeper import STEPS, sweep_once
from ledger import sweeper
from ledger.metrics import REGISTRY

pytestmark = pytest.mark.django_db


def test_every_sweeper_step_has_a_lease_of_its_own_and_runs_in_every_pass(settings):
    settings.RQ_ASYNC = False
    names = [name for name, _ in STEPS]
    ledgers_own = set(sweeper.sweep_once(()))
    # A step's name is its lease: two steps under one name would share one leader, and the
    # pass's report would keep only the second one's count.
    assert len(set(names)) == len(names) and ledgers_own.isdisjoint(names)
    assert [name for name in sweep_once() if name not in ledgers_own] == names


def test_metrics_shows_what_every_listed_collector_reads():
    shown = {family.name for family in REGISTRY.collect()}
    for collector in COLLECTORS:
        assert {family.name for family in collector.collect()} <= shown, type(collector).__name__
