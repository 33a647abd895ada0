"""Behind the load balancer, the sign-in limits count per client: the address the balancer adds
to X-Forwarded-For (TRUSTED_PROXY_COUNT, 1 in production). Counted per connection, every person
would share the balancer's address, and ten wrong passwords a minute from anyone would refuse
everyone's sign-in for that minute."""

import pytest
from django.test import Client

from tests.ledger.test_production_settings import manage
from tests.signin.conftest import sign_in, someone

pytestmark = pytest.mark.django_db


def from_address(address):
    return Client(headers={"X-Forwarded-For": address})


@pytest.mark.parametrize("proxies, others_sign_in", [(1, True), (0, False)])
def test_ten_failures_from_one_client_refuse_that_client_not_the_others(settings, proxies, others_sign_in):
    settings.ALLAUTH_TRUSTED_PROXY_COUNT = proxies
    names = [someone(name, "approvers").username for name in ("ann", "abe", "amy")]
    someone("bea", "approvers")
    guesser = from_address("203.0.113.7")
    for n in range(10):  # spread over three names: under the five a name allowed
        answer = sign_in(guesser, names[n % 3], "guess")
        assert b"not correct" in answer.content
    assert b"Too many failed login attempts" in sign_in(guesser, "ann").content

    colleague = from_address("198.51.100.20")
    answer = sign_in(colleague, "bea")
    assert ("_auth_user_id" in colleague.session) is others_sign_in, answer.content[:300]


def test_production_counts_from_the_balancers_entry_unless_told_otherwise():
    read = "from django.conf import settings; print(settings.ALLAUTH_TRUSTED_PROXY_COUNT)"
    assert manage("shell", "-c", read).stdout.splitlines()[-1] == "1"
    assert manage("shell", "-c", read, TRUSTED_PROXY_COUNT="2").stdout.splitlines()[-1] == "2"
