"""Workflows in code: a name, an input serializer, and steps in execution order.

Three kinds of step:
- `read`: a look-up with no effect; no key; its result is checkpointed.
- `effect`: one action through the guarded executor, key `{task_id}:{step}:v{version}`.
- `local`: a write to this database, done in the same transaction as its checkpoint.
"""

from dataclasses import dataclass, field
from typing import Callable


class StepFailed(Exception):
    """`retry_after`: the seconds a rate-limited provider asked for; the task's retry waits them first."""

    def __init__(self, message, *, retryable, code="step_failed", retry_after=None):
        super().__init__(message)
        self.retryable = retryable
        self.code = code
        self.retry_after = retry_after


@dataclass(frozen=True)
class ActionSpec:
    action_type: str
    target: str
    params: dict
    customer: str = ""
    # The agent's decision the effect carries out, where the task's input names it: the ledger's
    # once-per-decision rules then hold across tasks and direct requests. Else the task's id.
    decision_id: str = ""


@dataclass(frozen=True)
class Step:
    name: str
    kind: str  # "read", "effect" or "local"
    run: Callable
    version: int = 1

    def key(self, task):
        return f"{task.task_id}:{self.name}:v{self.version}" if self.kind != "read" else ""


@dataclass(frozen=True)
class Workflow:
    name: str
    input_serializer: type
    steps: list = field(default_factory=list)


def read(name, run):
    return Step(name, "read", run)


def effect(name, run, version=1):
    return Step(name, "effect", run, version)


def local(name, run, version=1):
    return Step(name, "local", run, version)


# The registry, by name. Imported last: the workflows build on the classes above.
from .noop import NOOP  # noqa: E402
from .refund import REFUND  # noqa: E402

WORKFLOWS = {workflow.name: workflow for workflow in (REFUND, NOOP)}
