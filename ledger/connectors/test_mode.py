"""An action type's connector in its test mode, what the replay set runs against.

The sandbox connector's provider is the sandbox itself, so its test mode is the connector as
configured. Any other connector has one only if its `SURETY_CONNECTORS` entry says how:
`"test_mode": {"options": {...}}`, the options that replace the live ones (a team's test URL
for signed HTTP; Stripe's `api_base`, test key and test-mode webhook secret: the live webhook
secret is never the test mode's, `_LIVE_ONLY`). The replay run
stages its faults itself, through a fault proxy in front of the test mode's base URL
(ledger.connectors.fault_proxy), so no provider needs a faults endpoint; one that has its own
may still be named (`"faults_url"`: it takes `POST {"target", "fault", "times"}`, the sandbox's
protocol), and the run then uses it instead.

The replay agent's actions under keys starting with REPLAY_KEY_PREFIX belong to a replay
run: the executor sends them here, never to the live provider, whichever worker runs them.
Both must hold: any agent may choose such a key, and its action must reach the live provider.
In the process running the replay run, its actions go to the run's own connector (the one
pointed at its fault proxy, `replay_connector`); a worker elsewhere that takes a verification
over builds the test mode from the settings and asks the provider directly.
"""

import ast
import contextlib
import contextvars
import hashlib
import inspect
import json
import sys
import threading
from importlib import metadata

from django.conf import settings
from django.db.models import Q
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from ..compiled import register_cache
from ..models import Agent
from . import NoConnector, connector_for

REPLAY_KEY_PREFIX = "replay:"
REPLAY_AGENT = "replay-set"
REPLAY_AGENT_OWNER = "replay-set-owner"  # an inactive placeholder: nobody's requests, nobody's approvals
_SECRET_WORDS = ("secret", "key", "token", "password")
# The live options a test mode never takes over: a live endpoint's webhook signing secret. Stripe
# signs test-mode events with the test endpoint's own (STRIPE_TEST_WEBHOOK_SECRET, none by default:
# docs/contract.md); taking the live one, the replay set would sign its test events with it, and
# the webhook view would read them as live ones.
_LIVE_ONLY = ("webhook_secret",)
# Per action type, the replay run in this process: (its keys' prefix, its connector).
_running = contextvars.ContextVar("replay_connectors", default={})


class NoTestMode(LookupError):
    """The connector of an action type has no test mode to replay against (`evidence`: what it answered)."""

    def __init__(self, message, **evidence):
        super().__init__(message)
        self.evidence = evidence


def _entry(action_type):
    entry = settings.SURETY_CONNECTORS.get(action_type)
    if entry is None:
        raise NoConnector(f"no connector is configured for {action_type} (SURETY_CONNECTORS)")
    return entry


def test_connector_for(action_type):
    """The connector to replay against, and the URL of its provider's own faults endpoint where
    one is configured ("" otherwise: the replay run stages faults through its proxy)."""
    entry = _entry(action_type)
    live = connector_for(action_type)
    if live.name == "sandbox":
        return live, ""
    if not live.verifiable:
        raise NoTestMode(f"the {live.name} connector for {action_type} cannot be asked whether an effect was made, "
                         "which every case of the replay set verifies: its grants stay shadow (recorded, never "
                         "executed); serve it by a connector that can be asked, such as `http` in front of a "
                         "service that keeps its effects by key (docs/connectors.md)")
    test_mode = entry.get("test_mode")
    if not test_mode:
        raise NoTestMode(f"the {live.name} connector for {action_type} has no test mode: "
                         f"set SURETY_CONNECTORS['{action_type}']['test_mode']")
    live = {name: value for name, value in entry.get("options", {}).items() if name not in _LIVE_ONLY}
    connector = import_string(entry["class"])(**{**live, **test_mode.get("options", {})})
    return connector, test_mode.get("faults_url", "")


def is_replay_action(action):
    """Whether the action belongs to a replay run (its key's prefix is looked at first: free)."""
    return action.operation_key.startswith(REPLAY_KEY_PREFIX) and Agent.objects.filter(
        is_replay_agent(), pk=action.agent_id).exists()


def is_replay_agent():
    """The replay set's own agent: its name, owned by its placeholder (an agent a person made
    under the name before it was reserved is not it, and gets none of its ways)."""
    return Q(name=REPLAY_AGENT, owner__username=REPLAY_AGENT_OWNER)


@contextlib.contextmanager
def replay_connector(action_type, key_prefix, connector):
    """Within: this process's actions of `action_type` under `key_prefix` (one replay run's)
    go to `connector`, the run's test connector pointed at its fault proxy."""
    token = _running.set({**_running.get(), action_type: (key_prefix, connector)})
    try:
        yield connector
    finally:
        _running.reset(token)


