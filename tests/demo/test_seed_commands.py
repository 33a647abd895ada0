"""`setup_roles`, `seed_demo` and `seed_volume`: the roles grant what the dashboard checks, the
demo has every state (reached by the product's own executor, runner and sweeper, through a
provider that commits into the sandbox's tables, and audited) and the volume
loader creates what it is asked for, with an alert for every dead-letter entry.

These commit for real (transaction=True): the dead-letter alert check is a deferred
PostgreSQL trigger that runs only at COMMIT, and the audit sealer chains committed events.
"""

import io
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone
from guardian.models import GroupObjectPermission
from guardian.shortcuts import assign_perm

from ledger.access import user_may
from approvals.models import Limit, ReviewItem, ReviewStatus
from dlq.models import Alert, DeadLetter, EntryStatus
from sandbox.models import SandboxBooking, SandboxMessage, SandboxRefund
from ledger.actions import action_request
from ledger.connectors import connector_for
from ledger.roles import roles_setup
from ledger.tasks import task_request
from ledger.workflows import WORKFLOWS
from ledger.workflows.refund import REFUND
from ledger.models import (
    PERSON_STATUSES, Action, ActionStatus, Agent, AuditEvent, Capability, Task, TaskState,
)

from tests.factories import make_agent

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="COPY and the alert check need PostgreSQL"),
]

@pytest.fixture(autouse=True)
def no_jobs(jobs_to_test_redis):
    """No worker is part of these tests: what is enqueued after commit (drains, alert
    deliveries) really goes through RQ into this run's own Redis database, where no worker
    listens, and is read back from there. Returns a function listing the queued jobs' names."""
    import django_rq
    from rq.registry import ScheduledJobRegistry

    queue = django_rq.get_queue("default")
    queue.connection.flushdb()

    def enqueued():
        scheduled = ScheduledJobRegistry(queue=queue).get_job_ids()
        jobs = queue.get_jobs() + [queue.fetch_job(job_id) for job_id in scheduled]
        return [job.func_name.rsplit(".", 1)[-1] for job in jobs if job is not None]

    yield enqueued
    queue.connection.flushdb()


def run(command, **options):
    out = io.StringIO()
    call_command(command, stdout=out, **options)
    return out.getvalue()


def person(username, group):
    user = get_user_model().objects.create_user(username=username, password="x")
    user.groups.add(Group.objects.get(name=group))
    return get_user_model().objects.get(pk=user.pk)  # no cached permissions


# --- setup_roles ---------------------------------------------------------------------------------


def test_setup_roles_is_idempotent_and_grants_what_each_role_may_do():
    run("setup_roles")
    grants = GroupObjectPermission.objects.count()
    model_perms = {g.name: g.permissions.count() for g in Group.objects.all()}
    events = AuditEvent.objects.count()

    assert "nothing to change" in run("setup_roles")
    assert roles_setup() == []
    assert GroupObjectPermission.objects.count() == grants
    assert {g.name: g.permissions.count() for g in Group.objects.all()} == model_perms
    assert AuditEvent.objects.count() == events  # a second run changes nothing, so records nothing

    assert set(Group.objects.values_list("name", flat=True)) >= {"operators", "approvers", "auditors", "admins"}
    assert set(Capability.objects.filter(kind="action_type").values_list("name", flat=True)) == {
        "refund", "send_message", "create_booking"}
    assert set(Capability.objects.filter(kind="workflow").values_list("name", flat=True)) >= {"refund", "noop"}

    approver, operator = person("alice", "approvers"), person("olga", "operators")
    auditor, admin = person("aldo", "auditors"), person("ada", "admins")
    for action_type in ("refund", "send_message", "create_booking"):
        assert user_may(approver, "approve_capability", "action_type", action_type)
        assert user_may(approver, "resolve_capability", "action_type", action_type)
        assert not user_may(operator, "approve_capability", "action_type", action_type)
        assert user_may(operator, "resolve_capability", "action_type", action_type)
        assert user_may(operator, "work_deadletters_capability", "action_type", action_type)
        assert not user_may(approver, "work_deadletters_capability", "action_type", action_type)
        assert user_may(admin, "approve_capability", "action_type", action_type)
        assert user_may(admin, "resolve_capability", "action_type", action_type)
        for perm in ("approve_capability", "resolve_capability", "work_deadletters_capability"):
            assert not user_may(auditor, perm, "action_type", action_type)
    assert user_may(operator, "work_deadletters_capability", "workflow", "refund")
    assert user_may(admin, "work_deadletters_capability", "workflow", "refund")
    assert not user_may(approver, "work_deadletters_capability", "workflow", "refund")
    assert not user_may(auditor, "work_deadletters_capability", "workflow", "refund")

    for user in (approver, operator, auditor, admin):
        assert user.has_perm("ledger.view_auditevent")
        assert user.has_perm("ledger.view_action") and user.has_perm("dlq.view_deadletter")
        assert user.has_perm("approvals.view_reviewitem")
        assert not user.has_perm("ledger.change_action")
    assert admin.has_perm("ledger.change_agent") and admin.has_perm("approvals.change_limit")
    for user in (approver, operator, auditor):
        assert not user.has_perm("ledger.change_agent")
        assert not user.has_perm("approvals.change_limit")
    assert AuditEvent.objects.filter(verb="role_granted").exists()
    AuditEvent.objects.seal()
    assert AuditEvent.objects.verify_chain() is None


