"""The client's own retries on real transport failures: always with the same operation key."""

import time
from types import SimpleNamespace
from urllib.parse import urlsplit

import pytest
from django.db import connection

from ledger import outages
from ledger.models import Action
from surety_client import SuretyClient, SuretyUnreachable
from surety_client import client as client_module
from tests.client.proxy import FlakyProxy, SwitchableRelay
from tests.conftest import free_port, serving
from tests.factories import make_agent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def token(stack):
    return make_agent("retry-bot")[1]


# Whether the retry finds the first request's action: a lost answer, yes; a 503 from the way
# in, no; a timeout, usually (unless the server itself took longer than the client waits).
@pytest.mark.parametrize("failure, replayed", [("lose", {True}), ("stall", {True, False}), ("503", {False})])
def test_a_failed_request_is_retried_with_the_same_key_and_records_one_action(stack, token, failure, replayed):
    proxy = FlakyProxy(urlsplit(stack.url).port, failure, stall=2)
    try:
        with SuretyClient(proxy.url, token, timeout=1, retries=2, backoff=0.05) as client:
            action = client.refund(order="ORD-R1", amount="25.00", currency="EUR", decision_id="dec-r1")
    finally:
        proxy.close()
    assert proxy.connections == 2  # the first failed; the retry got through
    assert action.replayed in replayed and action.operation_key == "refund:ORD-R1:dec-r1"
    assert Action.objects.filter(target="ORD-R1").count() == 1


def test_a_refused_connection_is_retried_a_bounded_number_of_times_then_raised(stack, token):
    nobody = f"http://127.0.0.1:{free_port()}"
    with SuretyClient(nobody, token, retries=2, backoff=0.01) as client, pytest.raises(SuretyUnreachable) as raised:
        client.refund(order="ORD-R2", amount="25.00", currency="EUR", decision_id="dec-r2")
    assert raised.value.attempts == 3 and raised.value.operation_key == "refund:ORD-R2:dec-r2"
    assert "ConnectError" in str(raised.value)


def test_a_503_of_a_database_outage_is_retried_no_sooner_than_its_retry_after_says(stack, token, monkeypatch):
    """A server whose database is away (a failover: its connections dropped, new ones refused,
    here by a relay in front of PostgreSQL) answers 503 database_unavailable with Retry-After 2.
    A retry sooner than that finds the database still away, and the client's retries would run
    out before the failover ends: each of its pauses is at least what Retry-After said, though
    its own backoff (0.05 s) is far shorter. The database back, the same key records one action."""
    relay = SwitchableRelay(connection.settings_dict["HOST"] or "127.0.0.1", int(connection.settings_dict["PORT"] or 5432))
    direct = urlsplit(stack.env["DATABASE_URL"])
    database_url = direct._replace(netloc=f"{direct.username}@127.0.0.1:{relay.port}").geturl()
    answers, pauses = [], []

    def sleep(seconds):  # the client's pauses, slept for real; the database is back during the second
        pauses.append(seconds)
        if len(pauses) == 2:
            relay.restore()
        time.sleep(seconds)

    def answered(response):
        response.read()
        answers.append(response)

    monkeypatch.setattr(client_module, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleep))
    try:
        with serving(database_url, workers=1, threads=4) as failing, \
                SuretyClient(failing.url, token, retries=4, backoff=0.05) as client:
            client._http.event_hooks["response"].append(answered)
            relay.cut()
            action = client.refund(order="ORD-R3", amount="25.00", currency="EUR", decision_id="dec-r3")
    finally:
        relay.close()
    assert [response.status_code for response in answers] == [503, 503, 201]
    for unavailable in answers[:2]:
        assert unavailable.headers["Retry-After"] == str(outages.RETRY_AFTER_SECONDS) == "2"
        assert unavailable.json()["code"] == "database_unavailable"
    assert len(pauses) == 2 and all(pause >= outages.RETRY_AFTER_SECONDS for pause in pauses), pauses
    assert {response.request.headers["Idempotency-Key"] for response in answers} == {"refund:ORD-R3:dec-r3"}
    assert action.operation_key == "refund:ORD-R3:dec-r3" and not action.replayed
    assert Action.objects.filter(target="ORD-R3").count() == 1
