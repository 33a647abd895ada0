"""Behind the load balancer, the sign-in limits count per client: the address the balancer adds
to X-Forwarded-For (TRUSTED_PROXY_COUNT, 1 in production). Counted per connection, every person
would share the balancer's address, and ten wrong passwords a minute from anyone would refuse
everyone's sign-in for that minute."""

import pytest
from django.test import Client

from ledger.models import AuditEvent
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


def test_the_audit_trail_names_the_client_behind_the_balancer_not_the_balancer(settings):
    settings.ALLAUTH_TRUSTED_PROXY_COUNT = 1
    ann = someone("ann", "approvers")
    client = from_address("203.0.113.7")  # the test client's own address, REMOTE_ADDR, is 127.0.0.1
    sign_in(client, "ann", "guess")
    sign_in(client, "ann")
    client.post("/accounts/logout/")
    events = AuditEvent.objects.filter(object_id=str(ann.pk), verb__in=["sign_in_failed", "signed_in", "signed_out"])
    assert sorted((event.verb, event.after["ip"]) for event in events) == [
        ("sign_in_failed", "203.0.113.7"), ("signed_in", "203.0.113.7"), ("signed_out", "203.0.113.7")]
