"""The demo agents' grants made live for real, once the stack is up (`manage.py promote_demo_grants`).

The seed writes its agents' grants live and bound to no connector: the history it makes needs
them live, and no replay run can pass before the web app and its sandbox are up (demo.seed).
Once they are, each action type those agents hold a grant for is gated as any other:

1. the connector the workers run is asked of one (`workers_version`, as `grant_promote` asks);
2. unless that connector has a passing replay run (`passing_run`: the connectors page's "ready"),
   its replay set runs;
3. once it has one, each of those grants that is not live on that connector is promoted by a
   demo person, under the product's rules (`grant_promote`: four eyes, the passing run), and so
   bound to it (decision 58). One live on it already is left alone: run at every start, this
   promotes once, and again only once the review date passed or the connector changed.

A type whose replay set did not pass keeps its grants as they were, and its connector shows
"not ready" on the connectors page.
"""

from ledger.grants import agents_grants
from ledger.models import Agent, Capability, GrantState

from .seed import DEMO_AGENTS


def demo_grants():
    """The demo agents' grants for action types, by type (in name order): [(agent, its Grant row
    or None)]. A database seeded otherwise has none."""
    agents = list(Agent.objects.filter(name__in=[name for name, _, _ in DEMO_AGENTS]).order_by("name"))
    held = agents_grants(agents)
    by_type = {}
    for agent in agents:
        for cap, _, grant in held[agent.pk]:
            if cap.kind == Capability.Kind.ACTION_TYPE:
                by_type.setdefault(cap.name, []).append((agent, grant))
    return dict(sorted(by_type.items()))


def live_on(grant, version):
    """Whether the grant is live and bound to the connector `version`: the seed's, bound to none,
    is live but not on any connector."""
    return grant is not None and grant.connector_version == version and grant.state(version) == GrantState.LIVE
