"""Which agent may request which action type or start which workflow (django-guardian), and
whether its grant for an action type is live or shadow.

Checked here and nowhere else; every grant, promotion and revoke is audited.

A grant for an action type starts `shadow`: the agent's actions are recorded and
fingerprinted, never executed (the intake records them `shadow`). A person with the right to
manage agents, never the agent's owner (four eyes), promotes it to `live` with a reason and a
review date, and only while the connector's newest finished replay run (ledger.replay) for its
current version passed, within REPLAY_PASS_MAX_AGE_DAYS (`passing_run`). Past the review date
(on the database's clock, ledger.clock) it is shadow again unless renewed; that is read at each
check, so no job is needed. A revoke takes the permission and the live state away at once, and
the executor re-checks at each claim (`grant_lapsed`): what was queued under it is cancelled. It
checks once more right before each call (`grant_lapsed_now`), and a revoke, once committed,
returns only once no action under the grant is claimed with its lease running: what was claimed
when the revoke committed is never sent, and the calls already under way have returned (unless
the database fails that wait: the revoke stands, and the log says what it did not wait for).
"""

import functools
import logging
import time
from datetime import timedelta

import django_rq
import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import Error, transaction
from django.db.models import CharField, F
from django.db.models.functions import Cast
from guardian.models import UserObjectPermission
from guardian.shortcuts import assign_perm, remove_perm
from rq.job import JobStatus

from . import clock, outages
from .compiled import Compiled, register_cache
from .connectors.test_mode import version_now
from .jobs import DRAIN_SECONDS, redis_connection
from .models import Action, ActionStatus, Agent, AuditEvent, Capability, Grant, GrantState, ReplayRun

logger = logging.getLogger("surety.grants")
USE = "ledger.use_capability"
# How long a promotion lasts unless the person promoting says otherwise, and at most.
REVIEW_DAYS = 90
MAX_REVIEW_DAYS = 365
# How long a worker may take to say which connector it runs: it takes the question once the drain
# it runs and the one waiting are done, each at most DRAIN_SECONDS.
WAIT_SECONDS = 2 * DRAIN_SECONDS + 30
# How often a revoke looks whether the calls under its grant have returned.
SETTLED_POLL_SECONDS = 0.05


class GrantRefused(ValueError):
    """A promotion that the rules refuse (four eyes, no passing replay run, no reason...)."""


def capability(kind, name):
    return Capability.objects.get_or_create(kind=kind, name=name)[0]


# Kept per process: without it a request costs two statements more, a replay twice the CPU (decision 41).
_checked = {}
_CHECKED_MAX = 10_000
register_cache("ledger.grants._checked", holds="an agent's grant and its live-until date, by its grants_version",
               stale_when="a grant, promotion or revoke bumps the agent's grants_version (read with every request)",
               clear=_checked.clear)


def grant_state(agent, kind, name, now=None, version=None):
    """None without a grant, else `GrantState.LIVE` or `SHADOW`. A workflow's grant is live
    once given: it lets the agent start the workflow's tasks, while each step's action answers
    to the agent's grant for its action type (ledger.runner), which the replay set gates.

    Cached per process under the agent's `grants_version`, which every grant, promotion and
    revoke bumps: the agent row read for this very request says whether the cache is
    current. The review date (on the database's clock) and the connector's version (`version`, by
    default this process's) are compared at each call, so a kept live answer ends with its date."""
    key = (agent.pk, agent.grants_version, kind, name)
    if key not in _checked:
        if len(_checked) >= _CHECKED_MAX:
            _checked.clear()
        _checked[key] = _agent_holds(agent, kind, name)
    held, grant = _checked[key]
    return _held_state(kind, name, grant, now, version) if held else None


def _held_state(kind, name, grant, now=None, version=None):
    """The state of a grant the agent holds, `grant` its Grant row or None: the one rule, for
    the checks (grant_state) and the agents page (agents_grants) alike."""
    if kind == Capability.Kind.WORKFLOW:
        return GrantState.LIVE
    return grant.state(version or version_now(name), now) if grant else GrantState.SHADOW


def agent_may(agent, kind, name):
    return grant_state(agent, kind, name) is not None


