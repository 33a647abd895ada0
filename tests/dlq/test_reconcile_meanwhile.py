"""A run reads which incidents are open once, at its start, then names each finding's effects in a
transaction of its own: a person may resolve the open incident, or a concurrent run open one, in
between. Whatever happened meanwhile, every effect the run found is named by an open incident when it
ends (the last run to read it may be the last that ever will: a manual `reconcile --hours N`).

Against the sandbox over HTTP. The other party (the person resolving, the concurrent run) holds its
transaction open, uncommitted, from before this run starts, and commits as soon as this run waits for
one of its locks (tests.factories.another_transaction): that is the interleaving, made to happen
every time, with no sleep."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from dlq.incidents import Incident, IncidentKind, incident_resolve
from dlq.models import Alert
from dlq.reconcile import Window, reconcile
from tests.dlq.test_reconcile import double_reported, planted
from tests.factories import another_transaction, audit_events, make_action, make_agent, person

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's row locks")
K = IncidentKind


def around(*moments):
    """The window from an hour before the first of `moments` to a minute after the last."""
    return Window(min(moments) - timedelta(hours=1), max(moments) + timedelta(minutes=1))


def open_about(key, kind):
    return Incident.objects.get(subject=key, kind=kind, status="open")


def test_an_effect_read_while_a_person_resolves_the_open_incident_opens_one_of_its_own(stack):
    """The double's incident was open when the run started, so its third refund was to be added to
    it; resolved before the run took its lock, the third refund was named nowhere."""
    key = "refund:ORD-RM:full:dec-1"
    first, now = double_reported(key)
    later = now + timedelta(hours=2)
    planted(key, "re_3", later)
    olga = person("olga", "operators")

    def resolve():
        incident_resolve(first, actor=olga, reason="re_2 clawed back")

    with another_transaction(resolve, commit_when_waited_on=True) as person_resolving:
        report = reconcile(around(later))["sandbox"]
    assert person_resolving.waited, "the run did not wait for the person's resolution"
    assert (report["opened"], report["added"]) == (1, 0)
    first.refresh_from_db()
    assert (first.status, first.external_refs) == ("resolved", ["re_existing", "re_2"])
    second = open_about(key, K.DOUBLE_EFFECT)
    assert second.external_refs == ["re_3"] and Alert.objects.filter(incident=second).exists()


def test_an_effect_read_while_a_concurrent_run_opens_the_incident_is_added_to_it(stack):
    """No incident when the run started, so it opened one; a scheduled run over the first two refunds
    committed its own first (both lock the action under the key), and the third refund, which only
    this run (by hand, over a wider window) read, was named nowhere."""
    agent, _ = make_agent("billing")
    key = "refund:ORD-RC:full:dec-1"
    make_action(agent, "succeeded", key=key, target="ORD-RC", external_ref="re_existing")
    now = timezone.now()
    later = now + timedelta(hours=2)
    planted(key, "re_existing", now)
    planted(key, "re_2", now)
    planted(key, "re_3", later)

    def scheduled_run():
        assert reconcile(around(now))["sandbox"]["opened"] == 1

    with another_transaction(scheduled_run, commit_when_waited_on=True) as concurrent:
        report = reconcile(around(now, later))["sandbox"]
    assert concurrent.waited, "the run did not wait for the concurrent one"
    assert (report["opened"], report["added"]) == (0, 1)
    incident = Incident.objects.get()
    assert (incident.status, incident.external_refs) == ("open", ["re_existing", "re_2", "re_3"])
    assert audit_events(incident, "incident_effects_added").get().after == {
        "external_refs": ["re_existing", "re_2", "re_3"]}
    assert Alert.objects.filter(incident=incident).count() == 2


def test_an_orphan_read_while_a_concurrent_run_opens_its_incident_is_added_to_it(stack):
    """An orphan's key names no action to lock: the two runs meet at the unique key of the open
    incident, and this run's insert fails once the other's commits."""
    key = "refund:ORD-GHOST:full:dec-9"
    now = timezone.now()
    later = now + timedelta(hours=2)
    planted(key, "re_ghost_1", now)
    planted(key, "re_ghost_2", later)

    def scheduled_run():
        assert reconcile(around(now))["sandbox"]["opened"] == 1

    with another_transaction(scheduled_run, commit_when_waited_on=True) as concurrent:
        report = reconcile(around(now, later))["sandbox"]
    assert concurrent.waited, "the run did not wait for the concurrent one"
    assert (report["opened"], report["added"]) == (0, 1)
    incident = Incident.objects.get()
    assert (incident.kind, incident.external_refs) == (K.ORPHAN_EFFECT, ["re_ghost_1", "re_ghost_2"])
    assert [effect["external_ref"] for effect in incident.evidence["effects"]] == ["re_ghost_1", "re_ghost_2"]
