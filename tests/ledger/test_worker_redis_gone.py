"""A worker waits for a Redis that went away and goes on once it is back (RQ waits only while it
waits for a job; elsewhere a connection error ended the worker: in the chaos tests, a drain job
that ran while Redis restarted ended the worker as it ended), unless it was asked to stop. A
Redis server of the test's own (`own_redis`), stopped and started again on its port."""

import multiprocessing
import os
import signal
import subprocess
import threading
import time

import pytest
import redis
from rq import Queue
from rq.registry import StartedJobRegistry
from rq.scheduler import RQScheduler
from rq.utils import now

from ledger.worker import Worker
from tests.conftest import PYTHON, ROOT, wait_until


@pytest.fixture
def worker(own_redis):
    """A worker with a job it took and ran (`worker.job`), its bookkeeping done while Redis answered."""
    connection = redis.Redis.from_url(own_redis.url)
    worker = Worker(["default"], connection=connection)
    worker.register_birth()
    worker.job = Queue("default", connection=connection).enqueue("builtins.print")
    worker.prepare_execution(worker.job)
    worker.prepare_job_execution(worker.job)
    worker.job.started_at = worker.job.ended_at = now()
    return worker


# Each call RQ makes outside its wait for a job (in this order, one at a time, as the worker does).
CALLS_BETWEEN_JOBS = {
    "the bookkeeping as it takes a job": lambda worker: worker.prepare_execution(worker.job),
    "the job's bookkeeping as it starts": lambda worker: worker.prepare_job_execution(worker.job),
    "the bookkeeping of a job that succeeded": lambda worker: worker.handle_job_success(
        worker.job, Queue("default", connection=worker.connection), StartedJobRegistry(connection=worker.connection)),
    "a job that ran while Redis was down ends": lambda worker: worker.handle_execution_ended(
        worker.job, Queue("default", connection=worker.connection), 60),
    "the worker's heartbeat after a job": lambda worker: worker.heartbeat(),
    "the loop's suspension check": lambda worker: worker.check_for_suspension(False),
    "the state it sets before it listens": lambda worker: worker.set_state("idle"),
    "its maintenance (the registries, the scheduler's lock)": lambda worker: worker.run_maintenance_tasks(),
}


def in_a_thread(call, worker):
    """`call` in a thread; the thread and what became of the call ("done" or the error's type)."""
    outcome = []

    def run():
        try:
            call(worker)
            outcome.append("done")
        except Exception as exc:
            outcome.append(type(exc).__name__)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("call", CALLS_BETWEEN_JOBS.values(), ids=CALLS_BETWEEN_JOBS.keys())
def test_a_call_between_jobs_waits_for_redis_and_the_worker_registers_itself_again(own_redis, worker, call):
    own_redis.stop()
    thread, outcome = in_a_thread(call, worker)
    time.sleep(1.5)
    assert outcome == []  # waiting, not ended by the connection error
    own_redis.start()
    thread.join(15)
    assert outcome == ["done"]
    worker.heartbeat()
    assert [w.name for w in Worker.all(connection=worker.connection)] == [worker.name]  # the empty Redis knows it


@pytest.mark.parametrize("call", CALLS_BETWEEN_JOBS.values(), ids=CALLS_BETWEEN_JOBS.keys())
def test_a_worker_asked_to_stop_does_not_wait_for_redis(own_redis, worker, call):
    own_redis.stop()
    worker._stop_requested = True  # what RQ's handler of the first SIGTERM sets
    thread, outcome = in_a_thread(call, worker)
    thread.join(0.5)
    # Ended at once: by the connection error, or (the suspension check) without asking Redis at all.
    assert outcome in (["ConnectionError"], ["done"])


