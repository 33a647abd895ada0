"""What allauth keeps in the cache to limit sign-ins (a person's failures, the codes already used)
outlives a run of failed sign-ins under made-up names: past Django's default of 300 rows, its
database cache deleted a third of them, whatever they held."""

import pytest
from django.core.cache import cache
from django.test import Client

pytestmark = pytest.mark.django_db
KEPT = "0-a-count"  # sorts first: a cull deletes the keys that sort first


def test_a_persons_count_of_failures_outlives_failed_sign_ins_under_other_names(settings):
    # The address's limits out of the way, as for failures from many addresses.
    settings.ACCOUNT_RATE_LIMITS = {"login": "1000/m/ip", "login_failed": "1000/m/ip,5/5m/key"}
    cache.set(KEPT, 4, 300)
    client = Client()
    for n in range(400):
        client.post("/accounts/login/", {"login": f"made-up-{n}", "password": "wrong"})

    assert cache.get(KEPT) == 4
