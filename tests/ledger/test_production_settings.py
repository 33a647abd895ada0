"""Production refuses to start with a development secret where one would be public, or with
the tests' settings."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

PRODUCTION = {"PRODUCTION": "true", "DEBUG": "false", "ALLOWED_HOSTS": "surety.example",
              "SECRET_KEY": "k" * 60, "DATABASE_URL": "sqlite:///:memory:"}
# Production has no sandbox of its own: every action type needs a connector named.
CONNECTORS = {"CONNECTOR_REFUND": "sandbox", "CONNECTOR_SEND_MESSAGE": "sandbox", "CONNECTOR_CREATE_BOOKING": "sandbox"}


def manage(*command, **env):
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("ALERT_", "SECRET_", "DJANGO_SETTINGS", "CONNECTOR_"))}
    return subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, capture_output=True, text=True,
                          env={**keep, **PRODUCTION, **CONNECTORS, **env}, timeout=60)


@pytest.mark.parametrize(("env", "refused"), [
    ({"SECRET_KEY": ""}, "SECRET_KEY must be set"),
    ({"ALERT_WEBHOOK_URL": "https://alerts.example/hook"}, "ALERT_WEBHOOK_SECRET must be set"),
    # A bulk redrive's ceiling is kept with two decimals, below a million a minute.
    ({"CONNECTOR_REFUND_REDRIVE_RATE": "1e7"}, "CONNECTOR_<TYPE>_REDRIVE_RATE must be from 0.01"),
    ({"CONNECTOR_REFUND_REDRIVE_RATE": "0.001"}, "CONNECTOR_<TYPE>_REDRIVE_RATE must be from 0.01"),
    # A seal would divide by zero on every pass; a walk would never advance; a partition hold nothing.
    *(({name: "0"}, "AUDIT_CHECKPOINT_EVERY, AUDIT_WALK_BATCH and PARTITION_EVENTS must be at least 1")
      for name in ("AUDIT_CHECKPOINT_EVERY", "AUDIT_WALK_BATCH", "PARTITION_EVENTS")),
    ({"REPLAY_PASS_MAX_AGE_DAYS": "0"}, "REPLAY_PASS_MAX_AGE_DAYS must be at least 1"),
    # The schedule would read back past what the archive keeps, and find resolved effects again.
    ({"RECONCILE_LOOKBACK_SECONDS": str(401 * 86400)}, "RECONCILE_LOOKBACK_SECONDS must be at most"),
])
def test_production_refuses_to_start_with_a_development_secret(env, refused):
    result = manage("check", **env)
    assert result.returncode != 0
    assert refused in result.stderr


def test_production_starts_with_its_secrets_set():
    result = manage("check", ALERT_WEBHOOK_URL="https://alerts.example/hook", ALERT_WEBHOOK_SECRET="s" * 40)
    assert result.returncode == 0, result.stderr


def test_production_refuses_to_start_with_an_action_type_no_connector_serves():
    result = manage("check", CONNECTOR_SEND_MESSAGE="")
    assert result.returncode != 0
    assert "surety.E001" in result.stderr and "'send_message'" in result.stderr
    assert "'refund'" not in result.stderr


def test_production_refuses_to_start_with_a_connector_class_that_does_not_exist():
    result = manage("check", CONNECTOR_REFUND="payments.nowhere.Connector")
    assert result.returncode != 0
    assert "surety.E002" in result.stderr and "'refund'" in result.stderr


@pytest.mark.parametrize(("lease", "says"), [("6", "surety.E004"), ("7", "surety.E004"), ("12", "surety.W004")])
def test_a_lease_too_short_for_a_call_or_a_look_and_a_call_is_said_at_start(lease, says):
    """5 s of timeout and 2 of margin: 7 s of lease or less lets no call start (a claim's lease left
    is always a little under it: refused); 12 s or less lets a call start, but not after the look
    a failure tried again makes first (warned)."""
    result = manage("check", LEASE_SECONDS=lease, CONNECTOR_TIMEOUT="5", LEASE_MARGIN_SECONDS="2")
    assert says in result.stderr, result.stderr
    assert (result.returncode != 0) == says.startswith("surety.E")


def test_production_never_hashes_passwords_with_the_tests_fast_hasher():
    """tests/settings.py swaps in MD5 for speed: production neither has it nor loads that module."""
    hashers = manage("shell", "-c", "from django.conf import settings; print(settings.PASSWORD_HASHERS)")
    assert hashers.returncode == 0, hashers.stderr
    assert "PasswordHasher" in hashers.stdout and "MD5" not in hashers.stdout
    refused = manage("check", DJANGO_SETTINGS_MODULE="tests.settings")
    assert refused.returncode != 0
    assert "tests.settings is for the test suite" in refused.stderr


def test_production_answers_the_health_checks_by_any_host_over_plain_http_and_nothing_else():
    """A load balancer asks over plain HTTP inside the network, by the server's own address, which
    ALLOWED_HOSTS does not name: both health checks answer it (their status, whatever it is), where
    every other address is sent to HTTPS, or refused for its Host."""
    script = ("import json; from django.test import Client; c = Client(); print(json.dumps("
              "[c.get(p, HTTP_HOST=h).status_code for h in ('surety.example', '10.0.3.7:8000') "
              "for p in ('/healthz', '/healthz/web', '/')]))")
    result = manage("shell", "-c", script)
    assert result.returncode == 0, result.stderr
    statuses = json.loads(result.stdout.strip().splitlines()[-1])
    named, by_address = statuses[:3], statuses[3:]
    assert named[0] not in (301, 400) and named[1] not in (301, 400) and named[2] == 301
    assert by_address[0] not in (301, 400) and by_address[1] not in (301, 400) and by_address[2] == 400
