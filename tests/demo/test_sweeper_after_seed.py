"""The sweeper's log after a fresh seed (`make run`'s first start). A new database has no summary
of the what-if's closed days, and the sweeper makes them one a pass (decision 46): every one of
those passes logged its line, "swept: {...}", a line a second for a minute and a half. A step
doing the same again pass after pass is now said when it begins and once when it stops, with how
many passes it went on for; the other work of those passes is still logged as it comes."""

import logging
import re

import pytest
from django.db import connection

from approvals.models import SummaryDay
from console.sweeper import STEPS
from demo.seed import seed_demo
from ledger import sweeper

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the daily summaries are PostgreSQL's"),
]


class Stopped(Exception):
    """Ends sweep_forever's loop, at the sleep after a pass."""


def sweep_until_caught_up(monkeypatch, most=300):
    """The sweeper's own loop, in this process, until a pass after the summaries' catch-up made no
    summary. Returns how many passes ran."""
    passes = []

    def after_a_pass(seconds):
        passes.append(SummaryDay.objects.filter(stale=False).count())
        if len(passes) >= 2 and passes[-1] == passes[-2] or len(passes) >= most:
            raise Stopped

    monkeypatch.setattr(sweeper.time, "sleep", after_a_pass)
    with pytest.raises(Stopped):
        sweeper.sweep_forever(0, STEPS)
    return len(passes)


def test_the_summaries_catch_up_after_a_fresh_seed_is_said_once_and_the_rest_as_it_comes(
        jobs_to_test_redis, monkeypatch, caplog):
    seed_demo()
    caplog.set_level(logging.INFO, logger="surety.sweeper")

    passes = sweep_until_caught_up(monkeypatch)

    days = SummaryDay.objects.filter(stale=False).count()
    assert days > 80 and passes == days + 1  # a day a pass, then one with none left
    lines = [r.getMessage() for r in caplog.records if r.name == "surety.sweeper"]
    summarised = [line for line in lines if "actions_summarised" in line]
    assert len(summarised) == 2, summarised
    # Begun in the first pass, said with that pass's other work (the seed's audit events sealed).
    assert summarised[0].startswith("swept: {") and "'actions_summarised': 1" in summarised[0]
    assert "'audit_sealed': " in summarised[0]
    ended = rf"swept: {{'actions_summarised': 1}} again in {days - 1} more passes \(\d+ s\), then stopped"
    assert re.fullmatch(ended, summarised[1]), summarised[1]
    assert len(lines) < 10, lines  # the start's line, the first pass's, the catch-up's end, little more


def test_steps_repeating_together_are_one_line_and_a_long_repeat_is_said_while_it_goes_on(monkeypatch, caplog):
    clock = iter([0, 1, 2, 301, 302, 303])
    monkeypatch.setattr(sweeper.time, "monotonic", lambda: next(clock))
    caplog.set_level(logging.INFO, logger="surety.sweeper")
    swept = sweeper.Swept()
    sealed = {"audit_sealed": 1, "audit_verified": 1}

    for counts in ({"actions_expired": 0, "doorbells_rung": ["actions"], **sealed},
                   {"doorbells_rung": ["actions"], **sealed}, {"doorbells_rung": ["actions"]},
                   {"doorbells_rung": ["actions"]}, {"doorbells_rung": ["actions"], "alerts_redelivered": 2},
                   {"doorbells_rung": []}):
        swept.said(counts)

    assert [r.getMessage() for r in caplog.records] == [
        "swept: {'doorbells_rung': ['actions'], 'audit_sealed': 1, 'audit_verified': 1}",
        "swept: {'audit_sealed': 1, 'audit_verified': 1} again in 1 more pass (1 s), then stopped",
        "swept: {'doorbells_rung': ['actions']} again in 3 more passes (301 s), and goes on",
        "swept: {'alerts_redelivered': 2}",
        "swept: {'doorbells_rung': ['actions']} again in 1 more pass (1 s), then stopped",
    ]


def test_a_repeat_said_to_go_on_that_stops_at_the_next_pass_is_said_to_stop(monkeypatch, caplog):
    clock = iter([0, 1, 301, 302])
    monkeypatch.setattr(sweeper.time, "monotonic", lambda: next(clock))
    caplog.set_level(logging.INFO, logger="surety.sweeper")
    swept = sweeper.Swept()

    for counts in ({"actions_summarised": 1}, {"actions_summarised": 1}, {"actions_summarised": 1},
                   {"actions_summarised": 0}):
        swept.said(counts)

    assert [r.getMessage() for r in caplog.records] == [
        "swept: {'actions_summarised': 1}",
        "swept: {'actions_summarised': 1} again in 2 more passes (301 s), and goes on",
        "swept: {'actions_summarised': 1} stopped",
    ]
