"""The doorbell is asked on every commit (decision 10): a drain job still waiting in the queue
answers for the commit, one that is gone is enqueued again at once; a drain lane ends when it
finds nothing. Redis is this run's own database, where no worker listens."""

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


def test_a_drain_job_waiting_answers_for_a_ring_and_one_gone_is_enqueued_again(settings):
    client = redis.Redis.from_url(settings.RQ_QUEUES["default"]["URL"])
    client.flushdb()
    jobs.ring("actions")
    assert client.llen("rq:queue:default") == 1
    jobs.ring("actions")  # the announced job still waits: no second one
    assert client.llen("rq:queue:default") == 1

    client.delete("rq:queue:default")  # a worker took the job (its doorbell still names it)
    client.hset(f"rq:job:{client.get('surety:doorbell:actions').decode()}", "status", "started")
    jobs.ring("actions")  # asked again at once: the very next commit has its job
    assert client.llen("rq:queue:default") == 1


def test_a_job_taken_off_the_queue_by_a_worker_killed_before_it_started_does_not_silence_the_doorbell(settings):
    """SIGKILL between a worker's taking the job off the list and its marking it started leaves
    the job's hash saying "queued": the doorbell asks the list, so the next ring enqueues at once
    (asking the status, every ring was silenced until the doorbell expired, 15 s; a redrive in
    the tests waited for its work for good, as no sweeper rang)."""
    client = redis.Redis.from_url(settings.RQ_QUEUES["default"]["URL"])
    client.flushdb()
    jobs.ring("actions")
    taken = client.lpop("rq:queue:default").decode()  # what the dying worker took
    assert client.hget(f"rq:job:{taken}", "status") == b"queued"
    jobs.ring("actions")
    assert client.llen("rq:queue:default") == 1
    assert client.get("surety:doorbell:actions").decode() != taken


def lane_with_work_appearing_after(seconds):
    """Run a drain lane whose first claims find nothing; one item appears `seconds` after
    the lane started. Returns what the lane ran."""
    started = time.monotonic()
    items = ["late"]
    ran = []

    def claim_next(owner):
        return items.pop() if items and time.monotonic() - started >= seconds else None

    lane = threading.Thread(target=lambda: ran.append(jobs._drain_lane(
        "actions", claim_next, lambda item: None, None, deadline=started + 10)))
    lane.start()
    lane.join(5)
    return ran, items


def test_a_lane_ends_when_it_finds_nothing(db):
    ran, left = lane_with_work_appearing_after(2)
    assert ran == [0] and left == ["late"]


def test_a_lane_runs_what_it_finds_until_nothing_is_left(db):
    ran, left = lane_with_work_appearing_after(0)
    assert ran == [1] and left == []
