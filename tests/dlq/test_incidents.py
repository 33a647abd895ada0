"""An incident is never silent: the database refuses to commit one without its alert
(PostgreSQL; SQLite runs the same code, unchecked), as it does a dead-letter entry."""

import pytest
from django.db import IntegrityError, connection, transaction

from dlq.incidents import Incident, IncidentKind
from dlq.models import Alert
from dlq.reconcile import Finding

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("jobs_to_test_redis")]


@pytest.fixture(autouse=True)
def postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("the rule is a PostgreSQL constraint trigger")


def bare(subject):
    return {"kind": IncidentKind.ORPHAN_EFFECT, "connector": "sandbox", "subject": subject}


def test_an_incident_without_an_alert_cannot_be_committed():
    with pytest.raises(IntegrityError, match="has no alert"):
        with transaction.atomic():
            Incident.objects.create(**bare("k1"))
    with pytest.raises(IntegrityError, match="has no alert"):
        Incident.objects.create(**bare("k2"))  # autocommit
    assert not Incident.objects.exists()


def test_an_incident_opened_for_a_finding_commits_with_its_alert():
    incident = Incident.objects.open_for(Finding(IncidentKind.ORPHAN_EFFECT, "sandbox", "refund", "k3", "k3",
                                                 effects=[{"external_ref": "re_1"}]), actor="system:tests")
    assert Alert.objects.get().incident == incident
