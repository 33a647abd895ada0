"""Throttling answers as a problem too, with Retry-After."""

import copy

import pytest
from django.conf import settings as django_settings

from tests.factories import make_agent

pytestmark = pytest.mark.django_db


def test_an_agent_over_its_rate_gets_429_problem_json_with_retry_after(client, settings):
    rest = copy.deepcopy(django_settings.REST_FRAMEWORK)
    rest["DEFAULT_THROTTLE_RATES"]["agent"] = "2/min"
    settings.REST_FRAMEWORK = rest
    _, token = make_agent("chatty")
    answers = [client.get("/api/v1/actions/nothing-here", HTTP_AUTHORIZATION=f"Bearer {token}") for _ in range(3)]
    assert [a.status_code for a in answers] == [404, 404, 429]
    throttled = answers[-1]
    assert throttled["Content-Type"] == "application/problem+json"
    assert throttled.json()["code"] == "throttled" and throttled.json()["status"] == 429
    assert 0 < int(throttled["Retry-After"]) <= 60
