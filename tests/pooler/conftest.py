"""Everything in tests/pooler/ runs through a PgBouncer in transaction pooling mode
(bench/pgbouncer.py): the gunicorn server and the RQ workers the tests start, with
DATABASE_POOLER=transaction as a deployment behind one would set it, and this process's own
connections too (the replay set runs its cases here), with what that setting changes.

The tests themselves are the ones of the direct stack, imported into these modules: the
`server` below takes the place of tests/conftest.py's for them, and so does the `stack` built
on it. Only the test database's creation and the first flush go straight to PostgreSQL.
"""

import pytest
from django.db import connection

from bench.pgbouncer import PgBouncer
from config.settings import behind_transaction_pooler
from tests.conftest import running_server


@pytest.fixture(scope="session")
def pgbouncer(django_db_setup):
    """Stopped before the test database is dropped, which its server connections would keep."""
    with PgBouncer() as bouncer:
        yield bouncer


@pytest.fixture(scope="session")
def server(django_db_setup, django_db_blocker, pgbouncer):
    with running_server(django_db_blocker, DATABASE_URL=pgbouncer.url(connection.settings_dict["NAME"]),
                        DATABASE_POOLER="transaction") as stack:
        yield stack


@pytest.fixture(autouse=True)
def this_process_through_pgbouncer(pgbouncer):
    """This process's connections (every thread's: they share the settings) go through
    PgBouncer for the test, set up as DATABASE_POOLER=transaction sets them up."""
    database = connection.settings_dict
    saved = {name: database.get(name) for name in ("HOST", "PORT", "OPTIONS", "DISABLE_SERVER_SIDE_CURSORS")}
    connection.close()
    database.update(HOST="127.0.0.1", PORT=pgbouncer.port)
    behind_transaction_pooler(database)
    yield
    connection.close()
    database.update(saved)
