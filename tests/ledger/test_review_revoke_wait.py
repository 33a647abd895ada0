"""A revoke has committed when it waits for the calls claimed under its grant: whatever the database
does to that wait, the revoke stands and returns. An InterfaceError (a connection already closed, or
in a state it cannot be used in) is no DatabaseError to Django, and went up to the revoke's caller,
which took a revoke that was made for one that was not."""

from contextlib import contextmanager

import pytest
from django.db import InterfaceError, connection

from ledger.grants import grant_state
from ledger.models import Agent
from tests.factories import audit_events
from tests.ledger.test_grant_revoke_before_the_call import REFUND, claimed, revoke

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]


@contextmanager
def the_wait_meets_a_closed_connection():
    """The wait's first look for claimed actions finds its connection unusable."""
    met = []

    def closed(execute, sql, params, many, context):
        if not met and '"lease_expires_at" >' in sql:
            met.append(sql)
            raise InterfaceError("connection already closed")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(closed):
        yield met


def test_a_revoke_whose_wait_meets_a_closed_connection_returns_and_says_so(agent, caplog):
    claimed(agent, "refund:ORD-1:dec-1")  # its lease running: the revoke waits
    with caplog.at_level("WARNING", logger="surety.grants"), the_wait_meets_a_closed_connection() as met:
        revoke(agent)

    assert met, "the wait never looked"
    assert audit_events(agent, "revoked").exists()
    assert grant_state(Agent.objects.get(pk=agent.pk), *REFUND) is None
    assert "the wait for the calls under the grant was cut short" in caplog.text
    assert "InterfaceError" in caplog.text
