"""Resolved incidents leave the database with an archive run, their alerts with them, once they are
past DEAD_LETTER_RETENTION_DAYS and no action under their key is left: while one is, its evidence
record lists them and a redrive of its dead letter asks them. An open incident never goes (and keeps
its action: tests/dlq/test_archive_expired.py)."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from dlq.archive import archive_expired
from dlq.incidents import Incident, IncidentKind, incident_resolve
from dlq.models import Alert, DeadLetter
from dlq.reconcile import Finding
from ledger.models import Action
from ledger.retention import Archive
from tests.dlq.test_archive_expired import agent, billing, checkpoints_every_five, ledger, lines, run  # noqa: F401

pytestmark = pytest.mark.django_db


def opened(kind, key, ref, status=""):
    """The incident reconciliation opens for an effect `ref` under `key` ("" for none), with its alert."""
    finding = Finding(kind, "sandbox", "refund", key, key or ref, ledger={"status": status},
                      effects=[{"external_ref": ref, "amount": None, "currency": "", "created_at": None}])
    with connection.cursor() as cursor:  # its alert is written after it, as in one commit
        if connection.vendor == "postgresql":
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")
        incident = Incident.objects.open_for(finding, actor="system:reconcile")
        if connection.vendor == "postgresql":
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    return incident


def resolved(incident):
    return incident_resolve(incident, actor="user:ops", reason="the refund was clawed back")


def archived(tmp_path, model):
    """The pks of `model`'s rows in every file the runs wrote."""
    return {row["pk"] for archive in Archive.objects.all() for row in lines(tmp_path / archive.file)[1:]
            if row["model"] == model}


def test_a_resolved_incident_goes_once_no_action_under_its_key_is_left(tmp_path, ledger):
    denied = resolved(opened(IncidentKind.DENIED_EFFECT, "old-resolved", "re_1", "failed"))
    kept = resolved(opened(IncidentKind.DENIED_EFFECT, "old-open", "re_2", "failed"))  # its dead letter is open
    orphan = resolved(opened(IncidentKind.ORPHAN_EFFECT, "", "re_3"))
    still_open = opened(IncidentKind.ORPHAN_EFFECT, "", "re_4")
    alerts = {incident.pk: set(Alert.objects.filter(incident=incident).values_list("pk", flat=True))
              for incident in (denied, orphan)}

    first, counts = run(tmp_path)
    assert counts["dlq.incident"] == 1 and first.removed == counts
    # Its action was still there when the run chose: it goes in the next run, after it.
    assert set(Incident.objects.values_list("pk", flat=True)) == {denied.pk, kept.pk, still_open.pk}
    second, counts = run(tmp_path)
    assert counts["dlq.incident"] == 1
    while run(tmp_path)[0] is not None:
        pass

    assert set(Incident.objects.values_list("pk", flat=True)) == {kept.pk, still_open.pk}
    assert Alert.objects.filter(incident__in=[kept, still_open]).count() == 2
    assert archived(tmp_path, "dlq.incident") == {denied.pk, orphan.pk}
    assert archived(tmp_path, "dlq.alert") >= alerts[denied.pk] | alerts[orphan.pk]
    # The action its key names is kept with its open dead letter, whose redrive the incident still refuses.
    entry = DeadLetter.objects.get(action=ledger["open"], status="open")
    assert f"incident #{kept.pk}" in entry.redrive_refusal


def test_a_resolved_incident_stays_its_retention_after_its_action_went(tmp_path, ledger, settings):
    settings.DEAD_LETTER_RETENTION_DAYS = 500  # longer than the key's lifetime
    incident = resolved(opened(IncidentKind.FAILED_EFFECT, "old-done", "re_1"))
    while run(tmp_path)[0] is not None:
        pass
    assert not Action.objects.filter(pk=ledger["done"].pk).exists()
    assert Incident.objects.filter(pk=incident.pk).exists()

    _, counts = archive_expired(tmp_path, now=timezone.now() + timedelta(days=501))
    assert counts["dlq.incident"] == 1 and not Incident.objects.filter(pk=incident.pk).exists()
