"""`SECRET_KEY`, `DEBUG`, `ALLOWED_HOSTS`: development values only when `DEBUG` is on (docs/contract.md).

The development key is in the repository: with DEBUG off, PRODUCTION set or not, config.settings
refuses to load without a SECRET_KEY of the deployment's own, and allows no host it was not given.
Each case reads the settings in a process of its own, from an environment built from nothing (the
suite's own key and hosts, which tests/settings.py puts in the environment, left out)."""

import json
import os
import subprocess
import sys

import pytest

from config import settings as product_settings
from tests.conftest import ROOT

READ = ("import json; from django.conf import settings; "
        "print(json.dumps([settings.SECRET_KEY, settings.ALLOWED_HOSTS, settings.DEBUG]))")


def read_settings(**env):
    """config.settings' SECRET_KEY, ALLOWED_HOSTS and DEBUG under `env` alone (and PATH), or the
    finished process when it refused to load."""
    done = subprocess.run(
        [sys.executable, "-c", READ], cwd=ROOT, capture_output=True, text=True, timeout=60,
        # No Redis probed (RQ_ASYNC) and no database file: only the settings are read.
        env={"PATH": os.environ["PATH"], "DJANGO_SETTINGS_MODULE": "config.settings",
             "DATABASE_URL": "sqlite:///:memory:", "RQ_ASYNC": "false", **env})
    return json.loads(done.stdout) if done.returncode == 0 else done


@pytest.mark.parametrize("debug", [{}, {"DEBUG": "false"}, {"DEBUG": "0"}])
def test_with_debug_off_and_no_secret_key_the_settings_refuse_to_load(debug):
    """PRODUCTION unset: the deployment that forgot it must not sign sessions, evidence records and
    audit checkpoints with the repository's key."""
    refused = read_settings(**debug)
    assert not isinstance(refused, list), f"loaded with {refused}"
    assert refused.returncode != 0
    assert "SECRET_KEY must be set when DEBUG is off" in refused.stderr
    assert "DEBUG=true for local development only" in refused.stderr  # what to set, said
    assert product_settings._DEV_SECRET not in refused.stdout + refused.stderr


def test_an_empty_secret_key_is_no_key():
    refused = read_settings(SECRET_KEY="")
    assert not isinstance(refused, list) and "SECRET_KEY must be set" in refused.stderr


def test_with_debug_on_the_development_values_are_used():
    key, hosts, debug = read_settings(DEBUG="true")
    assert (key, debug) == (product_settings._DEV_SECRET, True)
    assert hosts == ["localhost", "127.0.0.1", "[::1]", "testserver"]


def test_with_debug_on_what_is_set_wins():
    key, hosts, _ = read_settings(DEBUG="true", SECRET_KEY="d" * 60, ALLOWED_HOSTS="surety.test")
    assert (key, hosts) == ("d" * 60, ["surety.test"])


def test_with_debug_off_the_key_given_is_used_and_no_host_is_allowed_unless_named():
    """Django answers 400 to a request for a host ALLOWED_HOSTS does not name, logging the host to
    add: the settings load (the workers and the sweeper serve no host), the web app serves none."""
    key, hosts, debug = read_settings(SECRET_KEY="s" * 60)
    assert (key, hosts, debug) == ("s" * 60, [], False)
    assert read_settings(SECRET_KEY="s" * 60, ALLOWED_HOSTS="surety.example, 10.0.0.5")[1] == [
        "surety.example", "10.0.0.5"]


def test_production_with_debug_off_refuses_without_a_key_as_before():
    refused = read_settings(PRODUCTION="true", DEBUG="false")
    assert not isinstance(refused, list) and "SECRET_KEY must be set" in refused.stderr
