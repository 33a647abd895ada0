"""What a connector is, and the permit without which its write method refuses to run.

Only the guarded executor may cause a provider-side effect. `Connector.perform` checks for a
permit naming this very action and claim; `write_permit` is used in `ledger/executor.py`
and nowhere else (tests/ledger/test_connector_guard.py checks the source tree for that).
"""

import contextlib
import contextvars
from dataclasses import dataclass, field

_permit = contextvars.ContextVar("connector_write_permit", default=None)


class UnguardedWrite(RuntimeError):
    """A connector's write was called outside the guarded executor."""


@dataclass(frozen=True)
class Effect:
    external_ref: str
    result: dict


@dataclass(frozen=True)
class Lookup:
    """What the provider says about an operation key: found True/False, or None if it can't tell."""

    found: bool | None
    external_ref: str = ""
    result: dict = field(default_factory=dict)
    evidence: dict = field(default_factory=dict)


@contextlib.contextmanager
def write_permit(action):
    token = _permit.set((action.pk, action.fence))
    try:
        yield
    finally:
        _permit.reset(token)


class Connector:
    """A provider for one or more action types, built by the registry with its options."""

    name = ""

    def __init__(self, **options):
        self.options = options

    def check(self):
        """What stops this connector from working (missing credentials, a bad URL), as messages."""
        return []

    def perform(self, action) -> Effect:
        if _permit.get() != (action.pk, action.fence):
            raise UnguardedWrite(f"{self.name}: write for {action.operation_key} outside the guarded executor")
        return self._send(action)

    def _send(self, action) -> Effect:
        raise NotImplementedError

    def find_effect(self, action) -> Lookup:
        """Ask the provider whether the action's effect exists. Read-only."""
        return Lookup(found=None, evidence={"reason": f"{self.name} cannot be asked"})
