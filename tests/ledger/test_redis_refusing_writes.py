"""A Redis that answers but refuses every write is away as much as one that does not answer: a full
one (`maxmemory` reached under `noeviction` answers OOM), a replica (after a failover demoted it, it
answers READONLY). Rings and enqueues count it with the outage, one line in the log, not a
traceback per call (decision 45); the sweeper and a worker wait for it instead of ending. A Redis
server of the test's own (`own_redis`), as `CONFIG SET maxmemory` would reach every database of a
shared one."""

import logging
import threading

import pytest
import redis

from ledger import jobs
from ledger.metrics import SWEEPER_SEEN_KEY
from ledger.outages import Outage
from ledger.worker import Worker
from tests.conftest import free_port, wait_until

CALLS = 5


def full(client):
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)
    return lambda: client.config_set("maxmemory", 0)


def replica(client):
    client.replicaof("127.0.0.1", free_port())  # a primary that is not there: it stays read-only
    return lambda: client.replicaof("NO", "ONE")


REFUSING = {"full (OutOfMemoryError)": full, "a replica (ReadOnlyError)": replica}


@pytest.fixture(params=REFUSING.values(), ids=REFUSING.keys())
def refusing(request, own_redis):
    """`refusing()` makes the test's Redis refuse writes, and returns what makes it take them again
    (the server is the test's own: it ends with the test, whatever state it was left in)."""
    return lambda: request.param(redis.Redis.from_url(own_redis.url))


def test_rings_and_enqueues_count_it_with_the_outage_and_log_one_line(settings, monkeypatch, caplog, own_redis,
                                                                       refusing):
    monkeypatch.setattr(jobs, "_REDIS_OUTAGE", Outage(jobs._REDIS_OUTAGE.what, jobs.logger))
    settings.RQ_ASYNC = True
    settings.RQ_QUEUES = {"default": {"URL": own_redis.url, "DEFAULT_TIMEOUT": 600, "ASYNC": True}}
    caplog.set_level(logging.INFO, logger="surety.jobs")
    restore = refusing()
    for _ in range(CALLS):
        jobs.ring("actions")
        assert jobs.enqueue(jobs.DRAINS["tasks"]) is None
    restore()
    jobs.ring("actions")  # Redis takes writes again

    lines = [(r.levelname, r.getMessage(), r.exc_info) for r in caplog.records if r.name == "surety.jobs"]
    assert len(lines) == 2 and all(level == "WARNING" and exc_info is None for level, _, exc_info in lines), lines
    assert "Redis is unreachable" in lines[0][1] and "without Redis" in lines[1][1], lines
    assert redis.Redis.from_url(own_redis.url).exists(jobs._doorbell("actions"))


def test_the_sweeper_waits_for_it_and_leaves_its_trace_once_it_takes_writes_again(stack, own_redis, refusing,
                                                                                  tmp_path):
    client = redis.Redis.from_url(own_redis.url)
    log = tmp_path / "sweeper.log"
    sweeper = stack.start_sweeper(interval=0.3, log=log, REDIS_URL=own_redis.url)
    wait_until(lambda: client.exists(SWEEPER_SEEN_KEY), seconds=30, message="the sweeper's first pass")

    restore = refusing()
    wait_until(lambda: "Redis is unreachable" in log.read_text() or sweeper.poll() is not None, seconds=30,
               message="the sweeper to meet the refusal")
    assert sweeper.poll() is None, log.read_text()[-3000:]

    restore()
    client.delete(SWEEPER_SEEN_KEY)  # set again only by a pass that got through
    wait_until(lambda: client.exists(SWEEPER_SEEN_KEY), seconds=30, message="the sweeper's trace again")
    wait_until(lambda: "back after" in log.read_text(), seconds=10, message="the sweeper to log the outage's end")
    text = log.read_text()
    assert sweeper.poll() is None and "Traceback" not in text, text[-3000:]


def test_a_worker_waits_for_it_between_jobs(own_redis, refusing, caplog):
    worker = Worker(["default"], connection=redis.Redis.from_url(own_redis.url))
    worker.register_birth()
    restore = refusing()
    outcome = []

    def beat():
        try:
            worker.heartbeat()
            outcome.append("done")
        except Exception as exc:
            outcome.append(type(exc).__name__)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    wait_until(lambda: outcome or "Redis does not answer" in caplog.text, seconds=15,
               message="the worker's heartbeat to meet the refusal")
    assert outcome == []  # waiting, not ended by the refusal
    restore()
    thread.join(15)
    assert outcome == ["done"]
