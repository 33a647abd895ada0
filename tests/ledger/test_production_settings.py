"""Production refuses to start with a development secret where one would be public."""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

PRODUCTION = {"PRODUCTION": "true", "DEBUG": "false", "ALLOWED_HOSTS": "surety.example",
              "SECRET_KEY": "k" * 60, "DATABASE_URL": "sqlite:///:memory:"}


def check(**env):
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("ALERT_", "SECRET_", "DJANGO_SETTINGS"))}
    return subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, capture_output=True, text=True,
                          env={**keep, **PRODUCTION, **env}, timeout=60)


@pytest.mark.parametrize(("env", "refused"), [
    ({"SECRET_KEY": ""}, "SECRET_KEY must be set"),
    ({"ALERT_WEBHOOK_URL": "https://alerts.example/hook"}, "ALERT_WEBHOOK_SECRET must be set"),
])
def test_production_refuses_to_start_with_a_development_secret(env, refused):
    result = check(**env)
    assert result.returncode != 0
    assert refused in result.stderr


def test_production_starts_with_its_secrets_set():
    result = check(ALERT_WEBHOOK_URL="https://alerts.example/hook", ALERT_WEBHOOK_SECRET="s" * 40)
    assert result.returncode == 0, result.stderr
