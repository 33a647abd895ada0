"""The sweeper: what makes Redis a mere delivery mechanism.

Each pass:
1. pending actions whose lease lapsed (plus CONNECTOR_TIMEOUT) become `unknown`; running
   tasks whose lease lapsed go back to the queue;
2. if any action is runnable (queued and due, or due for verification), ring its doorbell,
   which enqueues a drain job unless one is already waiting — a flushed Redis or a
   SIGKILLed worker loses nothing; the same for tasks;
3. the steps of the apps built on the ledger, in the order console.sweeper lists them: the
   sandbox's lost webhooks go out; approvals nobody decided in time expire (approvals); review
   items past their deadline alert their tier, once, and escalate; alerts whose delivery job
   was lost are enqueued again; reconciliation runs start on their schedule, and bulk redrives
   whose job was lost resume (dlq);
4. audit events committed since the last pass are sealed into the chain, and the chain is
   verified: the newest stretch every pass, from its last checkpoint once a day, and the whole
   of it, once a day too, a stretch per pass (ledger.audit); the next partitions of the audit
   trail and of the webhook events are made ahead of their rows (ledger.partitions).

Several sweepers (one per host) and one leader per step. Every step but the doorbell (steps 1,
3 and 4) is elected: a sweeper runs it only while it holds the step's lease (ledger.locks), so
that alerts, escalations, expiries, reconciliations, seals and the daily verify happen once per
interval however many sweepers run, and a sweeper that dies (or loses the database) hands its
steps over when its leases lapse, SWEEP_LEASE_SECONDS after its last run of them. The doorbell
is rung by every sweeper: a ring is idempotent (it enqueues nothing while a drain job waits),
and it is the one thing that must never wait for a handover. A leased row rather than
`pg_try_advisory_xact_lock`: a step spans many transactions (a seal per batch of events, an
alert or an expiry per row, a reconciliation's job enqueued after its run's commit), and
holding one transaction around a whole step would keep its row locks, and people's decisions
waiting on them, until the step ends; a session's advisory lock would not survive a
transaction-pooling PgBouncer. A step that outlasts its lease may be started by another
sweeper meanwhile: each one is written to be safe alongside itself (SKIP LOCKED claims,
conditional updates, unique slots), so that costs work, never a second effect; and a leader
that hangs loses its steps as a dead one does (nothing renews a lease but a run). On SQLite there
is one process and no election. A pass run by hand (`sweep --once`, the tests'
`console.sweeper.sweep_once()`) runs every step.

Faults: a step that fails does not keep the steps after it from running: the pass goes on with
them, then fails with the first step's error (a bug or one bad row in one step would otherwise
stop every pass at that step: with a seal or the partitions after it, for good). Only a lost
connection to the database, or Redis unreachable, ends the pass at once: every step would meet
it, each after its own timeout.

`sweep_forever`: a pass begins by asking Redis (a PING). A pass that fails because the
database or Redis is unreachable is logged once per outage (what and why, without a traceback:
ledger.outages.Outage, which the drain lanes and the web side share),
then the broken connections are closed and the next pass waits SWEEP_INTERVAL_SECONDS, doubling
up to SWEEP_BACKOFF_MAX_SECONDS.
The first pass that succeeds logs how long the outage lasted and rings both doorbells whatever
seems runnable: drain jobs that failed meanwhile left nothing announced. Any other error (a bug,
a bad setting) ends the process with a non-zero status for its supervisor to restart it;
meanwhile its trace in Redis expires and `/healthz` says the sweeper is down.

What a pass did is one line, "swept: {step: what it did}", the steps that did nothing left out.
A step doing the same again pass after pass is a catch-up (a new database's 89 closed days
summarised one a pass, decision 46; a doorbell rung while the drains are busy): it is in the
line of the pass it began in, then left out of the next ones while it goes on, and said once
more when it stops, with how many passes it went on for (and every REPEATS_SAID_SECONDS while
it does, so that a catch-up still going is not silent). So every pass's work is in the log, once.
"""

import logging
import time
import uuid

from django.conf import settings
from django.db import close_old_connections

from .audit import audit_verify_due, audit_walk
from .executor import action_expire_leases, action_runnable_exists
from .jobs import redis_connection, ring, worker_name
from .locks import lead
from .metrics import sweeper_seen
from .models import AuditEvent
from .outages import REDIS_UNREACHABLE, Outage, connection_lost, waited_out
from .partitions import partitions_extend
from .tasks import task_expire_leases, task_runnable_exists

logger = logging.getLogger("surety.sweeper")
# A step doing the same pass after pass is said at least this often while it goes on.
REPEATS_SAID_SECONDS = 300