def grant_lapsed(action, *, agent_user_id, agent_grants_version):
    """Why a queued action may no longer be attempted, or "": its agent's grant for its type
    was revoked, or is shadow (demoted, or past its review date) since it was recorded.

    The executor asks at each claim, with the agent's user and grants_version read by the
    claim's own statement, so the answer comes from `_checked` and costs no statement while
    the agent's grants are unchanged."""
    agent = Agent(pk=action.agent_id, user_id=agent_user_id, grants_version=agent_grants_version)
    state = grant_state(agent, Capability.Kind.ACTION_TYPE, action.action_type)
    if state == GrantState.LIVE:
        return ""
    if state is None:
        return f"grant revoked: the agent may no longer use {action.action_type}; never executed"
    return f"grant not live: the agent's grant for {action.action_type} is shadow again; never executed"


def grant_lapsed_now(action):
    """Why the claimed `action` may no longer be sent ("" while its grant is live), read afresh:
    the executor asks right before the call, once its claim has committed. A revoke committed by
    then is seen, and nothing is sent; one committed later finds the action claimed and waits for
    it (`_calls_settled`). So once a revoke returns, no call under the grant is in flight or starts.

    One statement (the agent's grants_version; the rest from the cache while the agent's grants
    are unchanged), in autocommit: no lock nor transaction is held around the call. (A lock taken
    by each call and alone by a revoke cost each action about 2 ms of CPU in bench (d) and, behind
    a transaction-pooling PgBouncer, a server connection for the call's length.)"""
    agent = _agent_now.first(action.agent_id)
    return grant_lapsed(action, agent_user_id=agent.user_id, agent_grants_version=agent.grants_version)


# On every call: compiled, it costs a worker 0.5 ms of CPU an action less (bench.worker_profile).
_agent_now = Compiled(lambda pk: Agent.objects.only("user_id", "grants_version").filter(pk=pk), int,
                      name="ledger.grants: the agent's grants as they are now")


def _calls_settled(agent_id, action_type):
    """Wait, once a revoke has committed, until no action under the grant is claimed with its
    lease running. Each such action was claimed before the revoke committed (or by a claim that
    read the grant just before), and its worker either looks at the grant after the commit (the
    action is cancelled, never sent) or is at the provider (it settles within CONNECTOR_TIMEOUT).
    A claim that reads the grant later cancels instead. An action's lease is never extended, so
    the wait ends within LEASE_SECONDS however the workers fare: a worker that died keeps its
    lease to the end, and what it may have sent is verified by whoever takes the action over.

    The revoke has committed when this runs: a database that fails the wait (a connection dropped,
    a statement timeout) cuts it short, said in the log, and the revoke's caller gets its answer
    rather than an error that would tell a person the revoke was not made."""
    deadline = time.monotonic() + settings.LEASE_SECONDS + settings.LEASE_MARGIN_SECONDS
    claimed = Action.objects.filter(agent_id=agent_id, action_type=action_type, status=ActionStatus.PENDING)
    try:
        while claimed.filter(lease_expires_at__gt=clock.now()).exists():
            if time.monotonic() >= deadline:  # only workers run with a longer LEASE_SECONDS than this process
                logger.warning("revoked %s for agent %s: actions still claimed after %.0f s; the revoke returns "
                               "without them", action_type, agent_id,
                               settings.LEASE_SECONDS + settings.LEASE_MARGIN_SECONDS)
                return
            time.sleep(SETTLED_POLL_SECONDS)
    # Django's Error, not only its DatabaseError: an InterfaceError (a connection already closed,
    # or in a state it cannot be used in) is none, and fails the wait all the same.
    except Error as exc:
        logger.warning("revoked %s for agent %s: the wait for the calls under the grant was cut short, as the "
                       "database failed it (%s: %s); the revoke is committed, and a call claimed before it may "
                       "still be at the provider", action_type, agent_id, type(exc).__name__,
                       outages.first_line(exc))
        outages.close_broken_connection()  # what the caller does next opens a fresh one


def _agent_holds(agent, kind, name):
    """(holds the permission, its Grant's live_until and connector_version, or None). Joined by
    natural keys rather than through the process's content-type cache; agents hold no group grants."""
    held = UserObjectPermission.objects.filter(
        user_id=agent.user_id,
        permission__codename="use_capability",
        permission__content_type__app_label="ledger",
        permission__content_type__model="capability",
        object_pk__in=Capability.objects.filter(kind=kind, name=name).values(pk_text=Cast("pk", CharField())),
    ).exists()
    grant = Grant.objects.filter(agent_id=agent.pk, capability__kind=kind, capability__name=name).only(
        "live_until", "connector_version").first() if held else None
    return held, grant


