"""A request whose fields do not fit the ledger's unique indexes is `400 invalid`, not a 503
sent forever: PostgreSQL refuses an index row past 2704 bytes (SQLSTATE 54000), each time the
same, and only a lost connection or a statement that did not get through in time is an outage."""

import random

import psycopg
import pytest
from django.db import OperationalError

from ledger import outages
from ledger.actions import action_request
from ledger.api import views
from ledger.models import Action
from tests.factories import a_real_deadlock, booking_body, make_agent, make_agent_on, post_action_in_process

pytestmark = pytest.mark.django_db(transaction=True)


def wide(n, seed):
    """`n` characters of four bytes each in UTF-8 (CJK Extension B)."""
    rnd = random.Random(seed)
    return "".join(chr(rnd.randrange(0x20000, 0x2A6D0)) for _ in range(n))


def wide_booking():
    body = booking_body(customer=wide(255, 1), decision=wide(255, 2))
    body["target"] = wide(255, 3)
    return body


def test_a_booking_too_wide_for_its_index_is_400_naming_each_field(client):
    make_agent_on(client)
    response = post_action_in_process(client, "booking:wide", wide_booking())
    assert response.status_code == 400, (response.status_code, response.content[:300])
    problem = response.json()
    assert problem["code"] == "invalid"
    assert set(problem["errors"]) == {"target", "customer", "decision_id"}
    assert problem["errors"]["customer"] == ["At most 800 bytes in UTF-8 (this has 1020)."]


def test_a_booking_at_the_bound_fits_its_index(client):
    """200 characters of four bytes: 800 bytes in each of the index's three fields."""
    make_agent_on(client)
    body = booking_body(customer=wide(200, 1), decision=wide(200, 2))
    body["target"] = wide(200, 3)
    response = post_action_in_process(client, "booking:at-the-bound", body)
    assert response.status_code == 201, response.content[:300]
    assert post_action_in_process(client, "booking:at-the-bound", body).status_code == 200


@pytest.fixture
def index_row_too_big():
    """PostgreSQL's own refusal of an index row past its size, as Django raises it."""
    agent, _ = make_agent("wide")
    body = wide_booking()
    with pytest.raises(OperationalError) as refused:
        action_request(agent=agent, operation_key="booking:wide", action_type="create_booking",
                       target=body["target"], customer=body["customer"], decision_id=body["decision_id"],
                       params=body["params"])
    assert isinstance(refused.value.__cause__, psycopg.errors.ProgramLimitExceeded)
    return refused.value


def test_a_statement_the_server_refuses_for_its_size_is_no_outage(index_row_too_big):
    assert outages.too_large(index_row_too_big) and not outages.database_unreachable(index_row_too_big)
    assert not outages.connection_lost(index_row_too_big) and not outages.rolled_back(index_row_too_big)


@pytest.mark.parametrize("error", [psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
                                   psycopg.errors.LockNotAvailable("could not obtain lock"),
                                   psycopg.errors.AdminShutdown("terminating connection"),
                                   psycopg.errors.ConnectionFailure("connection failure"),
                                   psycopg.OperationalError("server closed the connection unexpectedly"),
                                   psycopg.errors.TooManyConnections("sorry, too many clients already"),
                                   psycopg.errors.DiskFull("could not extend file")],
                         ids=["statement timeout", "lock timeout", "admin shutdown", "class 08", "no SQLSTATE",
                              "too many connections", "disk full"])
def test_a_lost_connection_a_timeout_and_a_server_out_of_resources_are_an_outage(error):
    try:
        raise OperationalError(*error.args) from error  # as Django wraps it
    except OperationalError as wrapped:
        assert outages.database_unreachable(wrapped) and outages.database_unreachable(error)


def test_a_deadlock_still_counts_as_it_did(django_db_blocker):
    with django_db_blocker.unblock():
        deadlock = a_real_deadlock()
    assert outages.database_unreachable(deadlock) and outages.rolled_back(deadlock)


def test_an_intake_the_server_refuses_for_its_size_is_a_400_not_a_503_to_retry_forever(
        client, index_row_too_big, monkeypatch):
    """A size PostgreSQL refuses that the edge's bounds missed (here the real error the booking index
    raised, standing in for a bound not yet written): the request's own, so 400 invalid, nothing
    recorded; a 503 would have the client send it again forever, a 500 would say the fault is ours."""
    make_agent_on(client)

    def refused(**kwargs):
        raise index_row_too_big

    monkeypatch.setattr(views, "action_request", refused)
    response = post_action_in_process(client, "booking:refused", booking_body())
    assert response.status_code == 400 and "Retry-After" not in response, response.content
    assert response["Content-Type"] == "application/problem+json" and response.json()["code"] == "invalid"
    assert not Action.objects.filter(operation_key="booking:refused").exists()
