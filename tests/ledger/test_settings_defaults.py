"""Defaults the configuration promises (docs/contract.md's table), read from config/settings.py
run afresh with a given environment."""

import runpy

from tests.conftest import ROOT


def settings_built_with(monkeypatch, **env):
    for name in ("SANDBOX_BASE_URL", "SITE_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(ROOT / "config" / "settings.py"))


def test_the_sandbox_connector_calls_this_apps_own_sandbox_by_default(monkeypatch):
    """Deployed at another address than the development one, the sandbox connector's calls went to
    127.0.0.1:8000, another app or nothing, and every sandbox action failed as unreachable."""
    built = settings_built_with(monkeypatch, SITE_URL="https://surety.test:8443/")
    assert built["SANDBOX_BASE_URL"] == "https://surety.test:8443/sandbox/v1"
    assert settings_built_with(monkeypatch)["SANDBOX_BASE_URL"] == "http://127.0.0.1:8000/sandbox/v1"
    given = settings_built_with(monkeypatch, SITE_URL="https://surety.test", SANDBOX_BASE_URL="http://inside:8000/sandbox/v1")
    assert given["SANDBOX_BASE_URL"] == "http://inside:8000/sandbox/v1"