def connector_for_action(action):
    """The connector that may act for this action: a replay run's goes to the test mode (the
    run's own connector in the run's process)."""
    if is_replay_action(action):
        prefix, connector = _running.get().get(action.action_type, (None, None))
        if connector is not None and action.operation_key.startswith(prefix):
            return connector
        return test_connector_for(action.action_type)[0]
    return connector_for(action.action_type)


def masked(options):
    """Options as they may be shown and stored: secrets replaced, their presence kept."""
    return {name: ("•••" if value and any(word in name.lower() for word in _SECRET_WORDS) else value)
            for name, value in options.items()}


def connector_description(action_type):
    """Name, class and masked options (live and test mode) of the connector serving `action_type`."""
    entry = _entry(action_type)
    test_mode = entry.get("test_mode") or {}
    return {
        "name": connector_for(action_type).name, "class": entry["class"],
        "options": masked(entry.get("options", {})),
        "test_mode": {"options": masked(test_mode.get("options", {})), "faults_url": test_mode.get("faults_url", "")},
    }


def _behaviour(cls):
    """The source of the connector's own code (its module, and the modules of its package and of the
    ledger it names: its base class, the HTTP client, Stripe's units, the signing), and the version
    of each library it names (the Stripe SDK): what it sends changes with any of them. Left out: the
    models' module, as a column added is not a change in what a connector sends; and Django, which
    every connector names for its settings: each patch release would send every grant back to
    shadow, and what was queued under them would be cancelled at its claim."""
    module = inspect.getmodule(cls)
    own = {"ledger", module.__name__.partition(".")[0]}  # a team's connector's package is its own code
    imported = [vars(module)[name] for name in _imported_names(module) if name in vars(module)]
    named = {inspect.getmodule(value) for value in [*imported, *cls.__mro__]} - {None}
    sources, libraries = {}, {}
    for used in sorted(named | {module}, key=lambda m: m.__name__):
        name, package = used.__name__, used.__name__.partition(".")[0]
        if name == "ledger.models" or package == "django":
            continue
        if package in own:
            try:
                sources[name] = inspect.getsource(used)
            except (OSError, TypeError):  # no source to read (a frozen build): the name stands in
                sources[name] = ""
        elif package not in sys.stdlib_module_names:
            libraries[package] = _installed(package)
    return {"sources": sources, "libraries": libraries}


def _installed(package):
    """The distributions that install `package`, with their versions. Its own name's first: reading
    which distribution installs what (packages_distributions) scans every one installed, 0.3 s of a
    worker's CPU, which (d) showed as 1 ms per action of a fresh worker's first thousand."""
    try:
        return [f"{package} {metadata.version(package)}"]
    except metadata.PackageNotFoundError:
        return sorted(f"{dist} {metadata.version(dist)}" for dist in metadata.packages_distributions().get(package, ()))


def _imported_names(module):
    """The names the module's own import statements bind. Not its namespace: a package's also holds
    every submodule any code in the process imported, so the version would differ from process to
    process (a worker's from the web's), and a grant promoted in one would be shadow in the other."""
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):  # no source to read (a frozen build)
        return set()
    with _parsing:  # CPython 3.11's ast.parse fails in two threads at once (see version_now)
        tree = ast.parse(source)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((alias.asname or alias.name).partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def connector_version(action_type):
    """A digest of what decides the connector's behaviour: the source of its code and the versions
    of its libraries (`_behaviour`), and every option, secrets included (only their digest is
    kept). Any change makes earlier runs stale."""
    entry = _entry(action_type)
    source = _behaviour(import_string(entry["class"]))
    extra = {"sandbox": [settings.SANDBOX_BASE_URL, settings.SANDBOX_API_KEY]} if connector_for(action_type).name == "sandbox" else {}
    canonical = json.dumps([entry["class"], entry.get("options", {}), entry.get("test_mode", {}), extra, source],
                           sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


_versions = {}
_computing, _parsing = threading.Lock(), threading.Lock()


def version_now(action_type):
    """connector_version(action_type), or None where no connector serves it: computed once per
    process, as a live grant's state asks for it at every claim (ledger.grants.grant_state). Under
    a lock the first time: a worker's drain lanes claim at once, and CPython 3.11's ast.parse (read
    for the connector's imports) raises SystemError ("AST constructor recursion depth mismatch")
    when two threads parse at once."""
    if action_type in _versions:
        return _versions[action_type]
    with _computing:
        if action_type not in _versions:
            try:
                _versions[action_type] = connector_version(action_type)
            except (NoConnector, ImportError):
                _versions[action_type] = None
        return _versions[action_type]


register_cache("ledger.connectors.test_mode._versions", holds="each action type's connector version",
               stale_when="the connector's settings change (tests: the setting_changed signal empties it)",
               clear=_versions.clear)


@receiver(setting_changed)
def _forget_versions(setting, **kwargs):
    if setting in ("SURETY_CONNECTORS", "SANDBOX_ENABLED", "SANDBOX_BASE_URL", "SANDBOX_API_KEY"):
        _versions.clear()
