"""ledger.outages: a database outage is one warning in the log, and one more when it ends."""

import logging

import psycopg
import pytest

from ledger import outages
from tests.conftest import free_port


@pytest.fixture
def refused():
    """A real connection error: nothing listens on the port."""
    with pytest.raises(psycopg.OperationalError) as caught:
        psycopg.connect(f"postgresql://postgres@127.0.0.1:{free_port()}/surety", connect_timeout=2)
    return caught.value


def test_an_outage_is_logged_once_however_often_it_fails_and_once_more_when_it_ends(refused, caplog):
    outage = outages.Outage("drain of actions", logging.getLogger("surety.tests"))

    with caplog.at_level(logging.WARNING, logger="surety.tests"):
        waits = [outage.failed(refused) for _ in range(8)]
        outage.answered()
        outage.answered()

    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2, messages
    assert messages[0].startswith("drain of actions: the database is unreachable (OperationalError: connection failed")
    assert messages[1].startswith("drain of actions: the database answers again after")
    assert messages[1].endswith("(8 failed attempts)")
    assert waits == sorted(waits) and waits[0] == outages.BACKOFF_FIRST_SECONDS
    assert waits[-1] == outages.BACKOFF_MAX_SECONDS


def test_a_refused_connection_is_a_lost_one_and_a_statement_error_is_not(refused):
    assert outages.database_unreachable(refused) and outages.connection_lost(refused)
    deadlock = psycopg.errors.DeadlockDetected("deadlock detected")
    assert outages.database_unreachable(deadlock) and not outages.connection_lost(deadlock)
    assert not outages.database_unreachable(psycopg.errors.UniqueViolation("duplicate key"))
