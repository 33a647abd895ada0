"""The client's own retries on real transport failures: always with the same operation key."""

from urllib.parse import urlsplit

import pytest

from ledger.models import Action
from surety_client import SuretyClient, SuretyUnreachable
from tests.client.proxy import AnswerLosingProxy
from tests.conftest import free_port
from tests.factories import make_agent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def token(stack):
    return make_agent("retry-bot")[1]


def test_a_lost_answer_is_retried_with_the_same_key_and_finds_the_action_recorded(stack, token):
    proxy = AnswerLosingProxy(urlsplit(stack.url).port, lose=1)
    try:
        with SuretyClient(proxy.url, token, retries=2, backoff=0.05) as client:
            action = client.refund(order="ORD-R1", amount="25.00", currency="EUR", decision_id="dec-r1")
    finally:
        proxy.close()
    assert proxy.connections == 2  # the first request's answer was lost; the retry got through
    assert action.replayed and action.operation_key == "refund:ORD-R1:25.00EUR:dec-r1"
    assert Action.objects.filter(target="ORD-R1").count() == 1


def test_a_refused_connection_is_retried_a_bounded_number_of_times_then_raised(stack, token):
    nobody = f"http://127.0.0.1:{free_port()}"
    with SuretyClient(nobody, token, retries=2, backoff=0.01) as client, pytest.raises(SuretyUnreachable) as raised:
        client.refund(order="ORD-R2", amount="25.00", currency="EUR", decision_id="dec-r2")
    assert raised.value.attempts == 3 and raised.value.operation_key == "refund:ORD-R2:25.00EUR:dec-r2"
    assert "ConnectError" in str(raised.value)