def sweep_once(steps, holder=None, ring_all=False):
    """One pass, with the apps' `steps` ((name, step) pairs: a step's name is its lease, and
    what `step()` returns is reported under it; see step 3 above); returns what each step it
    ran did, by name. With a `holder` (a sweeper process's name) only the steps it leads run;
    `ring_all` rings both doorbells unasked. A step's failure is raised once the others have run
    (see "Faults" above)."""
    failed = []
    counts = _run([("actions_expired", action_expire_leases), ("tasks_expired", task_expire_leases)], holder, failed)
    # Every sweeper rings (no lease): a step as the others for its faults, a statement timeout in
    # its look ending no pass before the steps after it.
    counts |= _run([("doorbells_rung", lambda: _ring(ring_all))], None, failed)
    counts |= _run([*steps, ("audit_sealed", AuditEvent.objects.seal),
                    ("audit_verified", audit_verify_due), ("audit_walked", audit_walk),
                    ("partitions_made", partitions_extend)], holder, failed)
    if failed:
        # The first is raised (with its traceback, where the pass's caller logs it), and named here.
        logger.error("step %s failed; the pass ran the others", failed[0][0])
        for name, exc in failed[1:]:
            logger.error("step %s failed too", name, exc_info=exc)
        raise failed[0][1]
    return counts


def _run(steps, holder, failed):
    """Run `steps`, adding each one's failure to `failed` as (name, error)."""
    counts = {}
    for name, step in steps:
        try:
            if holder is None or lead(name, holder, settings.SWEEP_LEASE_SECONDS):
                counts[name] = step()
                logger.debug("ran %s: %s", name, counts[name])
        except Exception as exc:
            if isinstance(exc, REDIS_UNREACHABLE) or connection_lost(exc):
                raise
            failed.append((name, exc))
    return counts


def _ring(ring_all):
    """Ring each drain with work waiting (every one with `ring_all`); the kinds rung."""
    rung = []
    if ring_all or action_runnable_exists():
        ring("actions")
        rung.append("actions")
    if ring_all or task_runnable_exists():
        ring("tasks")
        rung.append("tasks")
    return rung


def sweep_forever(interval, steps):
    """Pass after pass, every `interval` seconds, through outages (see the module's docstring)."""
    holder = f"{worker_name()}:{uuid.uuid4().hex[:8]}"
    logger.info("sweeper %s: a pass every %g s, leases of %g s", holder, interval, settings.SWEEP_LEASE_SECONDS)
    outage = Outage("sweeper", logger, first=interval, most=max(interval, settings.SWEEP_BACKOFF_MAX_SECONDS),
                    reset_redis=lambda: redis_connection().connection_pool.disconnect())
    swept = Swept()
    while True:
        try:
            if settings.RQ_ASYNC:
                # Before any step: without Redis a pass would log a traceback per doorbell its
                # steps ring, and a leader that cannot ring lets its leases lapse to one that can.
                redis_connection().ping()
            counts = sweep_once(steps, holder, ring_all=outage.ongoing)
            sweeper_seen()
        except Exception as exc:
            if not (isinstance(exc, REDIS_UNREACHABLE) or waited_out(exc)):
                raise
            time.sleep(outage.failed(exc))
            continue
        outage.answered()
        swept.said(counts)
        close_old_connections()
        time.sleep(interval)


class Swept:
    """The log of the passes' work (see "What a pass did" above): `said(counts)` after each pass."""

    def __init__(self):
        # Per step that did something in the last pass: [what it did, the passes since it was
        # said that did the same again, when it was said, when it last did, whether it was said
        # to go on] (monotonic times).
        self.repeating = {}

    def said(self, counts):
        now = time.monotonic()
        done = {name: count for name, count in counts.items() if count}
        # The steps whose repeats end here, or are said while they go on, grouped by how long
        # they went on (steps that began together are one line).
        stopped, going = {}, {}
        for name, (count, passes, since, last, went_on) in list(self.repeating.items()):
            if done.get(name) != count:
                del self.repeating[name]
                if passes or went_on:  # a line said it went on: one says it stopped
                    stopped.setdefault((passes, last - since), {})[name] = count
            elif now - since >= REPEATS_SAID_SECONDS:
                going.setdefault((passes + 1, now - since), {})[name] = count
                self.repeating[name] = [count, 0, now, now, True]
            else:
                self.repeating[name] = [count, passes + 1, since, now, went_on]
        for (passes, seconds), steps in stopped.items():
            if passes:
                logger.info("swept: %s again in %s (%.0f s), then stopped", steps, _more(passes), seconds)
            else:  # said to go on a pass ago
                logger.info("swept: %s stopped", steps)
        for (passes, seconds), steps in going.items():
            logger.info("swept: %s again in %s (%.0f s), and goes on", steps, _more(passes), seconds)
        new = {name: count for name, count in done.items() if name not in self.repeating}
        self.repeating.update((name, [count, 0, now, now, False]) for name, count in new.items())
        if new:
            logger.info("swept: %s", new)


def _more(passes):
    return f"{passes} more pass" + ("" if passes == 1 else "es")