def test_setup_roles_adds_capabilities_that_appear_later_and_keeps_extra_grants():
    run("setup_roles")
    Capability.objects.filter(kind="action_type", name="create_booking").delete()  # as if it were new
    extra = Capability.objects.get(kind="action_type", name="send_message")
    assign_perm("ledger.work_deadletters_capability", Group.objects.get(name="approvers"), extra)

    run("setup_roles")
    approver, auditor = person("alice", "approvers"), person("aldo", "auditors")
    assert user_may(approver, "approve_capability", "action_type", "create_booking")
    assert not user_may(auditor, "approve_capability", "action_type", "create_booking")
    assert user_may(approver, "work_deadletters_capability", "action_type", "send_message")  # not removed


# --- seed_demo ----------------------------------------------------------------------------------


def test_seed_demo_refuses_outside_development(settings):
    settings.DEBUG = False
    with pytest.raises(CommandError, match="development"):
        run("seed_demo")
    settings.DEBUG, settings.PRODUCTION = True, True
    with pytest.raises(CommandError, match="development"):
        run("seed_demo")
    assert not Action.objects.exists()


def test_seed_demo_has_every_state_made_through_audited_functions(no_jobs):
    out = run("seed_demo", force=True)
    # Runnable work rings its drain after commit; every alert is handed to delivery.
    enqueued = no_jobs()
    assert {"drain_actions", "drain_tasks"} <= set(enqueued), enqueued
    assert Alert.objects.exists()
    assert enqueued.count("alert_deliver") == Alert.objects.count()

    statuses = set(Action.objects.values_list("status", flat=True))
    assert statuses == set(ActionStatus.values), set(ActionStatus.values) - statuses
    states = set(Task.objects.values_list("state", flat=True))
    assert {TaskState.WAITING, TaskState.SUCCEEDED, TaskState.DEAD_LETTERED} <= states

    # The states were reached by the product's workers, not written by the seed: actions
    # moved by the executor and the sweeper (besides people, agents and the intake), tasks by
    # the runner; the seed itself only skipped tasks' backoffs, audited as "run now".
    action_actors = set(AuditEvent.objects.filter(object_type="ledger.action").values_list("actor", flat=True))
    assert {"system:executor", "system:sweeper"} <= action_actors
    assert not any(actor.startswith("system:seed") for actor in action_actors), action_actors
    task_events = AuditEvent.objects.filter(object_type="ledger.task", actor__startswith="system:")
    assert set(task_events.values_list("actor", "verb").filter(actor="system:seed_demo")) == {
        ("system:seed_demo", "run_now")}
    assert set(task_events.exclude(actor="system:seed_demo").values_list("actor", flat=True)) == {"system:runner"}
    # The provider's side is what the sandbox commits: one effect per succeeded action, under
    # its operation key, named by its external reference; a call that timed out after the
    # commit left its effect there too, one that timed out before it left nothing.
    effects = {"refund": (SandboxRefund, "refund_id"), "send_message": (SandboxMessage, "message_id"),
               "create_booking": (SandboxBooking, "booking_id")}
    for action in Action.objects.filter(status=ActionStatus.SUCCEEDED):
        model, ref = effects[action.action_type]
        committed = model.objects.filter(operation_key=action.operation_key).values_list(ref, flat=True)
        assert list(committed) == [action.external_ref], action
    assert SandboxRefund.objects.filter(operation_key="refund:ORD-10018:full:dec-404").exists()
    assert not SandboxRefund.objects.filter(operation_key="refund:ORD-10023:full:dec-408").exists()
    # The demo's provider served the seed alone: the registry and the workflows are back.
    assert connector_for("refund").name == "sandbox" and WORKFLOWS["refund"] is REFUND

    open_entries = DeadLetter.objects.filter(status=EntryStatus.OPEN)
    assert open_entries.count() >= 3
    assert all(Alert.objects.filter(dead_letter=entry).exists() for entry in DeadLetter.objects.all())
    assert DeadLetter.objects.filter(status=EntryStatus.REDRIVEN).exists()
    redriven = DeadLetter.objects.get(status=EntryStatus.REDRIVEN).task
    assert redriven.state == TaskState.QUEUED

    # Everything waiting for a person has an open review item; some are overdue, with an alert.
    for action in Action.objects.filter(status__in=PERSON_STATUSES):
        assert ReviewItem.objects.filter(action=action, status=ReviewStatus.OPEN).exists(), action
    overdue = ReviewItem.objects.filter(status=ReviewStatus.OPEN, deadline__lt=timezone.now())
    assert overdue.exists()
    assert all(Alert.objects.filter(review_item=item, kind="overdue_review").exists() for item in overdue)
    dual = ReviewItem.objects.filter(status=ReviewStatus.OPEN, approvals_needed=2)
    assert dual.count() == 2 and any(item.approvals.count() == 1 for item in dual)
    held_targets = Action.objects.filter(status=ActionStatus.HELD).values_list("target", flat=True)
    assert len(held_targets) == 2 and len(set(held_targets)) == 1
    # The expired approval was opened its 48 hours' window ago and expired once it had passed, as
    # the sweeper expires one (not opened just now, "expired" with its expiry two days ahead).
    expired = ReviewItem.objects.get(status=ReviewStatus.EXPIRED)
    assert abs(expired.expires_at - expired.created_at - timedelta(hours=48)) < timedelta(seconds=1)
    assert abs(expired.deadline - expired.created_at - timedelta(hours=4)) < timedelta(seconds=1)  # moved with it
    assert expired.expires_at <= expired.decided_at

    # Every action's story is in the audit trail, and the chain holds.
    for action in Action.objects.all():
        assert AuditEvent.objects.filter(object_type="ledger.action", object_id=str(action.pk)).exists()
    AuditEvent.objects.seal()
    assert AuditEvent.objects.verify_chain() is None

    limit = Limit.objects.get(action_type="refund", currency="EUR")
    assert (str(limit.max_amount), str(limit.dual_approval_above), str(limit.daily_customer_total)) == (
        "500.000", "5000.000", "2000.000")
    assert Limit.objects.filter(action_type="refund", currency="USD").exists()
    billing = Agent.objects.get(name="billing-bot")
    assert billing.owner.username == "olga"
    assert Agent.objects.get(name="support-bot").owner.username == "bob"

    users = get_user_model().objects.filter(username__in=["alice", "bob", "olga", "aldo", "ada"])
    assert users.count() == 5 and all(u.check_password("demo") for u in users)
    ada = users.get(username="ada")
    assert ada.is_staff and not ada.is_superuser and ada.has_perm("ledger.change_agent")
    for role, names in {"approvers": "alice, bob", "operators": "olga", "auditors": "aldo", "admins": "ada"}.items():
        assert f"{role:<10} {names}" in out
    token = next(line.split()[-1] for line in out.splitlines() if line.strip().startswith("billing-bot"))
    assert Agent.objects.for_token(token) == billing

    # A second run finds the demo and leaves it alone.
    events = AuditEvent.objects.count()
    again = run("seed_demo", force=True)
    assert "already seeded" in again and "alice, bob" in again
    assert AuditEvent.objects.count() == events


