"""The doorbell (ledger/jobs.py `ring`) after a worker died holding a drain job.

Seen for real in test_task_retries.py: a worker SIGKILLed just after RQ handed it a drain
job, before the job's first line deleted the doorbell, left the doorbell key set (TTL
DOORBELL_TTL_SECONDS = 15 s) with no job in the queue. Every ring was then swallowed until
the key expired, and after that nothing rang again but the sweeper: a new task waited up
to 15 s plus a sweep, or forever where no sweeper ran. The doorbell now names its job and
is trusted only while that job still waits. Here the state is made directly: the job is taken off the queue, as the dead
worker took it.
"""

import django_rq
import pytest
import redis

from ledger.jobs import DOORBELL_TTL_SECONDS
from ledger.models import Task
from tests.conftest import REDIS_URL, wait_until
from tests.factories import agent_api, post_task


def start_noop_task(client, task_id):
    response = post_task(client, task_id, {"workflow": "noop", "input": {}})
    assert response.status_code == 201, response.text


@pytest.fixture
def client(stack):
    return agent_api(stack.url, grants=("noop",))


def test_a_new_task_rings_a_drain_job_and_runs_at_once(stack, client):
    stack.start_worker()
    start_noop_task(client, "noop-1")
    wait_until(lambda: Task.objects.get(task_id="noop-1").state == "succeeded", seconds=10,
               message="the task to run without the sweeper")


def test_a_drain_job_lost_with_its_worker_does_not_silence_the_doorbell(stack, client):
    start_noop_task(client, "noop-1")  # rings: a drain job is queued and the doorbell is set
    queue = django_rq.get_queue("default")
    assert queue.count == 1
    queue.empty()  # a worker took the job and was SIGKILLed before the job could start
    assert redis.Redis.from_url(REDIS_URL).ttl("surety:doorbell:tasks") > 0

    stack.start_worker()
    start_noop_task(client, "noop-2")  # rings again
    wait_until(lambda: Task.objects.filter(state="succeeded").count() == 2, seconds=DOORBELL_TTL_SECONDS / 3,
               message="the new task to run without the sweeper")
