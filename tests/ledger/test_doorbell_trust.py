"""The doorbell is not asked on every commit: a drain job seen waiting is trusted for
DOORBELL_TRUST_SECONDS, because a drain job lingers DRAIN_LINGER_SECONDS after it ran out of
work. Redis is this run's own database, where no worker listens."""

import threading
import time

import pytest
import redis
from django.db import connection

from ledger import jobs

pytestmark = [
    pytest.mark.django_db(transaction=True),  # django-rq enqueues at commit
    pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite empties such a test's database with DELETE"),
    pytest.mark.usefixtures("jobs_to_test_redis"),  # a lane that finds work rings: into this run's Redis
]


def test_a_drain_job_seen_waiting_is_trusted_for_a_moment_then_asked_again(settings, monkeypatch):
    monkeypatch.setattr(jobs, "DOORBELL_TRUST_SECONDS", 5)  # a moment no slow machine outlasts here
    client = redis.Redis.from_url(settings.RQ_QUEUES["default"]["URL"])
    client.flushdb()
    jobs.ring("actions")
    assert client.llen("rq:queue:default") == 1

    client.flushdb()  # the job is gone; within the trust window nobody asks
    jobs.ring("actions")
    assert client.llen("rq:queue:default") == 0

    jobs._seen_waiting["actions"] -= jobs.DOORBELL_TRUST_SECONDS  # the window has passed
    jobs.ring("actions")
    assert client.llen("rq:queue:default") == 1


def test_the_linger_outlasts_the_trust():
    assert jobs.DRAIN_LINGER_SECONDS > 2 * jobs.DOORBELL_TRUST_SECONDS


def lane_with_work_appearing_after(seconds, linger):
    """Run a drain lane whose first claims find nothing; one item appears `seconds` after
    the lane started. Returns what the lane ran."""
    started = time.monotonic()
    items = ["late"]
    ran = []

    def claim_next(owner):
        return items.pop() if items and time.monotonic() - started >= seconds else None

    lane = threading.Thread(target=lambda: ran.append(jobs._drain_lane(
        "actions", claim_next, lambda item: None, deadline=started + 10, linger=linger)))
    lane.start()
    lane.join(5)
    return ran, items


def test_a_lingering_lane_runs_what_commits_soon_after_it_found_nothing(db):
    ran, left = lane_with_work_appearing_after(jobs.DOORBELL_TRUST_SECONDS, linger=jobs.DRAIN_LINGER_SECONDS)
    assert ran == [1] and left == []


def test_a_lane_that_does_not_linger_ends_when_it_finds_nothing(db):
    ran, left = lane_with_work_appearing_after(2, linger=0)
    assert ran == [0] and left == ["late"]
