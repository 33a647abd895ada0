"""A person's decision on a dead letter that an archive run took meanwhile (a closed entry past its
retention, shown on a page a moment before) is told so, as a decision on an entry already decided
is, not answered with a server error."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from dlq.archive import archive_expired
from dlq.entries import deadletter_discard, deadletter_redrive, deadletter_resolve
from dlq.models import DeadLetter
from ledger.statemachine import InvalidTransition
from tests.factories import make_action, make_agent, person

pytestmark = pytest.mark.django_db

LATER = timedelta(days=401)  # past the default 400-day lifetime and retentions


def committed():
    """As at the commit of the entry in production: its deferred check (an alert) runs now, not at
    the end of the test's one transaction, after the archive."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")


@pytest.mark.parametrize("decide", [
    lambda entry, olga: deadletter_redrive(entry, actor=olga, reason="again"),
    lambda entry, olga: deadletter_resolve(entry, actor=olga, note="done by hand"),
    lambda entry, olga: deadletter_discard(entry, actor=olga, reason="no"),
], ids=["redrive", "resolve", "discard"])
def test_a_decision_on_an_entry_archived_meanwhile_is_refused_as_decided(tmp_path, decide):
    action = make_action(make_agent("billing")[0], "failed", key="old-resolved", target="ORD-2", retryable=False)
    entry = DeadLetter.objects.open_for_action(action, actor="system:executor")
    entry.resolve(actor="user:ops", note="refunded by hand")
    committed()
    shown = DeadLetter.objects.get(pk=entry.pk)  # the page a person has open

    archive_expired(tmp_path, now=timezone.now() + LATER)
    assert not DeadLetter.objects.filter(pk=entry.pk).exists()

    with pytest.raises(InvalidTransition, match="archived"):
        decide(shown, person("olga", "operators"))
