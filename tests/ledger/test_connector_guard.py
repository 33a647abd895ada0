"""Only the guarded executor makes a connector write: at run time (the permit) and in the source."""

import ast
from pathlib import Path

import pytest

from ledger.connectors import base
from ledger.connectors.base import UnguardedWrite, write_permit
from ledger.connectors.sandbox import SandboxConnector
from ledger.models import Action, ActionStatus
from sandbox.models import SandboxRefund
from tests.factories import make_action, make_agent

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("ledger", "approvals", "dlq")


@pytest.fixture
def sandbox_refunds(live_server, settings):
    """The real sandbox (live_server) as the provider: what it stored is what reached it."""
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox/v1"
    return lambda: list(SandboxRefund.objects.values_list("operation_key", flat=True))


@pytest.fixture
def pending_action(db):
    agent, _ = make_agent("billing", grants=())
    action = make_action(agent, ActionStatus.QUEUED, key="refund:ORD-G1:full:dec-1", target="ORD-G1")
    return action.claim(owner="host:tests")


def test_a_connector_write_outside_the_executor_is_refused_and_reaches_no_provider(pending_action, sandbox_refunds):
    with pytest.raises(UnguardedWrite):
        SandboxConnector().perform(pending_action)
    assert sandbox_refunds() == []


def test_a_permit_for_another_claim_does_not_open_the_write(pending_action, sandbox_refunds):
    stale = Action.objects.get(pk=pending_action.pk)
    stale.fence -= 1
    with write_permit(stale), pytest.raises(UnguardedWrite):
        SandboxConnector().perform(pending_action)
    assert sandbox_refunds() == []


def test_the_permit_ends_with_its_block(pending_action, sandbox_refunds):
    """Inside the permit the write really reaches the sandbox; after it, it is refused and
    nothing more arrives there."""
    with write_permit(pending_action):
        effect = SandboxConnector().perform(pending_action)
    refund = SandboxRefund.objects.get(operation_key=pending_action.operation_key)
    assert effect.external_ref == refund.refund_id and refund.refund_id.startswith("re_")
    with pytest.raises(UnguardedWrite):
        SandboxConnector().perform(pending_action)
    assert sandbox_refunds() == [pending_action.operation_key]


# --- the source tree ---------------------------------------------------------------------------


def product_sources():
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(), filename=str(path))


def names_used(tree, name):
    """Lines where `name` is referenced: as a name, an attribute, an import or a definition."""
    lines = []
    for node in ast.walk(tree):
        if (
            (isinstance(node, ast.Name) and node.id == name)
            or (isinstance(node, ast.Attribute) and node.attr == name)
            or (isinstance(node, ast.alias) and name in (node.name.split(".")[-1], node.asname))
            or (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name)
        ):
            lines.append(getattr(node, "lineno", 0))
    return lines


def perform_calls(tree):
    return [
        node.lineno for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "perform"
    ]


def test_the_scan_sees_the_whole_product():
    files = dict(product_sources())
    assert {"ledger/executor.py", "ledger/connectors/base.py", "ledger/connectors/sandbox.py"} <= set(files)
    assert any(name.startswith("approvals/") for name in files)
    assert any(name.startswith("dlq/") for name in files)


def test_write_permit_is_used_only_in_the_executor_and_defined_only_in_the_connector_base():
    where = {path: lines for path, tree in product_sources() if (lines := names_used(tree, "write_permit"))}
    assert set(where) == {"ledger/executor.py", "ledger/connectors/base.py"}, where
    definitions = [
        (path, node.name) for path, tree in product_sources() for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "write_permit"
    ]
    assert definitions == [("ledger/connectors/base.py", "write_permit")]
    assert base.write_permit is write_permit


def test_the_permit_variable_is_touched_only_by_the_connector_base():
    where = {path for path, tree in product_sources() if names_used(tree, "_permit")}
    assert where == {"ledger/connectors/base.py"}


def test_perform_is_called_only_in_the_executor():
    where = {path: lines for path, tree in product_sources() if (lines := perform_calls(tree))}
    assert set(where) == {"ledger/executor.py"}, where


def test_no_product_code_calls_a_connectors_send_directly():
    where = {
        path for path, tree in product_sources() for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "_send"
    }
    assert where == {"ledger/connectors/base.py"}, where
