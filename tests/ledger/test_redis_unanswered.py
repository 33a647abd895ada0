"""A Redis that takes connections and never answers (what a stopped Redis or a blackholed port
looks like from here) costs a ring or an enqueue its read timeout, which config.settings puts in
the RQ URL, and the log one line for the outage and one with the count once Redis answers again,
not a traceback per call. The chaos test (tests/chaos/test_database_blips.py) stops a real Redis
under the whole stack."""

import logging
import socket
import time

import pytest

from ledger import jobs
from ledger.outages import Outage
from tests.conftest import REDIS_URL

TIMEOUT = 0.3
CALLS = 5


@pytest.fixture
def unanswered_redis_url():
    """A socket that listens and never accepts: the kernel completes the connection, nobody reads."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(CALLS * 2)
        port = listener.getsockname()[1]
        yield f"redis://127.0.0.1:{port}/0?socket_connect_timeout={TIMEOUT}&socket_timeout={TIMEOUT}"


def test_rings_and_enqueues_wait_their_timeout_and_the_outage_is_logged_once(settings, monkeypatch, caplog,
                                                                            jobs_to_test_redis, unanswered_redis_url):
    monkeypatch.setattr(jobs, "_REDIS_OUTAGE", Outage(jobs._REDIS_OUTAGE.what, jobs.logger))
    settings.RQ_QUEUES = {"default": {"URL": unanswered_redis_url, "DEFAULT_TIMEOUT": 600, "ASYNC": True}}
    caplog.set_level(logging.INFO, logger="surety.jobs")
    took = []
    for _ in range(CALLS):
        began = time.monotonic()
        jobs.ring("actions")
        assert jobs.enqueue(jobs.DRAINS["tasks"]) is None
        took.append(time.monotonic() - began)
    assert max(took) < 2 * TIMEOUT + 1, took  # a ring's one call, then an enqueue's, each cut off

    settings.RQ_QUEUES = {"default": {"URL": REDIS_URL, "DEFAULT_TIMEOUT": 600, "ASYNC": True}}
    jobs.ring("actions")  # Redis answers again
    lines = [(r.levelname, r.getMessage(), r.exc_info) for r in caplog.records if r.name == "surety.jobs"]
    assert len(lines) == 2 and all(level == "WARNING" and exc_info is None for level, _, exc_info in lines), lines
    assert "Redis is unreachable (TimeoutError" in lines[0][1]
    assert lines[1][1].endswith(f"without Redis ({CALLS * 2} failed attempts)"), lines[1][1]
