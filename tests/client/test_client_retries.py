"""The client's own retries on real transport failures: always with the same operation key."""

from urllib.parse import urlsplit

import pytest

from ledger.models import Action
from surety_client import SuretyClient, SuretyUnreachable
from tests.client.proxy import FlakyProxy
from tests.conftest import free_port
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
