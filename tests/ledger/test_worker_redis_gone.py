"""A worker waits for a Redis that went away and goes on once it is back (RQ waits only while it
waits for a job; elsewhere a connection error ended the worker: in the chaos tests, a drain job
that ran while Redis restarted ended the worker as it ended). A Redis server of the test's own,
stopped and started again on its port."""

import threading
import time

import pytest
import redis
from rq import Queue

from ledger.worker import Worker
from tests.chaos.test_database_blips import OwnRedis


@pytest.fixture
def own_redis():
    server = OwnRedis()
    server.start()
    yield server
    server.stop()


def test_a_worker_between_jobs_waits_for_redis_and_registers_itself_again(own_redis):
    connection = redis.Redis.from_url(own_redis.url)
    worker = Worker(["default"], connection=connection)
    worker.register_birth()
    queue = Queue("default", connection=connection)
    job = queue.enqueue("builtins.print")
    own_redis.stop()
    went_on = []

    def between_jobs():
        worker.handle_execution_ended(job, queue, 60)  # a job that ran while Redis was down ends
        worker.heartbeat()  # after a job
        worker.check_for_suspension(False)  # the loop's first step
        worker.set_state("idle")  # before it listens
        went_on.append(True)

    thread = threading.Thread(target=between_jobs, daemon=True)
    thread.start()
    time.sleep(1.5)
    assert thread.is_alive() and not went_on  # waiting, not ended by the connection error
    own_redis.start()
    thread.join(15)
    assert went_on == [True]
    assert [w.name for w in Worker.all(connection=connection)] == [worker.name]  # the empty Redis knows it again