def _locked(agent):
    """The agent's row, locked: every change to its grants takes it first, so that they come one
    after the other (a promotion checked before a revoke committed would write its grant live
    after the revoke had deleted it, and a later grant would find that row live)."""
    return Agent.objects.select_for_update().get(pk=agent.pk)


def _bump(agent):
    Agent.objects.filter(pk=agent.pk).update(grants_version=F("grants_version") + 1)


def _reason_required(reason, change):
    """The reason, stripped; a change to what an agent may do is refused without one."""
    if not reason.strip():
        raise GrantRefused(f"a reason is required to {change}")
    return reason.strip()


def agent_grant(agent, cap, *, actor, reason):
    """Grant (or grant again) the use of `cap`, in shadow until a person promotes it."""
    reason = _reason_required(reason, "grant")
    with transaction.atomic():
        _locked(agent)
        assign_perm(USE, agent.user, cap)
        Grant.objects.get_or_create(agent=agent, capability=cap)
        _bump(agent)
        AuditEvent.objects.record(actor=actor, verb="granted", obj=agent, after={"capability": str(cap)}, reason=reason)


def agent_revoke(agent, cap, *, actor, reason):
    reason = _reason_required(reason, "revoke")
    with transaction.atomic():
        if cap.kind == Capability.Kind.ACTION_TYPE:
            # Returns once the calls already made under the grant have returned (grant_lapsed_now).
            transaction.on_commit(functools.partial(_calls_settled, agent.pk, cap.name))
        _locked(agent)
        before = Grant.objects.filter(agent=agent, capability=cap).first()
        remove_perm(USE, agent.user, cap)
        Grant.objects.filter(agent=agent, capability=cap).delete()
        _bump(agent)
        AuditEvent.objects.record(actor=actor, verb="revoked", obj=agent, reason=reason, before={
            "capability": str(cap), "state": before.state(version_now(cap.name)) if before else GrantState.SHADOW})


def passing_run(action_type, now=None, version=None):
    """The replay run that opens the gate, or None: the newest finished run (its verdict written)
    against the connector as it is now (`version`, by default this process's), if it passed and
    started within REPLAY_PASS_MAX_AGE_DAYS. Only the newest counts: a pass followed by a failure
    of the same connector says it fails now; and an old pass says nothing of the provider's test
    mode today, which changes without the connector changing."""
    version = version or version_now(action_type)
    if version is None:
        return None
    newest = ReplayRun.objects.filter(action_type=action_type, connector_version=version,
                                      passed__isnull=False).first()
    since = (now or clock.now()) - timedelta(days=settings.REPLAY_PASS_MAX_AGE_DAYS)
    return newest if newest and newest.passed and newest.started_at >= since else None


def workers_version(action_type, wait=WAIT_SECONDS):
    """The version of the action type's connector that the workers run (its code and their
    settings, version_now): they check a live grant against it at every claim, so a grant bound
    to a shell's version, computed from that shell's settings, would have what is queued under it
    cancelled. Asked of a worker through the queue, waiting at most `wait` seconds; without Redis,
    jobs run in the process that asks, and this process's is the one. Refused (GrantRefused) when
    no worker answers, the job fails, Redis does not answer, or no connector serves the type."""
    if not settings.RQ_ASYNC:
        return _served(action_type, version_now(action_type))
    try:
        # Enqueued at once, even inside a transaction (a caller's): the answer is waited for here.
        queue = django_rq.get_queue("default", connection=redis_connection(), commit_mode="auto")
        job = queue.enqueue(version_now, action_type, result_ttl=max(60, int(wait)), failure_ttl=3600,
                            job_timeout=60)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            status = job.get_status()
            if status == JobStatus.FINISHED:
                return _served(action_type, job.return_value(refresh=True))
            if status in (JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED):
                raise GrantRefused(f"the worker asked which {action_type} connector it runs failed to say "
                                   f"({status.value}): see its log")
            time.sleep(0.2)
        job.cancel()
    except redis.RedisError as exc:
        raise GrantRefused(f"Redis does not answer ({exc}), so no worker can be asked which {action_type} "
                           "connector it runs") from None
    raise GrantRefused(f"no worker said within {wait:g} s which {action_type} connector it runs, and a grant is "
                       "bound to that one: start the workers (or wait longer)")


