"""The speed tricks stay in one place: statements are compiled only on the measured hot
paths, and every cache a module keeps is registered with what makes it stale."""

import ast
import importlib
from pathlib import Path

import pytest

from ledger import compiled, executor, runner  # noqa: F401 (their statements register on import)
from ledger.api import auth

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("ledger", "approvals", "dlq", "sandbox", "demo", "config")
# The measured hot paths (make bench): authentication and replay, the intake, the claim, a move.
REGISTRY = "ledger.compiled.CACHES"
HOT = ("ledger.models", "ledger.actions", "ledger.executor", "ledger.grants", "ledger.statemachine", "approvals.intake")


def module_caches(path):
    """Module-level dicts, thread-locals and functools caches: where a module keeps state."""
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and (
            isinstance(node.value, ast.Dict) and not node.value.keys
            or isinstance(node.value, ast.Call) and ast.unparse(node.value.func) in ("threading.local", "dict")
        ):
            found += [target.id for target in node.targets if isinstance(target, ast.Name)]
        if isinstance(node, ast.FunctionDef) and any(
            ast.unparse(d).startswith(("functools.cache", "functools.lru_cache", "cache", "lru_cache"))
            for d in node.decorator_list
        ):
            found.append(node.name)
    return found


def test_every_cache_a_module_keeps_is_registered():
    unregistered = []
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts or path.name == "settings.py":
                continue
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            names = [f"{module}.{name}" for name in module_caches(path) if f"{module}.{name}" != REGISTRY]
            if names:
                importlib.import_module(module)  # a cache registers where it is defined
            unregistered += [name for name in names if name not in compiled.CACHES]
    assert not unregistered, f"register these with ledger.compiled.register_cache: {unregistered}"


def test_statements_are_compiled_only_on_the_hot_paths():
    product = [str(s) for s in compiled.STATEMENTS if not str(s).startswith("tests.")]  # tests compile their own
    assert product
    assert all(statement.startswith(HOT) for statement in product), product


@pytest.mark.django_db
def test_clearing_the_caches_empties_them():
    auth._windows[1] = ("a minute", 3)
    compiled.clear_caches()
    assert auth._windows == {}
    assert all(cache.holds and cache.stale_when for cache in compiled.CACHES.values())
