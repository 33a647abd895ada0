"""A workflow of no-op local steps: what a checkpoint costs, measured by `make bench`."""

from ledger.validation import StrictSerializer

from . import Workflow, local


class NoopInput(StrictSerializer):
    """Takes nothing."""


def _noop(ctx, key):
    return {"ok": True}


NOOP = Workflow("noop", NoopInput, [local(f"step_{i}", _noop) for i in range(1, 11)])
