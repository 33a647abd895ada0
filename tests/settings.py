"""The settings the tests run with: the product's own, with a fast password hasher.

pytest names this module (pyproject.toml) and puts it in the environment, so the gunicorn
server and the RQ workers the tests start run with it too: a password set in a test must be
checked by the same hasher in the server. Nothing else names it, so a deployment keeps
Django's slow-on-purpose hashers; with PRODUCTION set it refuses to load at all.
"""

import os

# The suite runs with DEBUG off, as production does, and config.settings then gives no development
# values (docs/configuration.md): a key and hosts of the tests' own, set in the environment before the
# settings read it, so that every process a test starts with a copy of it (gunicorn, the RQ workers,
# manage.py, under tests.settings or config.settings) runs with the same. A test that builds a
# process's environment from nothing passes them on itself.
os.environ.setdefault("SECRET_KEY", "tests-only-secret-key-never-used-outside-the-test-suite-5f1c0b7e")
os.environ.setdefault("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")

from config.settings import *  # noqa: E402, F403

if PRODUCTION:  # noqa: F405
    raise RuntimeError("tests.settings is for the test suite; production runs config.settings")

# PBKDF2 takes most of a second per password by design; every test that makes a person pays it.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Tests that plant a second effect at the sandbox on purpose must not find an incident opened
# for it by a sweeper pass; the reconciliation tests switch the schedule on themselves.
RECONCILE_INTERVAL_SECONDS = 0

# The second factor and step-up are off unless a test asks for them (override_settings, or the
# live server's environment): the rest of the suite signs in with a password alone.
MFA_REQUIRED = env_bool("MFA_REQUIRED", False)  # noqa: F405
STEP_UP_SECONDS = env_float("STEP_UP_SECONDS", 0)  # noqa: F405
ACCOUNT_REAUTHENTICATION_TIMEOUT = STEP_UP_SECONDS or 300
# Chromium's virtual authenticator serves http://localhost: a browser allows WebAuthn there.
MFA_WEBAUTHN_ALLOW_INSECURE_ORIGIN = True
