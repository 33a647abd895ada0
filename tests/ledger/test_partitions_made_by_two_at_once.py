"""Two passes making a table's next partitions at once (a sweeper's pass that outlasted its step's
lease and the next leader's, or `migrate` beside a sweeper): both read the same ranges and would
create the same next one, and the later CREATE TABLE failed (a duplicate table, neither a busy
table nor writers that overtook the pass), ending its sweeper. They take turns: the second reads
the ranges once the first has committed, and makes nothing (PostgreSQL)."""

import threading

import pytest
from django.db import connection

from ledger.partitions import AUDIT, Partitioned
from tests.conftest import wait_until
from tests.factories import sessions_waiting_for_a_lock
from tests.ledger.test_partitions import postgresql_only, query, sequence, top  # noqa: F401 (a fixture)


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_second_pass_making_the_same_partitions_waits_for_the_first_and_makes_nothing(
        settings, sequence, monkeypatch):  # noqa: F811 (the fixture)
    settings.PARTITION_EVENTS = 4
    start = top()
    sequence(start - 2)  # two ids left: each pass would make the range from `start`
    ranges, other, made, failed = Partitioned.ranges, [], [], []

    def second_pass():
        try:
            made.append(AUDIT.extend(settings.PARTITION_EVENTS))
        except Exception as exc:  # noqa: BLE001 (asserted in the test's thread)
            failed.append(exc)
        finally:
            connection.close()  # the thread's own

    def ranges_then_another_pass(self):
        """Once this pass has read the ranges, another pass runs, in its own session, until it is
        done or waits for this one."""
        found = ranges(self)
        if self == AUDIT and not other:
            other.append(threading.Thread(target=second_pass))
            other[0].start()
            wait_until(lambda: not other[0].is_alive() or sessions_waiting_for_a_lock("pg_advisory_xact_lock"),
                       seconds=30, message="the other pass to be done or to wait for this one")
        return found

    monkeypatch.setattr(Partitioned, "ranges", ranges_then_another_pass)
    try:
        first = AUDIT.extend(settings.PARTITION_EVENTS)
        other[0].join(30)
        assert not failed, failed
        assert sorted([first, *made]) == [0, 1]
        ahead = [(p.low, p.high) for p in AUDIT.ranges() if p.low is not None and p.low >= start]
        assert ahead == [(start, start + 4)]
    finally:
        for thread in other:
            thread.join(30)
        for partition in AUDIT.ranges():
            if partition.low is not None and partition.low >= start:
                query(f"DROP TABLE {partition.name}")
