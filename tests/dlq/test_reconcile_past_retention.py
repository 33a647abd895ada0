"""`manage.py reconcile --since` over effects people already resolved. While the resolved incidents
and the ledger's rows are kept, a run over the same window opens nothing and alerts nobody. A
window reaching back past what retention keeps (the action archived, its resolved incident with it
or not) would find those effects again as new orphans, to be resolved twice: such a window is
refused, saying from when a run may read."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from dlq.archive import archive_expired
from dlq.incidents import Incident, IncidentKind, ReconciliationRun, incident_resolve
from dlq.models import Alert
from dlq.reconcile import Window, reconcile
from ledger.models import Action
from tests.dlq.test_reconcile import planted
from tests.factories import make_action, make_agent, person

KEY = "refund:ORD-OLD:full:dec-1"
GHOST = "refund:ORD-GHOST:full:dec-9"


def found_and_resolved(ago):
    """A refund the ledger made `ago`, a second one under its key and one under a key the ledger
    never had, found by the run over their hour and resolved by a person the next day. Returns
    that hour's start."""
    agent, _ = make_agent("billing")
    then = timezone.now() - ago
    make_action(agent, "succeeded", key=KEY, target="ORD-OLD", external_ref="re_1", created_at=then)
    planted(KEY, "re_1", then)
    planted(KEY, "re_2", then + timedelta(minutes=1))
    planted(GHOST, "re_ghost", then + timedelta(minutes=2))
    assert reconcile(Window(then - timedelta(hours=1), then + timedelta(hours=1)))["sandbox"]["opened"] == 2
    olga = person("olga", "operators")
    for incident in Incident.objects.all():
        incident_resolve(incident, actor=olga, reason="clawed back")
    Incident.objects.update(resolved_at=then + timedelta(days=1))
    return then - timedelta(hours=1)


def reconcile_since(since, until=None):
    out = StringIO()
    call_command("reconcile", "--since", since.isoformat(), *(["--until", until.isoformat()] if until else []),
                 stdout=out)
    return out.getvalue()


def test_a_window_read_again_while_its_resolved_incidents_are_kept_opens_nothing(stack):
    since = found_and_resolved(timedelta(days=10))
    alerts = Alert.objects.count()

    assert "sandbox: records 3, findings 2, opened 0, added 0" in reconcile_since(since)
    assert set(Incident.objects.values_list("status", flat=True)) == {"resolved"}
    assert Incident.objects.count() == 2 and Alert.objects.count() == alerts


@pytest.mark.parametrize("retention_days", [
    400,  # the default: the action and both resolved incidents are archived
    500,  # longer than the key's lifetime: the action is archived, the resolved incidents are kept
])
def test_a_window_past_what_retention_keeps_is_refused_and_reopens_nothing(stack, settings, tmp_path,
                                                                            retention_days):
    settings.DEAD_LETTER_RETENTION_DAYS = retention_days
    since = found_and_resolved(timedelta(days=420))
    while archive_expired(tmp_path)[0] is not None:
        pass
    assert not Action.objects.filter(operation_key=KEY).exists()
    kept = set(Incident.objects.values_list("pk", flat=True))
    assert len(kept) == (0 if retention_days == 400 else 2)
    runs, alerts = ReconciliationRun.objects.count(), Alert.objects.count()

    with pytest.raises(CommandError) as refused:
        reconcile_since(since, until=since + timedelta(days=2))
    horizon = timezone.now() - timedelta(days=settings.OPERATION_KEY_LIFETIME_DAYS)
    assert f"no earlier than {horizon:%Y-%m-%d}" in str(refused.value)
    assert "OPERATION_KEY_LIFETIME_DAYS (400 days)" in str(refused.value)

    assert ReconciliationRun.objects.count() == runs
    assert set(Incident.objects.values_list("pk", flat=True)) == kept
    assert not Incident.objects.filter(kind=IncidentKind.ORPHAN_EFFECT, subject=KEY).exists()
    assert Alert.objects.count() == alerts


def test_a_window_from_just_inside_the_keys_lifetime_is_read(stack, settings):
    settings.OPERATION_KEY_LIFETIME_DAYS = 31
    with pytest.raises(CommandError):
        reconcile_since(timezone.now() - timedelta(days=31, minutes=1))
    assert "sandbox: records 0" in reconcile_since(timezone.now() - timedelta(days=30, hours=23))
