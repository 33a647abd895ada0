"""A connection the server ended because its transaction sat idle too long
(idle_in_transaction_session_timeout, SQLSTATE 25P03) is a lost connection like any other, though
psycopg raises it as an InternalError, not an OperationalError: the sweeper and a drain lane wait it
out as they wait out a failover, where they caught only OperationalError and InterfaceError, so the
sweeper ended and the drain job failed. The error is PostgreSQL's own, met by Django's connection."""

import psycopg
import pytest
from django.db import InternalError, connection, transaction

from ledger import jobs, sweeper
from ledger.models import StepLease
from tests.conftest import _database_url, wait_until

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's idle timeout")]


def idled_in_a_transaction(met):
    """A statement of Django's connection after the server ended it for idling in its transaction
    (the error appended to `met`, then raised)."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL idle_in_transaction_session_timeout = '100ms'")
            cursor.execute("SELECT pg_backend_pid()")
            [pid] = cursor.fetchone()
        with psycopg.connect(_database_url(), autocommit=True) as other:
            wait_until(lambda: not other.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone(),
                       seconds=10, interval=0.05, message="the server to end the idle session")
        try:
            StepLease.objects.exists()
        except Exception as exc:
            met.append(exc)
            raise


def ended_for_idling(met):
    """What the tests below rely on: the server's 25P03, which Django wraps as an InternalError."""
    [exc] = met
    return isinstance(exc, InternalError) and exc.__cause__.sqlstate == "25P03"


class Stop(Exception):
    """Ends the sweeper's loop from its second pass (any error but an outage ends it)."""


def test_the_sweeper_waits_it_out(settings):
    settings.RQ_ASYNC = False
    met, passes = [], []

    def step():
        passes.append(len(passes) + 1)
        if len(passes) == 1:
            idled_in_a_transaction(met)
        raise Stop

    with pytest.raises(Stop):
        sweeper.sweep_forever(0.01, [("idled", step)])
    assert ended_for_idling(met) and passes == [1, 2]


@pytest.mark.parametrize("where", ["claim", "run"])
def test_a_drain_lane_waits_it_out_and_gives_back_the_run_it_cut_short(settings, jobs_to_test_redis, where):
    settings.DRAIN_LANES = 1
    met, claims, given_back = [], [], []

    def claim_next(owner):
        claims.append(owner)
        if where == "claim" and len(claims) == 1:
            idled_in_a_transaction(met)
        return "claimed" if len(claims) == 1 else None

    def run_claimed(claimed):
        idled_in_a_transaction(met)

    handled = jobs.drain("actions", claim_next, run_claimed, given_back.append)
    assert ended_for_idling(met) and len(claims) == 2 and handled == 0
    assert given_back == ([] if where == "claim" else ["claimed"])
