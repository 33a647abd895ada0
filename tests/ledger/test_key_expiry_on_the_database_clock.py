"""A key's lifetime ends by the database's clock, whatever a host's says (decision 57).

A host whose clock runs ahead would otherwise answer `410 operation_key_expired` to a replay, or
archive the action, while its key still names it for every other host: the agent that retries
then gets no answer for its effect within the lifetime the ledger advertised. The hosts here share
one clock, so a host whose clock is off is this process with Django's `timezone.now` moved (the
only stand-in in these tests: the host's clock itself cannot be set from a test). Each test also
shows that the host's clock alone would have decided otherwise.
"""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from dlq.archive import archive_expired
from ledger import clock
from ledger.models import Action, ArchivedKey
from ledger.retention import key_expired, key_lifetime
from tests.factories import host_clock_off_by, make_action, make_agent, post_action_in_process, refund_body
from tests.ledger.test_database_clock import database_now

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="on SQLite the host's clock is the database's"),
]
KEY = "refund:ORD-K1:dec-1"
HOUR = timedelta(hours=1)


@pytest.fixture(autouse=True)
def _read_the_clock_afresh():
    clock.forget()
    yield
    clock.forget()


def an_hour_left(model, **where):
    """The row recorded so long ago that its key has an hour left, by the database's clock."""
    model.objects.filter(**where).update(created_at=database_now() - key_lifetime() + HOUR)
    return model.objects.get(**where)


def test_a_web_host_whose_clock_runs_ahead_still_replays_a_live_key(client, monkeypatch):
    agent, token = make_agent("billing")
    client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    assert post_action_in_process(client, KEY, refund_body(order="ORD-K1")).status_code == 201
    action = an_hour_left(Action, operation_key=KEY)

    host_clock_off_by(monkeypatch, 2 * HOUR.total_seconds())  # the web process's host
    assert key_expired(action.created_at, now=timezone.now())  # on its own clock the key is over
    again = post_action_in_process(client, KEY, refund_body(order="ORD-K1"))

    assert (again.status_code, again.headers.get("Idempotent-Replayed")) == (200, "true"), again.content
    assert again.json()["operation_key"] == KEY
    assert list(Action.objects.filter(operation_key=KEY).values_list("pk", flat=True)) == [action.pk]


def test_an_archive_run_on_a_host_whose_clock_runs_ahead_keeps_a_live_key(tmp_path, monkeypatch):
    agent, _ = make_agent("billing")
    make_action(agent, "succeeded", key=KEY, target="ORD-K1")
    action = an_hour_left(Action, operation_key=KEY)

    host_clock_off_by(monkeypatch, 2 * HOUR.total_seconds())  # the archive command's host
    # On its own clock the run would take it:
    assert archive_expired(tmp_path, dry_run=True, now=timezone.now())[1].get("ledger.action") == 1

    assert archive_expired(tmp_path) == (None, {})
    assert Action.objects.filter(pk=action.pk).exists()
    assert not ArchivedKey.objects.filter(operation_key=KEY).exists()
    assert not list(tmp_path.iterdir())
