"""The sweeper: what makes Redis a mere delivery mechanism.

Each pass (any number may run at once: every step claims with SKIP LOCKED or a
conditional update):
1. pending actions whose lease lapsed (plus CONNECTOR_TIMEOUT) become `unknown`;
2. if any action is runnable (queued and due, or due for verification), ring its doorbell,
   which enqueues a drain job unless one is already waiting — a flushed Redis or a
   SIGKILLed worker loses nothing;
3. the same for tasks (expired leases, queued tasks, backoffs that have passed);
4. the steps the apps registered (`ledger.hooks.on_sweep`): review items past their
   deadline raise an alert, once (approvals); alerts whose delivery job was lost are
   enqueued again (dlq);
5. audit events committed since the last pass are sealed into the chain, and the chain is
   verified: the newest stretch every pass, the whole of it once a day.
"""

import logging

from . import hooks
from .executor import action_expire_leases, action_runnable_exists
from .jobs import ring
from .audit import audit_verify_due
from .models import AuditEvent
from .tasks import task_expire_leases, task_runnable_exists

logger = logging.getLogger("surety.sweeper")


def sweep_once():
    counts = {"actions_expired": action_expire_leases(), "tasks_expired": task_expire_leases()}
    if action_runnable_exists():
        ring("actions")
    if task_runnable_exists():
        ring("tasks")
    for name, step in hooks.sweep_steps():
        counts[name] = step()
    counts["audit_sealed"] = AuditEvent.objects.seal()
    counts["audit_verified"] = audit_verify_due()
    return counts
