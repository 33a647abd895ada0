"""Agents (service accounts): create, grant, rotate, name the owner — each audited."""

import re

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from .connectors.test_mode import REPLAY_AGENT, is_replay_agent
from .grants import agent_grant, capability
from .models import ActionType, Agent, AuditEvent, Capability
from .workflows import WORKFLOWS

AGENT_NAME = re.compile(r"[A-Za-z0-9_-]+")  # Agent.name is a SlugField (ASCII)


def capabilities_named(name):
    """`--grant NAME`: the action type and/or the workflow of that name."""
    found = []
    if name in ActionType.values:
        found.append(capability(Capability.Kind.ACTION_TYPE, name))
    if name in WORKFLOWS:
        found.append(capability(Capability.Kind.WORKFLOW, name))
    if not found:
        raise ValueError(f"{name!r} is neither an action type nor a workflow")
    return found


def agent_create(name, *, actor, owner, grants=(), replay_set=False):
    """Returns (agent, token); the token is not stored and cannot be shown again. ValueError
    for a name that is not a new slug of at most 100 characters, or without an owner.

    `owner` is the person responsible for the agent; four eyes keep them from deciding its
    requests. The replay set's own agent (`replay_set`, ledger.replay) has a name nobody else may
    take: its actions under replay keys skip the grant checks and go to the test connector."""
    if owner is None:
        raise ValueError("every agent has an owner: the person responsible for it")
    # The name is a SlugField of 100 and becomes the username "agent-<name>" (150, unique):
    # checked here, for the dashboard and create_agent alike, rather than failing at the INSERT.
    if len(name) > 100 or not AGENT_NAME.fullmatch(name):
        raise ValueError("a name is 1 to 100 letters, digits, '-' or '_'")
    if (name == REPLAY_AGENT) != replay_set:
        raise ValueError(f"{REPLAY_AGENT!r} is the name of the replay set's own agent, and only its")
    taken = ValueError(f"an agent named {name!r} exists, or its username agent-{name} is taken")
    if Agent.objects.filter(name=name).exists() or get_user_model().objects.filter(username=f"agent-{name}").exists():
        raise taken
    try:
        return _agent_insert(name, actor=actor, grants=grants, owner=owner)
    except IntegrityError:  # the same name, created meanwhile: the unique constraints decide
        raise taken from None


def _agent_insert(name, *, actor, grants, owner):
    with transaction.atomic():
        user = get_user_model().objects.create_user(username=f"agent-{name}", password=None)
        token = Agent.new_token()
        agent = Agent.objects.create(name=name, user=user, token_hash=Agent.hash_token(token), token_prefix=token[:12],
                                     owner=owner, token_issued_by=_person(actor))
        AuditEvent.objects.record(actor=actor, verb="agent_created", obj=agent,
                                  after={"name": name, "owner": owner.get_username()})
        for grant in grants:
            for cap in capabilities_named(grant):
                # Granted as part of the creation, which is its reason (in shadow until promoted).
                agent_grant(agent, cap, actor=actor, reason=f"granted at the creation of the agent {name}")
    return agent, token


def _person(actor):
    """The person a new token is shown to (Agent.token_issued_by), or None for a command's."""
    return actor if isinstance(actor, get_user_model()) else None


def agent_rotate_token(agent, *, actor, reason=""):
    """A new token, shown once to `actor`. ValueError for the replay set's own agent: nobody holds
    a token of it (its replay-keyed actions skip the grant check at the claim)."""
    if Agent.objects.filter(is_replay_agent(), pk=agent.pk).exists():
        raise ValueError("the replay set's agent has no token anyone holds, and is given none")
    with transaction.atomic():
        token = Agent.new_token()
        agent.token_hash, agent.token_prefix = Agent.hash_token(token), token[:12]
        agent.token_issued_by = _person(actor)
        agent.save(update_fields=["token_hash", "token_prefix", "token_issued_by"])
        AuditEvent.objects.record(actor=actor, verb="token_rotated", obj=agent, reason=reason)
    return token


def agent_name_owner(agent, owner, *, actor, reason):
    """`owner` is the person responsible for the agent from now on (the placeholder's agents, made
    before every agent had one, or one whose owner moved on): four eyes keep them from deciding its
    requests, which the one before may decide again. ValueError without a person or a reason, or
    when `actor` answers for the agent (its owner, or shown its token): four eyes mean someone else
    names its next owner, or its owner would hand it away and decide its requests alone."""
    if owner is None:
        raise ValueError("name a person as its owner")
    if not reason.strip():
        raise ValueError("a reason is required to name an agent's owner")
    with transaction.atomic():
        agent = Agent.objects.select_for_update().get(pk=agent.pk)
        if agent.answers_for(_person(actor)):
            raise ValueError(f"four eyes: you answer for {agent.name} (its owner, or shown its token), "
                             "so someone else names its owner")
        before = agent.owner.get_username()
        agent.owner = owner
        agent.save(update_fields=["owner"])
        AuditEvent.objects.record(actor=actor, verb="owner_named", obj=agent, reason=reason,
                                  before={"owner": before}, after={"owner": owner.get_username()})
    return agent
