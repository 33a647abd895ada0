"""`manage.py promote_demo_grants`, the demo's stack's gate once its web app answers. `make run` ran
the replay set of the refund connector alone and promoted billing-bot's refund grant only when it
was not live: the connectors page said "not ready" for send_message and create_booking, and the
seed's grants stayed live and bound to no connector (decision 58). Here every connector the demo
agents use is gated and every one of their grants bound to it, once; a connector that cannot pass
leaves the grants as the seed wrote them, and says so."""

import io
import socket
import subprocess

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from demo.seed import seed_demo
from ledger.grants import passing_run
from ledger.models import AuditEvent, Grant, ReplayRun
from tests.conftest import PYTHON, ROOT

DEMO_GRANTS = {("billing-bot", "create_booking"), ("billing-bot", "refund"), ("billing-bot", "send_message"),
               ("support-bot", "create_booking"), ("support-bot", "send_message")}


def demo_grants():
    return {(g.agent.name, g.capability.name): g
            for g in Grant.objects.filter(capability__kind="action_type").select_related("agent", "capability")}


def promoted_by_ada():
    return AuditEvent.objects.filter(verb="promoted", actor="user:ada")


def promote(stack):
    """The command as `make run` runs it: a process of its own with the stack's settings."""
    return subprocess.run([PYTHON, "manage.py", "promote_demo_grants", "--by", "ada"], cwd=ROOT, env=stack.env,
                          capture_output=True, text=True, timeout=240)


def test_every_connector_the_demo_uses_is_gated_and_its_grants_bound_once(stack):
    seed_demo()
    stack.start_worker()  # the stack's workers: asked which connector they run, and draining the seed's work
    assert {key: g.connector_version for key, g in demo_grants().items()} == dict.fromkeys(DEMO_GRANTS, "")

    ran = promote(stack)

    assert ran.returncode == 0, ran.stdout + ran.stderr
    grants = demo_grants()
    assert set(grants) == DEMO_GRANTS
    for (agent, action_type), grant in grants.items():
        run = ReplayRun.objects.get(action_type=action_type)
        assert run.passed and grant.connector_version == run.connector_version, (agent, action_type)
        assert passing_run(action_type, version=grant.connector_version) == run  # the connectors page's "ready"
        assert f"{agent} acts for real on {action_type} until " in ran.stdout
    assert promoted_by_ada().count() == len(DEMO_GRANTS)

    again = promote(stack)  # the next start

    assert again.returncode == 0, again.stdout + again.stderr
    assert ReplayRun.objects.count() == 3 and promoted_by_ada().count() == len(DEMO_GRANTS)
    assert again.stdout.count("grant is live on that connector already: nothing promoted.") == len(DEMO_GRANTS)


def test_a_connector_that_does_not_pass_leaves_the_seeds_grants_and_says_so(jobs_to_test_redis, settings,
                                                                            transactional_db):
    seed_demo()
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{free.getsockname()[1]}"  # nothing listens once it is closed
    settings.SANDBOX_BASE_URL = f"{nowhere}/sandbox/v1"
    settings.RQ_ASYNC = False  # this process is the workers: it says which connector they run
    out = io.StringIO()

    with pytest.raises(CommandError) as refused:
        call_command("promote_demo_grants", stdout=out)

    assert str(refused.value) == ("not live on their connectors: the demo's create_booking, refund, send_message "
                                  "grants (the lines above say why; the connectors page shows the replay runs)")
    assert out.getvalue().count(": failed: nothing promoted") == 3
    assert {key: g.connector_version for key, g in demo_grants().items()} == dict.fromkeys(DEMO_GRANTS, "")
    assert not promoted_by_ada().exists()
    assert ReplayRun.objects.filter(passed=False).count() == 3