def test_a_redis_that_stops_answering_is_waited_for_too(own_redis):
    """A Redis that takes connections but does not answer (a hung host) times the worker's calls
    out (RQ sets the socket's timeout to its wait for a job plus 10 s, 11 s at the least): RQ's
    loop quits on a timeout as on a refused connection, so the worker waits for that one too."""
    worker = Worker(["default"], connection=redis.Redis.from_url(own_redis.url), worker_ttl=16)
    assert worker.connection.connection_pool.connection_kwargs["socket_timeout"] == 11
    worker.register_birth()
    own_redis.stall()
    try:
        thread, outcome = in_a_thread(lambda w: w.heartbeat(), worker)
        time.sleep(13)
        assert outcome == []  # waiting, not ended by the timeout
    finally:
        own_redis.resume()
    thread.join(30)
    assert outcome == ["done"]


def a_dead_scheduler(worker):
    """The scheduler this worker started, its process ended (as a Redis outage ends it)."""
    worker.scheduler = RQScheduler(["default"], connection=worker.connection)
    worker.scheduler._process = multiprocessing.get_context("fork").Process(target=int)
    worker.scheduler._process.start()
    worker.scheduler._process.join()
    worker.last_cleaned_at = now()  # RQ's own maintenance is not due
    return worker.scheduler


def test_while_another_worker_runs_the_scheduler_a_dead_one_is_forgotten_not_asked_for_each_turn(worker):
    scheduler = a_dead_scheduler(worker)
    worker.connection.set(RQScheduler.get_locking_key("default"), "another worker's scheduler")
    assert worker.should_run_maintenance_tasks
    worker.run_maintenance_tasks()
    assert scheduler._process is None  # its lock is another's: nothing was started here
    assert not worker.should_run_maintenance_tasks


def test_a_scheduler_ended_during_the_first_maintenance_is_started_again_once_redis_answers(own_redis, worker):
    """RQ looks at the scheduler only at a maintenance after the first: an outage that ended the
    scheduler and failed the first maintenance left it dead for ten minutes (seen in a run of
    the real worker below, when the test stopped Redis while the worker's first maintenance ran)."""
    scheduler = a_dead_scheduler(worker)
    worker.last_cleaned_at = None  # the first maintenance: it failed, so nothing is cleaned yet
    own_redis.stop()
    thread, outcome = in_a_thread(lambda w: w.run_maintenance_tasks(), worker)
    time.sleep(1.5)
    own_redis.start()
    thread.join(15)
    try:
        assert outcome == ["done"]
        assert scheduler._process is not None and scheduler._process.is_alive()
        assert worker.connection.get(RQScheduler.get_locking_key("default")) == scheduler.name.encode()
        assert not worker.should_run_maintenance_tasks
    finally:
        if scheduler._process is not None:
            scheduler._process.kill()
            scheduler._process.join()


def test_a_stopping_worker_starts_no_scheduler(worker):
    a_dead_scheduler(worker)
    worker._stop_requested = True
    assert not worker.should_run_maintenance_tasks


def test_the_scheduler_a_redis_outage_ended_is_started_again_at_once(own_redis, tmp_path):
    """RQ's scheduler, a process of the worker's, ends at its first connection error; RQ starts
    it again at its maintenance, ten minutes apart. A worker of ours does at its loop's next turn."""
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [PYTHON, "manage.py", "rqworker", "default", "--worker-class", "ledger.worker.Worker", "--with-scheduler"],
            cwd=ROOT, env={**os.environ, "REDIS_URL": own_redis.url}, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    started = "Scheduler for default started with PID"
    try:
        wait_until(lambda: log.read_text().count(started) == 1, seconds=30, message="the scheduler to start")
        own_redis.stop()
        time.sleep(5)  # well past the scheduler's one-second turns, even on a busy machine: it meets the outage
        own_redis.start()
        wait_until(lambda: log.read_text().count(started) == 2, seconds=30, message="the scheduler to start again")
        assert "Scheduler [PID" in log.read_text()  # the first one ended by the outage
        connection = redis.Redis.from_url(own_redis.url)
        wait_until(lambda: connection.exists("rq:scheduler-lock:default"), seconds=10,
                   message="the new scheduler to hold the queue's lock")
        assert process.poll() is None
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
