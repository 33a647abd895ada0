"""An action's evidence record holds the alerts of the incidents under its key, with each delivery
(not whom it reached: staff addresses are not the agent's, test_evidence_privacy): it listed the
incident (a refund the provider failed after it succeeded) but not the alert that told people of it."""

import pytest

from dlq.evidence import deadletters_evidence
from dlq.incidents import Incident
from dlq.models import Alert, AlertDelivery
from dlq.reconcile import incident_open_for_failed_effect
from tests.factories import make_action

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]


def test_the_record_holds_an_incidents_alert_and_its_deliveries(agent):
    done = make_action(agent, "succeeded", external_ref="re_1")
    incident_open_for_failed_effect(done, connector="sandbox", external_ref="re_1", actor="system:tests",
                                    evidence={"webhook": "refund.failed"})
    incident, alert = Incident.objects.get(), Alert.objects.get()
    AlertDelivery.objects.create(alert=alert, channel="email", attempt=1, ok=True, detail="mailed to ops",
                                 reached=["ops@surety.example"])

    section = deadletters_evidence(done).data
    assert [(shown["id"], shown["incident"]) for shown in section["alerts"]] == [(alert.pk, incident.pk)]
    assert [(d["channel"], d["ok"]) for d in section["alerts"][0]["deliveries"]] == [("email", True)]
