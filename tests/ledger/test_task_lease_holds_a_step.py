"""A run renews its task's lease between steps only: at a step's start, once less than half of it
is left (ledger.runner). A step whose action's failure is tried again looks at the provider first
and then calls it: up to two CONNECTOR_TIMEOUTs, and the margin. Where half a lease holds less, the
sweeper takes a healthy run back while its step is out (the run's attempt spent, and on its last
attempt the task dead-lettered as `worker_lost`): a start says so, as it says of an action's lease
too short for a look and a call (surety.W004), rather than running so.

The checks are Django's system checks, which every manage.py command runs first."""

import pytest
from django.core import checks


def said(settings, *, timeout, lease, margin=2):
    settings.CONNECTOR_TIMEOUT, settings.LEASE_SECONDS, settings.LEASE_MARGIN_SECONDS = timeout, lease, margin
    return [message.id for message in checks.run_checks() if message.id.startswith("surety.")]


def test_a_lease_whose_half_holds_no_look_and_call_is_warned_of_at_start(settings):
    """10 s of timeout, 2 of margin, a lease of 30: a call and its look fit in the lease (no
    surety.W004), but a step may start with only 15 s left of it."""
    assert said(settings, timeout=10, lease=30) == ["surety.W008"]


@pytest.mark.parametrize(("lease", "says"), [(24, ["surety.W008"]), (25, [])])
def test_half_a_lease_must_hold_more_than_two_timeouts_and_the_margin(settings, lease, says):
    """The defaults (5 s of timeout, 2 of margin, a lease of 30) hold it; 24 s of lease leaves a
    step 12 at its start, 2 x 5 + 2: not more."""
    assert said(settings, timeout=5, lease=lease) == says


def test_a_lease_too_short_for_a_call_is_said_once(settings):
    """Shorter still, the action's own rule says it (the run's would say nothing more)."""
    assert said(settings, timeout=10, lease=22) == ["surety.W004"]