def _served(action_type, version):
    if version is None:
        raise GrantRefused(f"no connector serves {action_type} where the workers run")
    return version


def grant_promote(agent, cap, *, actor, reason, review_by=None, version=None):
    """Make the agent's grant for an action type live until `review_by` (or renew it), bound to
    the connector's `version`: the one the workers run, which check the grant at each claim. By
    default this process's (the console's: the web process, configured as the workers are); a
    command run from another shell passes the workers' own (grant_promote's command asks one).

    Refused (GrantRefused) unless: a person other than the agent's owner asks, with a reason;
    the agent holds the grant; the review date is ahead, at most MAX_REVIEW_DAYS away; and
    the action type's connector passed the replay set as it is now (that version). The review date
    is set and checked on the database's clock, which the checks compare it with (Grant.state)."""
    now = clock.now()
    review_by = review_by or now + timedelta(days=REVIEW_DAYS)
    if not isinstance(actor, get_user_model()):
        raise GrantRefused("only a person may make a grant live")
    with transaction.atomic():
        # Four eyes on the agent as it is now, its row locked: a rotation that showed this person
        # its token, committed after the caller read it, counts.
        locked = _locked(agent)
        if locked.answers_for(actor):
            raise GrantRefused("the agent's owner, or who was shown its token, may not make its grant live (four eyes)")
        reason = _reason_required(reason, "make a grant live")
        if cap.kind != Capability.Kind.ACTION_TYPE:
            raise GrantRefused("only a grant for an action type is promoted; a workflow's is live once given")
        if not now < review_by <= now + timedelta(days=MAX_REVIEW_DAYS):
            raise GrantRefused(f"the review date must be ahead, at most {MAX_REVIEW_DAYS} days away")
        run = passing_run(cap.name, now, version)
        if run is None:
            raise GrantRefused(f"no replay run passed against the {cap.name} connector as it is now (its newest "
                               f"finished run, within {settings.REPLAY_PASS_MAX_AGE_DAYS} days): run the replay set")
        if not agent_may(locked, cap.kind, cap.name):
            raise GrantRefused(f"{agent} holds no grant for {cap}")
        grant, _ = Grant.objects.select_for_update().get_or_create(agent=agent, capability=cap)
        before = {"capability": str(cap), "state": grant.state(version or version_now(cap.name), now),
                  "live_until": grant.live_until}
        grant.live_until, grant.promoted_by, grant.promoted_at = review_by, actor, now
        grant.connector_version = run.connector_version  # live while the connector is this one
        grant.save(update_fields=["live_until", "promoted_by", "promoted_at", "connector_version"])
        _bump(agent)
        AuditEvent.objects.record(actor=actor, verb="promoted", obj=agent, before=before, reason=reason, after={
            "capability": str(cap), "state": GrantState.LIVE, "live_until": review_by, "replay_run": run.pk,
            "connector_version": run.connector_version})
    return grant


def agents_grants(agents, now=None):
    """The agents' grants for the agents page, by agent id: [(capability, state, grant row or
    None)] in the capabilities' order. Three statements whatever the number of agents."""
    agents = list(agents)
    rows = {(g.agent_id, g.capability_id): g
            for g in Grant.objects.filter(agent__in=agents).select_related("promoted_by")}
    held = UserObjectPermission.objects.filter(
        user_id__in=[agent.user_id for agent in agents], permission__codename="use_capability",
        permission__content_type__app_label="ledger").values_list("user_id", "object_pk")
    by_user = {}
    for user_id, object_pk in held:
        by_user.setdefault(user_id, set()).add(int(object_pk))
    caps = list(Capability.objects.filter(pk__in=set().union(*by_user.values())))
    shown = {}
    for agent in agents:
        states = shown[agent.pk] = []
        for cap in (c for c in caps if c.pk in by_user.get(agent.user_id, ())):
            grant = rows.get((agent.pk, cap.pk))
            states.append((cap, _held_state(cap.kind, cap.name, grant, now), grant))
    return shown