def test_seed_demo_leaves_other_work_in_the_database_alone():
    # Due before anything the demo makes: a worker's claim would find these first.
    agent = make_agent("other-bot")[0]
    task, _ = task_request(agent=agent, task_id="other-1", workflow="noop", input={})
    action, _ = action_request(agent=agent, operation_key="other-1", action_type="refund", target="ORD-OTHER",
                               customer="CUST-OTHER", params={"amount": "10.00", "currency": "EUR"})

    run("seed_demo", force=True)
    task, action = Task.objects.get(pk=task.pk), Action.objects.get(pk=action.pk)
    assert (task.state, task.attempts, action.status, action.attempts) == (TaskState.QUEUED, 0, ActionStatus.QUEUED, 0)
    assert DeadLetter.objects.filter(status=EntryStatus.OPEN).count() >= 3


# --- seed_volume ----------------------------------------------------------------------------------


def test_seed_volume_creates_the_requested_counts():
    out = run("seed_volume", actions=1000, deadletters=100, tasks=40, seed=7)

    assert Action.objects.count() == 1000
    assert DeadLetter.objects.count() == 100
    assert Task.objects.count() == 140
    assert Task.objects.filter(steps__isnull=True).count() == 0
    assert Alert.objects.filter(dead_letter__isnull=False).values("dead_letter").distinct().count() == 100
    assert DeadLetter.objects.filter(status=EntryStatus.OPEN).exists()
    # Mostly settled history; the newest 400 are recent, and about half of those wait for a person.
    assert Action.objects.filter(status=ActionStatus.SUCCEEDED).count() > 650
    waiting = Action.objects.filter(status__in=PERSON_STATUSES).count()
    assert waiting >= 100
    assert ReviewItem.objects.filter(status=ReviewStatus.OPEN).count() == waiting
    # Synthetic volume bypasses the audit trail: only the agents it created are recorded.
    assert not AuditEvent.objects.filter(object_type="ledger.action").exists()
    AuditEvent.objects.seal()
    assert AuditEvent.objects.verify_chain() is None
    assert "done in" in out

    run("seed_volume", scale=0.001, seed=8)  # 1,000 actions and 100 entries more, new keys
    assert Action.objects.count() == 2000
    assert DeadLetter.objects.count() == 200


def test_seed_volume_refuses_in_production(settings):
    settings.PRODUCTION = True
    with pytest.raises(CommandError, match="production"):
        run("seed_volume", actions=10, deadletters=1)
    assert not Action.objects.exists()
